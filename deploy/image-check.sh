#!/usr/bin/env bash
# What the Dockerfile promises, checked without a container engine (`make image-check`):
#   1. the build stage's binary (`cargo build --release --locked`, glibc) needs no shared library
#      beyond glibc and libgcc, the whole of what distroless/cc adds to distroless/static;
#   2. the final stage's conditions: that binary, in an otherwise empty root directory holding
#      only those libraries (no /etc, no shell, like distroless/cc), as user 65532 with nothing
#      writable, serves a node status review over TLS with the expected patch and exits 0 on
#      SIGTERM.
# It cannot check the base images or the image's layers: building those needs an engine and the
# image registries. This machine is Debian 12 like both stages, so its glibc is theirs (2.36).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/image-check.XXXXXX")"
server=
cleanup() {
	[[ -n "$server" ]] && kill -KILL "$server" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
say() { echo "image-check: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

if [[ $(id -u) != 0 ]]; then
	fail "needs root (chroot and the switch to user 65532)"
fi

# The build stage's binary: the release build (`make test` has made it already; a no-op then)
# with its debug info stripped. The Dockerfile strips it with CARGO_PROFILE_RELEASE_STRIP=
# debuginfo, which acts at link time only (the linker's --strip-debug): the same compilation as
# target/release, so binutils' `strip --strip-debug` of that binary gives the same code and the
# same shared-library needs, without building the whole dependency graph a second time for
# another profile (13.5 minutes of one cold `make test`, with other work beside it). Without binutils: that second build, in its own
# target directory (the stripped profile would otherwise rebuild target/release).
target_dir="${CARGO_TARGET_DIR:-$root/target}"
(cd "$root" && cargo build --release --locked --bin kube-overcommit)
bin="$work/kube-overcommit"
if command -v strip >/dev/null; then
	say "the release binary with its debug info stripped (as the Dockerfile's build stage)"
	strip --strip-debug -o "$bin" "$target_dir/release/kube-overcommit"
else
	say "no strip (binutils): building the stripped profile into $target_dir/image-check"
	(cd "$root" && CARGO_TARGET_DIR="$target_dir/image-check" CARGO_PROFILE_RELEASE_STRIP=debuginfo \
		cargo build --release --locked --bin kube-overcommit)
	cp "$target_dir/image-check/release/kube-overcommit" "$bin"
fi
# The Dockerfile's own check (`tee -a`: when stderr is a log file, as in CI, plain tee would
# truncate it and lose everything make test printed before).
ldd "$bin" | tee -a /dev/stderr \
	| awk '$1 !~ /^(linux-vdso|libc|libm|libgcc_s|libpthread|libdl|librt)\.so\.|^\/lib64\/ld-linux/ {bad=1} END {exit bad}' \
	|| fail "the binary needs a library that distroless/cc does not have"

# The final stage: only the binary (mode 0555, root-owned), the mounted Secret and the policy.
rootfs="$work/rootfs"
install -D -m 0555 "$bin" "$rootfs/usr/local/bin/kube-overcommit"
# The base image's part: the dynamic loader and the libraries the binary was linked against.
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
	install -D -m 0555 "$(readlink -f "$lib")" "$rootfs$lib"  # the loader must be executable
done
mkdir -p "$rootfs/tls" "$rootfs/policy"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=image-check-ca \
	-keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
	-keyout "$rootfs/tls/tls.key" -out "$work/leaf.csr" 2>/dev/null
openssl x509 -req -in "$work/leaf.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial -days 1 \
	-extfile <(printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n') -out "$rootfs/tls/tls.crt" 2>/dev/null
cp "$root/bench/policy.yaml" "$rootfs/policy/policy.yaml"
chmod 0444 "$rootfs/tls/"* "$rootfs/policy/"*
chmod -R a-w "$rootfs"
[[ -z "$(find "$rootfs" -mindepth 1 -perm /022)" ]] || fail "something in the root directory is writable"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
listen="127.0.0.1:$(port)"
probes="127.0.0.1:$(port)"
say "serving from an empty root as 65532:65532 on $listen"
env -i "$(command -v chroot)" --userspec=65532:65532 "$rootfs" /usr/local/bin/kube-overcommit serve \
	--listen "$listen" --probe-listen "$probes" --tls-dir /tls --policy-file /policy/policy.yaml \
	>"$work/serve.log" 2>&1 &
server=$!

deadline=$((SECONDS + 30))
until curl -fs -o /dev/null "http://$probes/readyz"; do
	kill -0 "$server" 2>/dev/null || { cat "$work/serve.log" >&2; fail "the server exited"; }
	((SECONDS < deadline)) || { cat "$work/serve.log" >&2; fail "not ready within 30 s"; }
	sleep 0.2
done
# env and chroot exec, so $server is the server process itself.
uid="$(awk '/^Uid:/ {print $2}' "/proc/$server/status")"
[[ "$uid" == 65532 ]] || fail "the server runs as uid $uid, not 65532"

answer="$(curl -fsS --cacert "$work/ca.crt" -H 'Content-Type: application/json' \
	--data-binary @"$root/tests/fixtures/node-status-update.json" "https://$listen/mutate")"
python3 - "$answer" <<'EOF' || fail "unexpected answer: $answer"
import base64, json, sys
response = json.loads(sys.argv[1])["response"]
assert response["allowed"] is True, response
ops = json.loads(base64.b64decode(response["patch"]))
paths = {op["path"] for op in ops}
assert any(p.startswith("/status/allocatable") for p in paths), paths
EOF
say "the review was answered with an allocatable patch"

kill -TERM "$server"
deadline=$((SECONDS + 60))
while kill -0 "$server" 2>/dev/null; do
	((SECONDS < deadline)) || fail "no exit within 60 s of SIGTERM"
	sleep 0.2
done
wait "$server" && rc=0 || rc=$?
server=
((rc == 0)) || { cat "$work/serve.log" >&2; fail "exit status $rc after SIGTERM"; }
say "OK: glibc and libgcc only; a root with just those, user 65532, nothing writable: served a review and exited 0 on SIGTERM"
