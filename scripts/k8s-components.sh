#!/usr/bin/env bash
# Builds the real Kubernetes control plane the cluster tests run against
# (issue 29): kube-apiserver, kube-scheduler and kube-controller-manager from
# k8s.io/kubernetes, and etcd from go.etcd.io/etcd/server/v3, all at the
# versions pinned in tools/k8s/go.mod, fetched through the Go module proxy.
# Debian's etcd-server is 3.4, older than the 3.5+ the apiserver needs, so
# etcd is built here too. See docs/cluster.md for what this costs.
#
# Output: $GATEKEEPER_KUBE_BIN, else build/k8s/ (git-ignored). A stamp there
# records the versions; a second run with the same ones does nothing.
# Every build runs under `nice -n 19` (the machine is shared).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tools/k8s"
out="${GATEKEEPER_KUBE_BIN:-$root/build/k8s}"
go_bin="${GO:-/usr/local/go/bin/go}"
binaries=(etcd kube-apiserver kube-scheduler kube-controller-manager)

module_version() { awk -v m="$1" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod"; }
kube_version=$(module_version k8s.io/kubernetes)
etcd_version=$(module_version go.etcd.io/etcd/server/v3)
# The stamp changes with the versions, the pinned modules and this script.
sums=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -c1-16)
want="kubernetes=$kube_version etcd=$etcd_version $("$go_bin" env GOVERSION) inputs=$sums"

stamp="$out/.versions"
cached=1
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || cached=0; done
if [ "$cached" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "k8s components cached in $out ($want)"
  exit 0
fi

mkdir -p "$out"
rm -f "$stamp"
minor=${kube_version#v1.}
minor=${minor%%.*}
cd "$mod"
# The release's own time as the build date, so that a rebuild gives the same bytes.
build_date=$("$go_bin" list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
kube_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$kube_version \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=$build_date"

export CGO_ENABLED=0
start=$SECONDS
nice -n 19 "$go_bin" mod download
echo "modules downloaded in $((SECONDS - start)) s"

start=$SECONDS
nice -n 19 "$go_bin" build -trimpath -ldflags "$kube_ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager
echo "kube-apiserver, kube-scheduler, kube-controller-manager $kube_version built in $((SECONDS - start)) s"

start=$SECONDS
nice -n 19 "$go_bin" build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
echo "etcd $etcd_version built in $((SECONDS - start)) s"

"$out/kube-apiserver" --version
# Not `| head -1`: under pipefail, etcd's later lines written after head has gone end it
# with SIGPIPE, and the script (so make test) fails with 141 now and then.
etcd_says=$("$out/etcd" --version)
echo "${etcd_says%%$'\n'*}"
echo "$want" > "$stamp"
