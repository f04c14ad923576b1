# syntax=docker/dockerfile:1.7
# kube-overcommit image: the glibc release build on distroless/cc (glibc and libgcc only: no
# shell, no package manager), running as the non-root user 65532.
#   docker build -t ghcr.io/kube-overcommit/kube-overcommit:0.1.0 .
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 (each stage runs natively or
# under emulation).
#
# Why glibc and not a static musl binary: musl's allocator returns memory to the kernel on almost
# every free, so the review path (a 55 KB body, TLS record and HTTP buffers per request) paid
# ~4 mmap/munmap pairs and their page faults per request, and ~3x the CPU of this build (measured
# with the benchmark's method; bench/proposals/admission-parse.md). This is the build that
# BENCHMARKS.md measures. Both stages are Debian 12 (glibc 2.36), so the binary runs on the base.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin kube-overcommit \
 && cp target/release/kube-overcommit /kube-overcommit
# The final stage has glibc and libgcc only: fail the build if the binary needs anything else.
RUN ldd /kube-overcommit | tee /dev/stderr \
  | awk '$1 !~ /^(linux-vdso|libc|libm|libgcc_s|libpthread|libdl|librt)\.so\.|^\/lib64\/ld-linux/ {bad=1} END {exit bad}' \
 && /kube-overcommit --help >/dev/null

FROM gcr.io/distroless/cc-debian12:nonroot
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
