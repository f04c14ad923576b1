#!/usr/bin/env bash
# Installs the test tools kube-overcommit needs that are not part of the machine, from the Go
# module proxy or crates.io (no other downloads), into a cache outside the clone, and prints the
# tool's path.
#   tests/tools.sh helm            -> path of a helm v3 binary
#   tests/tools.sh controller-gen  -> path of controller-gen (CRDs of the Prometheus Operator's
#                                     Go types, for the deploy tests' ServiceMonitor/PrometheusRule)
#   tests/tools.sh cargo-deny      -> path of cargo-deny (`make deny`); waits for a build that
#                                     --start began, and fails with its log if that build failed
#   tests/tools.sh valgrind        -> path of valgrind (bench-smoke's instruction-count guard), from
#                                     the machine's Debian packages (apt-get) when it is missing
#   tests/tools.sh cargo-deny --start
#                                  -> starts building cargo-deny in the background at the lowest
#                                     CPU priority and returns at once (`make test` overlaps the
#                                     ~3.5 min build with the e2e phase, which mostly waits)
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/kube-overcommit/tools/<tool>-<version>/ (kept across
# clones; a version bump installs beside the old one).
set -euo pipefail

HELM_VERSION=v3.19.5
# Kubernetes minor that this helm release's client-go matches: `helm template` reports it as the
# cluster version (helm's own Makefile sets these through -ldflags; `go install` alone leaves 1.20).
HELM_K8S_MAJOR=1
HELM_K8S_MINOR=34

cache="${XDG_CACHE_HOME:-$HOME/.cache}/kube-overcommit/tools"

install_helm() {
  local dir="$cache/helm-$HELM_VERSION"
  if [[ ! -x "$dir/helm" ]]; then
    command -v go >/dev/null || { echo "tests/tools.sh: go is required to install helm" >&2; exit 1; }
    mkdir -p "$dir"
    echo "tests/tools.sh: installing helm $HELM_VERSION into $dir (first time, a few minutes)" >&2
    local ld="-s -w"
    ld+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$HELM_K8S_MAJOR"
    ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM_K8S_MINOR"
    ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$HELM_K8S_MAJOR"
    ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM_K8S_MINOR"
    # Build in a temporary GOBIN and move into place, so an interrupted build leaves no half binary.
    local tmp
    tmp="$(mktemp -d "$cache/.helm-build.XXXXXX")"
    trap 'rm -rf "$tmp"' RETURN
    GOBIN="$tmp" GOFLAGS=-mod=mod go install -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
    mv "$tmp/helm" "$dir/helm"
  fi
  echo "$dir/helm"
}

CONTROLLER_GEN_VERSION=v0.19.0

install_controller_gen() {
  local dir="$cache/controller-gen-$CONTROLLER_GEN_VERSION"
  if [[ ! -x "$dir/controller-gen" ]]; then
    command -v go >/dev/null || { echo "tests/tools.sh: go is required to install controller-gen" >&2; exit 1; }
    mkdir -p "$dir"
    echo "tests/tools.sh: installing controller-gen $CONTROLLER_GEN_VERSION into $dir (first time, about a minute)" >&2
    local tmp
    tmp="$(mktemp -d "$cache/.controller-gen-build.XXXXXX")"
    trap 'rm -rf "$tmp"' RETURN
    GOBIN="$tmp" GOFLAGS=-mod=mod go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION" >&2
    mv "$tmp/controller-gen" "$dir/controller-gen"
  fi
  echo "$dir/controller-gen"
}

# valgrind is a system package (it is built against the C library and kernel headers of the
# machine): installed with apt-get, never from a download of our own.
install_valgrind() {
  if ! command -v valgrind >/dev/null; then
    command -v apt-get >/dev/null || { echo "tests/tools.sh: valgrind is missing and there is no apt-get to install it" >&2; exit 1; }
    local sudo=()
    [[ "$(id -u)" == 0 ]] || sudo=(sudo)
    echo "tests/tools.sh: installing valgrind with apt-get (first time, about a minute)" >&2
    "${sudo[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq valgrind >&2
  fi
  command -v valgrind
}

CARGO_DENY_VERSION=0.20.2

# cargo-deny is built from source (cargo install --locked: its own Cargo.lock), in its own target
# directory (never the repository's: a build there would hold the lock that the tests' cargo
# commands wait on). Builds are serialized by a lock; a background build (--start) leaves its
# exit status and log beside the binary's directory for the foreground call to report.
cargo_deny_dir="$cache/cargo-deny-$CARGO_DENY_VERSION"
cargo_deny_log="$cache/cargo-deny-$CARGO_DENY_VERSION.log"
cargo_deny_status="$cache/cargo-deny-$CARGO_DENY_VERSION.status"

build_cargo_deny() {
  command -v cargo >/dev/null || { echo "tests/tools.sh: cargo is required to install cargo-deny" >&2; return 1; }
  local tmp
  tmp="$(mktemp -d "$cache/.cargo-deny-build.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  cargo install --locked "cargo-deny@$CARGO_DENY_VERSION" --root "$tmp/root" --target-dir "$tmp/target" >&2 || return
  mkdir -p "$cargo_deny_dir"
  mv "$tmp/root/bin/cargo-deny" "$cargo_deny_dir/cargo-deny"
}

# Background half of --start: holds the lock for the whole build, records the exit status.
cargo_deny_background() {
  exec 9>"$cache/.cargo-deny.lock"
  flock 9
  if [[ -x "$cargo_deny_dir/cargo-deny" ]]; then
    return 0
  fi
  local rc=0
  build_cargo_deny >"$cargo_deny_log" 2>&1 || rc=$?
  echo "$rc" >"$cargo_deny_status"
}

start_cargo_deny() {
  [[ -x "$cargo_deny_dir/cargo-deny" ]] && return 0
  rm -f "$cargo_deny_status"
  echo "tests/tools.sh: building cargo-deny $CARGO_DENY_VERSION in the background (nice 19; log: $cargo_deny_log)" >&2
  # Detached from the caller's terminal and output (make would otherwise wait for it); it ends by
  # itself when the build ends.
  setsid nice -n 19 "${BASH_SOURCE[0]}" cargo-deny --background </dev/null >/dev/null 2>&1 &
}

install_cargo_deny() {
  exec 9>"$cache/.cargo-deny.lock"
  if ! flock -n 9; then
    echo "tests/tools.sh: waiting for the cargo-deny build already running (log: $cargo_deny_log)" >&2
    flock -w 1800 9 || { echo "tests/tools.sh: cargo-deny build still running after 30 min" >&2; exit 1; }
  fi
  if [[ -x "$cargo_deny_dir/cargo-deny" ]]; then
    rm -f "$cargo_deny_status"
  else
    if [[ -f "$cargo_deny_status" ]]; then
      local rc
      rc="$(cat "$cargo_deny_status")"
      rm -f "$cargo_deny_status"
      echo "tests/tools.sh: FAILED: installing cargo-deny $CARGO_DENY_VERSION in the background exited with status $rc; last lines of $cargo_deny_log:" >&2
      tail -n 30 "$cargo_deny_log" >&2 || true
      exit 1
    fi
    echo "tests/tools.sh: installing cargo-deny $CARGO_DENY_VERSION into $cargo_deny_dir (first time, about 3-4 minutes on 2 cores)" >&2
    build_cargo_deny || { echo "tests/tools.sh: FAILED: installing cargo-deny $CARGO_DENY_VERSION" >&2; exit 1; }
  fi
  echo "$cargo_deny_dir/cargo-deny"
}

case "${1:-}" in
  helm) install_helm ;;
  controller-gen) install_controller_gen ;;
  valgrind) install_valgrind ;;
  cargo-deny)
    mkdir -p "$cache"
    case "${2:-}" in
      "") install_cargo_deny ;;
      --start) start_cargo_deny ;;
      --background) cargo_deny_background ;;
      *) echo "usage: tests/tools.sh cargo-deny [--start]" >&2; exit 2 ;;
    esac
    ;;
  *) echo "usage: tests/tools.sh helm|controller-gen|valgrind|cargo-deny [--start]" >&2; exit 2 ;;
esac
