#!/usr/bin/env bash
# What bench/proxy.py compares gatekeeper with, installed when missing (benches only; CI
# does not run benches, so .ci/run does not call this):
#   nginx (Debian's package), as a plain reverse proxy in front of the same worker;
#   vllm-router (PyPI, vLLM's Rust router, pinned) in its own venv, build/venv-router/
#   (ignored by git), so that its dependencies (fastapi, orjson ...) stay out of .venv;
#   aiohttp in .venv, for bench/upstream_clients.py (httpx is already a dependency).
# The bench finds them on its own (nginx on PATH, build/venv-router/bin/vllm-router) and
# measures without any that is missing, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUTER_VERSION=0.1.17
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx
  else
    echo "bench-deps: nginx is missing (apt-get install nginx as root); the bench skips it" >&2
  fi
fi
if [ ! -x build/venv-router/bin/vllm-router ]; then
  .venv/bin/python -m venv build/venv-router
  build/venv-router/bin/pip install -q "vllm-router==${ROUTER_VERSION}"
fi
if ! .venv/bin/python -c "import aiohttp" 2>/dev/null; then
  .venv/bin/pip install -q aiohttp
fi
