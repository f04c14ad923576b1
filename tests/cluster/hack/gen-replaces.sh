#!/usr/bin/env bash
# Prints the replace block that pins every k8s.io staging module to the v0.x release matching
# the chosen k8s.io/kubernetes version. k8s.io/kubernetes requires its staging modules at v0.0.0
# and replaces them with ./staging/... paths, which do not exist for a module consumer.
# Usage: hack/gen-replaces.sh v1.36.3 > replaces.txt  (then paste into go.mod)
set -euo pipefail
version="${1:?usage: gen-replaces.sh vMAJOR.MINOR.PATCH}"
staging_version="v0.${version#v1.}"
modfile="$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[[ -f "$modfile" ]] || { echo "cannot find go.mod of k8s.io/kubernetes@${version}" >&2; exit 1; }
echo "replace ("
sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$modfile" | sort -u | while read -r mod; do
	printf '\t%s => %s %s\n' "$mod" "$mod" "$staging_version"
done
echo ")"
