# syntax=docker/dockerfile:1.7
# kube-overcommit image: a static musl binary on distroless/static (no shell, no package manager),
# running as the non-root user 65532.
#   docker build -t ghcr.io/kube-overcommit/kube-overcommit:0.1.0 .
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 (each stage runs natively or
# under emulation; the Alpine toolchain's own target is musl, so no cross target is configured).

ARG RUST_VERSION=1.95
ARG ALPINE_VERSION=3.22

FROM rust:${RUST_VERSION}-alpine${ALPINE_VERSION} AS build
# musl-dev: C runtime headers for ring's C/assembly parts. file: the static check below.
RUN apk add --no-cache musl-dev file
WORKDIR /src
COPY . .
# Rust's musl targets link statically by default (crt-static); the check below fails the build if
# that ever changes.
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin kube-overcommit \
 && cp target/release/kube-overcommit /kube-overcommit
RUN file /kube-overcommit | tee /dev/stderr | grep -Eq 'statically linked|static-pie linked' \
 && /kube-overcommit --help >/dev/null

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="kube-overcommit" \
      org.opencontainers.image.description="Mutating admission webhook that overcommits node allocatable by policy" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /kube-overcommit /usr/local/bin/kube-overcommit
# Numeric, so that runAsNonRoot can verify it without an /etc/passwd lookup.
USER 65532:65532
# 8443: webhook (HTTPS). 8080: /healthz, /readyz, /metrics (plain HTTP).
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/kube-overcommit"]
CMD ["serve"]
