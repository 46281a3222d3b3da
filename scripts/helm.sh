#!/usr/bin/env bash
# Builds the helm command (Helm v4) the chart tests run (tests/cluster/test_helm_chart.py):
# helm.sh/helm/v4/cmd/helm at the version pinned in tools/helm/go.mod, fetched through the
# Go module proxy, as scripts/k8s-components.sh builds the control plane. No release binary
# is downloaded. See docs/cluster.md ("Install with Helm") for what this costs.
#
# Output: $GATEKEEPER_HELM_BIN, else build/helm/ (git-ignored), holding `helm`. A stamp there
# records the version and the inputs; a second run with the same ones does nothing.
# Every build runs under `nice -n 19` (the machine is shared).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tools/helm"
out="${GATEKEEPER_HELM_BIN:-$root/build/helm}"
go_bin="${GO:-/usr/local/go/bin/go}"

helm_version=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod")
# The stamp changes with the version, the pinned modules and this script.
sums=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -c1-16)
want="helm=$helm_version $("$go_bin" env GOVERSION) inputs=$sums"

stamp="$out/.versions"
if [ -x "$out/helm" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "helm cached in $out ($want)"
  exit 0
fi

mkdir -p "$out"
rm -f "$stamp"
cd "$mod"
export CGO_ENABLED=0
start=$SECONDS
nice -n 19 "$go_bin" mod download
echo "modules downloaded in $((SECONDS - start)) s"

# The release's version and no commit, as helm's Makefile sets them for a tagged build.
ldflags="-s -w \
 -X helm.sh/helm/v4/internal/version.version=$helm_version \
 -X helm.sh/helm/v4/internal/version.metadata= \
 -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
start=$SECONDS
nice -n 19 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$out/helm" helm.sh/helm/v4/cmd/helm
echo "helm $helm_version built in $((SECONDS - start)) s"

"$out/helm" version --short
echo "$want" > "$stamp"
