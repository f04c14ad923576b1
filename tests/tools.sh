#!/usr/bin/env bash
# Installs the test tools kube-overcommit needs that are not part of the machine, from the Go
# module proxy (no other downloads), into a cache outside the clone, and prints the tool's path.
#   tests/tools.sh helm            -> path of a helm v3 binary
#   tests/tools.sh controller-gen  -> path of controller-gen (CRDs of the Prometheus Operator's
#                                     Go types, for the deploy tests' ServiceMonitor/PrometheusRule)
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

case "${1:-}" in
  helm) install_helm ;;
  controller-gen) install_controller_gen ;;
  *) echo "usage: tests/tools.sh helm|controller-gen" >&2; exit 2 ;;
esac
