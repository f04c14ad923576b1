#!/usr/bin/env bash
# make demo: builds everything (progress shown), then runs the demo driver (cmd/demo).
#   tests/cluster/demo.sh [--keep] [demo run flags]   the demo (DEMO_KEEP=1 = --keep)
#   tests/cluster/demo.sh down                         stop the replicas a kept demo left
#                                                       running (make cluster-down runs it)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
run_dir="${KCP_RUN_DIR:-$here/.run}"

down() {
	local pidfile="$run_dir/demo-keeper.pid" pid
	[[ -f "$pidfile" ]] || return 0
	pid="$(cat "$pidfile")"
	# Only our keeper: a stale pid file may name a recycled pid.
	if [[ -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q " keep --run-dir=$run_dir"; then
		echo "demo: stopping the kept replicas (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		# Bounded: the keeper stops its replicas within their shutdown grace.
		local deadline=$((SECONDS + 60))
		while kill -0 "$pid" 2>/dev/null; do
			if ((SECONDS > deadline)); then
				echo "demo: keeper $pid did not stop within 60s; killing it (its replicas die with it)" >&2
				kill -KILL "$pid" 2>/dev/null || true
				break
			fi
			sleep 0.2
		done
	fi
	rm -f "$pidfile"
}

if [[ "${1:-}" == "down" ]]; then
	down
	exit 0
fi

step() { printf '\n==> [%s] %s\n' "$1" "$2"; }
start=$SECONDS

step "build 1/3" "kube-overcommit: cargo build --release --locked (first time: several minutes)"
(cd "$repo" && cargo build --release --locked)

step "build 2/3" "the local control plane (kcp: etcd, kube-apiserver, scheduler, controller-manager, kubectl; cached in ~/.cache/kube-overcommit, cold build ~15 min)"
"$here/kcp.sh" build >/dev/null

step "build 3/3" "the demo driver: go build ./cmd/demo"
demo_bin="$repo/target/demo/kube-overcommit-demo"
mkdir -p "$(dirname "$demo_bin")"
(cd "$here" && GOFLAGS="-p=2 ${GOFLAGS:-}" go build -o "$demo_bin" ./cmd/demo)
echo "    built in $((SECONDS - start))s"

KUBE_OVERCOMMIT_BIN="${KUBE_OVERCOMMIT_BIN:-$repo/target/release/kube-overcommit}" exec "$demo_bin" run "$@"
