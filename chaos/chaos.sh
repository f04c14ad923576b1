#!/usr/bin/env bash
# Fault runs against kube-overcommit with invariant checks (see chaos/README.md).
#   chaos/chaos.sh local   [flags]   local control plane of tests/cluster, replicas as processes
#   chaos/chaos.sh cluster [flags]   a real cluster through kubectl (destructive: --kubeconfig,
#                                    --context and --i-understand-this-deletes-pods required)
# The Go command lives in tests/cluster/chaos (it uses the tests/cluster harness); it is
# built here on each run (Go's build cache makes a rebuild take seconds).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/../tests/cluster"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kube-overcommit"
mkdir -p "$cache"
bin="$cache/chaos-$$"
trap 'rm -f "$bin"' EXIT
echo "chaos: building tests/cluster/chaos" >&2
(cd "$module" && GOFLAGS="-p=2 -buildvcs=false ${GOFLAGS:-}" go build -o "$bin" ./chaos)
"$bin" "$@"
