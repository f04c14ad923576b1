#!/usr/bin/env bash
# Builds cert-manager's controller and cainjector (this module's main, from the
# github.com/cert-manager/cert-manager Go module) if needed, for the e2e tests of
# --cert-source=cert-manager (tests/cluster/e2e/certmanager_test.go).
#
# Cached outside the clone like kcp (tests/cluster/kcp.sh): ${XDG_CACHE_HOME:-$HOME/.cache}/kube-overcommit/
# cert-manager-<hash>, the hash of go.mod, go.sum, main.go and the Go version; the CRDs of the same
# cert-manager version are copied beside it as cert-manager-<hash>.crds.yaml.
#   build.sh build   build if needed, print the binary's path
#   build.sh path    print the path the binary has (or would have)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kube-overcommit"

hash_inputs() {
	cd "$here"
	go env GOVERSION GOOS GOARCH
	sha256sum go.mod go.sum main.go
}
hash="$(hash_inputs | sha256sum | cut -c1-16)"
bin="$cache/cert-manager-$hash"

build() {
	mkdir -p "$cache"
	exec 9>"$cache/cert-manager-build.lock"
	if ! flock -n 9; then
		echo "cert-manager: another build is running; waiting for it" >&2
		flock 9
	fi
	if [[ -x "$bin" && -s "$bin.crds.yaml" ]]; then
		return
	fi
	echo "cert-manager: building $bin (cold: ~10 min on 2 cores; warm: under a minute)" >&2
	local start=$SECONDS tmp="$bin.tmp.$$"
	# -p=2: the machine has 2 cores shared with other builds; -s -w: smaller binary, faster link.
	(cd "$here" && GOFLAGS="-p=2 -buildvcs=false -mod=readonly ${GOFLAGS:-}" go build -ldflags="-s -w" -o "$tmp" .)
	local dir
	dir="$(cd "$here" && go list -mod=readonly -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)"
	local crds=("$dir"/deploy/crds/*.yaml)
	if [[ ! -s "${crds[0]}" ]]; then
		echo "cert-manager: no CRDs under $dir/deploy/crds" >&2
		exit 1
	fi
	cat "${crds[@]}" >"$bin.crds.yaml.tmp.$$"
	mv -f "$bin.crds.yaml.tmp.$$" "$bin.crds.yaml"
	mv -f "$tmp" "$bin"
	# Binaries no clone has used for a week are stale.
	find "$cache" -maxdepth 1 -name 'cert-manager-*' ! -name "cert-manager-$hash*" -mtime +7 -delete 2>/dev/null || true
	echo "cert-manager: built in $((SECONDS - start))s: $bin" >&2
}

case "${1:-}" in
build)
	build
	touch "$bin" 2>/dev/null || true
	echo "$bin"
	;;
path) echo "$bin" ;;
*)
	echo "usage: $0 build|path" >&2
	exit 2
	;;
esac
