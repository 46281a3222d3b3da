#!/usr/bin/env bash
# Regenerates gatekeeper/cluster/kubelet_api/*_pb2.py{,i} from the kubelet's two .proto files
# kept beside them (k8s.io/kubelet v0.37.2: pkg/apis/dra/v1/api.proto and
# pkg/apis/pluginregistration/v1/api.proto, Apache-2.0, copied unchanged but for the name).
# Needs grpcio-tools 1.85.1 (protoc 35.1: the gencode asks for protobuf >= 7.35.1, < 8) in
# a throw-away environment: PYTHON=/tmp/gtools/bin/python bash scripts/kubelet-api.sh
# Run from the repository root so that the messages' module is the package's own.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
API=gatekeeper/cluster/kubelet_api
"$PYTHON" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
    "$API/dra_v1.proto" "$API/pluginregistration_v1.proto"
for name in dra_v1_pb2 pluginregistration_v1_pb2; do
    # __all__: the messages, as every gatekeeper module names what it defines.
    names=$(sed -n 's/^class \([A-Za-z0-9_]*\)(.*/"\1", /p' "$API/$name.pyi" | tr -d '\n')
    { echo "# ruff: noqa"; cat "$API/$name.py"; echo "__all__ = [$names]"; } >"$API/$name.tmp"
    mv "$API/$name.tmp" "$API/$name.py"
    { echo "# ruff: noqa"; echo '# mypy: disable-error-code="type-arg"'; cat "$API/$name.pyi"
      echo "__all__ = [$names]"; } >"$API/$name.tmp"
    mv "$API/$name.tmp" "$API/$name.pyi"
done
.venv/bin/ruff format -q "$API"/*_pb2.py "$API"/*_pb2.pyi
