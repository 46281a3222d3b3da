#!/usr/bin/env bash
# Regenerates gatekeeper/cluster/kubelet_api/*_pb2.py{,i} from the kubelet's two .proto files
# kept beside them (k8s.io/kubelet v0.37.2: pkg/apis/dra/v1/api.proto and
# pkg/apis/pluginregistration/v1/api.proto, Apache-2.0, copied unchanged but for the name).
# Needs grpcio-tools 1.85.1 (protoc 35.1: the gencode asks for protobuf >= 7.35.1, < 8) in
# a throw-away environment: PYTHON=/tmp/gtools/bin/python bash scripts/kubelet-api.sh
set -euo pipefail
cd "$(dirname "$0")/../gatekeeper/cluster/kubelet_api"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. dra_v1.proto pluginregistration_v1.proto
for f in dra_v1_pb2.py pluginregistration_v1_pb2.py; do
    { echo "# ruff: noqa"; cat "$f"; } >"$f.tmp" && mv "$f.tmp" "$f"
done
for f in dra_v1_pb2.pyi pluginregistration_v1_pb2.pyi; do
    { echo "# ruff: noqa"; echo '# mypy: disable-error-code="type-arg"'; cat "$f"; } >"$f.tmp" && mv "$f.tmp" "$f"
done
../../../.venv/bin/ruff format -q ./*_pb2.py ./*_pb2.pyi
