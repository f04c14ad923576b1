# syntax=docker/dockerfile:1.7@sha256:a57df69d0ea827fb7266491f2813635de6f17269be881f696fbfdf2d83dda33e
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

#
# Every base image (and the BuildKit frontend above) is pinned by digest: a rebuild fetches the
# bytes that were reviewed, not whatever the tag points to that day. The tag stays for the reader;
# with a digest present the tag is not consulted. Bump tag and digest together, from
# `docker buildx imagetools inspect <image>:<tag>` (the multi-arch index digest, not one
# platform's manifest). tests/deploy TestStaticDockerfile refuses a FROM without a digest.

FROM rust:1.95-slim-bookworm@sha256:d7482085ff5b415f84dba5647ae71606650bdef00db7aeb69f4b3d170c3e4082 AS build
WORKDIR /src
COPY . .
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo
# Cache mounts are shared by id across every build on the builder, and by default the id is the
# target path: any other Dockerfile mounting /usr/local/cargo/registry would share (and could
# poison) the extracted crate sources, which cargo does not re-verify against Cargo.lock once
# unpacked. So each cache has an id of this project's own, and sharing=locked keeps two builds
# from writing one at the same time. A release build should still start from an empty cache
# (`--no-cache`, or a fresh builder): the cache spares time, not trust (SECURITY.md).
RUN --mount=type=cache,id=kube-overcommit-cargo-registry,sharing=locked,target=/usr/local/cargo/registry \
    --mount=type=cache,id=kube-overcommit-cargo-git,sharing=locked,target=/usr/local/cargo/git \
    --mount=type=cache,id=kube-overcommit-target,sharing=locked,target=/src/target \
    cargo build --release --locked --bin kube-overcommit \
 && cp target/release/kube-overcommit /kube-overcommit
# The final stage has glibc and libgcc only: fail the build if the binary needs anything else.
RUN ldd /kube-overcommit | tee -a /dev/stderr \
  | awk '$1 !~ /^(linux-vdso|libc|libm|libgcc_s|libpthread|libdl|librt)\.so\.|^\/lib64\/ld-linux/ {bad=1} END {exit bad}' \
 && /kube-overcommit --help >/dev/null

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
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
