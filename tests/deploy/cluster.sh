#!/usr/bin/env bash
# Runs the install-manifest tests on a local control plane of its own (tests/cluster/kcp.sh),
# in a temporary run directory so that a cluster someone keeps running is left alone, and stops
# it afterwards whatever happens.
#   tests/deploy/cluster.sh [go test flags...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
kcp="$root/tests/cluster/kcp.sh"
# 5 fake nodes: 3 replicas (one per node), a spare for the first replacement, and one more so
# that the drained replicas all come back.
nodes="${DEPLOY_TEST_NODES:-5}"

"$kcp" build >/dev/null
run_dir="$(mktemp -d "${TMPDIR:-/tmp}/kube-overcommit-deploy-test.XXXXXX")"
export KCP_RUN_DIR="$run_dir"
cleanup() {
	local rc=$?
	if ! "$kcp" down; then
		echo "deploy tests: kcp down failed; run dir kept: $run_dir" >&2
		exit 1
	fi
	rm -rf "$run_dir"
	exit "$rc"
}
trap cleanup EXIT
echo "deploy tests: starting a control plane with $nodes fake nodes in $run_dir" >&2
# Stops by itself if this script dies (killed by a CI timeout) or after 30 minutes.
"$kcp" up --nodes "$nodes" --exit-with-pid $$ --max-lifetime 30m
cd "$root/tests/deploy"
KUBECONFIG="$run_dir/kubeconfig" go test -count=1 -timeout 15m -run Cluster -v "$@" ./...
