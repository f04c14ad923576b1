# kube-overcommit — every entry point an operator or CI uses.
# `make test` installs or builds everything it needs on a fresh machine of the project's kind.
SHELL := /bin/bash
.DEFAULT_GOAL := build

CARGO ?= cargo

.PHONY: build release test test-unit test-e2e deny test-e2e-leader test-e2e-leader-long test-e2e-usage-long test-e2e-pressure-long demo bench bench-smoke bench-flamegraph cluster-build cluster-up cluster-down cluster-status cluster-test chaos chaos-long crd fmt lint image-check

build:
	$(CARGO) build --locked

release:
	$(CARGO) build --locked --release

# The whole suite, as CI runs it on a fresh clone (.ci/run). Everything is built in the release
# profile once: the unit and TLS tests, the e2e tests and the replicas all use that build.
#   test-unit   Rust unit, fixture, CLI and binary-over-TLS tests
#   test-e2e    on the real control plane of tests/cluster (each suite starts its own and stops it):
#               CRD checks, issue 2-4 end-to-end tests (go test ./... in tests/cluster: control
#               plane, webhook inflation and scheduling, leader/rotation, local installation),
#               install manifests (deploy/, Helm), a short chaos run (local, and `chaos cluster`
#               against deploy/ installed as pods), the benchmark smoke check (its Go peer built
#               in the background from the start of test-e2e)
#   image-check the Dockerfile's binary in a root holding only what distroless/cc has
#   deny        licenses, banned crates and sources of the dependency tree (cargo-deny, built in
#               the background during test-e2e)
test: cluster-build-start test-unit test-e2e image-check deny
	@echo "make test: all suites passed"

# On a cold machine the control plane's Go build (kcp) is the longest step: `make test` starts it
# in the background at nice 10 before the unit tests, so it uses what the Rust build and the unit
# tests leave idle, and `cluster-build` waits for it (kcp.sh holds a lock; a failed background
# build is built again in the foreground, which shows the error). cert-manager's build follows it
# in the background; only its own test waits for it (cert-manager-build-start). Log:
# ~/.cache/kube-overcommit/.
.PHONY: cluster-build-start
cluster-build-start:
	@mkdir -p "$${XDG_CACHE_HOME:-$$HOME/.cache}/kube-overcommit"
	@log="$${XDG_CACHE_HOME:-$$HOME/.cache}/kube-overcommit/kcp-build.log"; \
	 if [[ ! -x "$$($(KCP) path)" || ! -x "$$($(CERT_MANAGER) path)" ]]; then \
	   echo "kcp, cert-manager: building in the background (nice 10; log: $$log)"; \
	   setsid nice -n 10 bash -c '$(KCP) build; $(CERT_MANAGER) build' </dev/null >"$$log" 2>&1 & \
	 fi

test-unit:
	$(CARGO) test --locked --release --workspace
	python3 -m unittest discover -s bench -p 'test_*.py'

test-e2e: release cluster-build
	tests/tools.sh cargo-deny --start
	python3 bench/bench.py prebuild-go --start
	$(CARGO) test --locked --release -- --ignored
	$(MAKE) cluster-test
	$(MAKE) test-deploy
	$(MAKE) chaos
	$(MAKE) chaos-cluster-local
	$(MAKE) bench-smoke

# Local control plane (tests/cluster): etcd, kube-apiserver, scheduler, controller-manager, fake nodes.
# The kcp binary is cached in ~/.cache/kube-overcommit (keyed by go.mod/go.sum/sources); see tests/cluster/README.md.
KCP := tests/cluster/kcp.sh
# cert-manager's controller and cainjector for the --cert-source=cert-manager e2e test, cached the
# same way (tests/cluster/certmanager: its own Go module).
CERT_MANAGER := tests/cluster/certmanager/build.sh
CLUSTER_NODES ?= 3
# A forgotten cluster stops by itself.
CLUSTER_LIFETIME ?= 12h
CLUSTER_TEST_TIMEOUT ?= 30m

cluster-build:
	$(KCP) build

# cert-manager is needed only by e2e.TestCertManagerSource, which waits for it (build.sh holds a
# lock) outside the shared control plane's turn: it builds in the background at nice 10 (cold:
# ~10 min) while the tests before it run, instead of holding up everything after kcp. A failed
# background build is built again by the test, which shows the error.
.PHONY: cert-manager-build-start
cert-manager-build-start:
	@mkdir -p "$${XDG_CACHE_HOME:-$$HOME/.cache}/kube-overcommit"
	@log="$${XDG_CACHE_HOME:-$$HOME/.cache}/kube-overcommit/cert-manager-build.log"; \
	 if [[ ! -x "$$($(CERT_MANAGER) path)" ]]; then \
	   echo "cert-manager: building in the background (nice 10; log: $$log)"; \
	   setsid nice -n 10 $(CERT_MANAGER) build </dev/null >>"$$log" 2>&1 & \
	 fi

cluster-up: cluster-build
	$(KCP) up --nodes $(CLUSTER_NODES) --max-lifetime $(CLUSTER_LIFETIME)

cluster-down:
	@tests/cluster/demo.sh down
	@if [[ -x "$$($(KCP) path)" ]]; then $(KCP) down; else echo "kcp not built: nothing can be running"; fi

cluster-status:
	$(KCP) status

# Tests of the control plane itself (each starts its own control plane in a temp dir).
# Packages run one at a time (-p 1): each starts its own control plane and replicas, and two at
# once on 2 cores would turn timing margins into flakes. Inside e2e the tests, which mostly wait,
# run in parallel (e2e/main_test.go): one at a time on the shared control plane, beside at most
# 3 (-parallel) with control planes of their own; `go test -parallel 1` runs them one at a time.
cluster-test: cluster-build release cert-manager-build-start
	cd tests/cluster && KUBE_OVERCOMMIT_BIN=$(CURDIR)/target/release/kube-overcommit go test -p 1 -count=1 -timeout $(CLUSTER_TEST_TIMEOUT) ./...

# Fault runs with invariant checks (chaos/README.md): `make chaos` is bounded (~3-4 min with
# start-up) and meant for `make test`; `make chaos-long` runs fault cycles for CHAOS_DURATION.
CHAOS_DURATION ?= 20m
CHAOS_ARGS ?=

chaos: release cluster-build
	chaos/chaos.sh local $(CHAOS_ARGS)

chaos-long: release cluster-build
	chaos/chaos.sh local --duration $(CHAOS_DURATION) --apiserver-signal alternate $(CHAOS_ARGS)

# `chaos cluster` (pod deletions through kubectl) end to end on this machine: deploy/ installed on
# the local control plane, whose kubelets (kcp pod-runner) run its pods as processes (~2.5 min).
CHAOS_CLUSTER_ARGS ?=
.PHONY: chaos-cluster-local
chaos-cluster-local: release cluster-build
	chaos/chaos.sh cluster-local $(CHAOS_CLUSTER_ARGS)

# Issue 4: leader election, certificate authority, rotation, webhook-configuration upkeep, on the
# local control plane with 3 replicas as processes. Short run (5 leaf + 1 CA rotations, failover
# in each CA rotation phase, repair of hand edits) and the long one (20 leaf + 3 CA rotations).
LEADER_E2E = cd tests/cluster && KUBE_OVERCOMMIT_BIN=$(CURDIR)/target/release/kube-overcommit GOFLAGS=-p=2

test-e2e-leader: release cluster-build
	$(LEADER_E2E) go test -count=1 -v -timeout 20m -run '^TestLeader' ./e2e/

# Issue 16: usage-aware allocatable with the real metrics-server, its noisy-usage phase run for
# 10 minutes (the suite's TestUsage runs it for 20 s).
test-e2e-usage-long: release cluster-build
	cd tests/cluster && KUBE_OVERCOMMIT_BIN=$(CURDIR)/target/release/kube-overcommit USAGE_E2E_NOISE=10m go test -count=1 -v -timeout 20m -run '^TestUsage$$' ./e2e/

# Issue 35: the pressure taint with its flapping phase (usage +-3% around the high watermark) run
# for 5 minutes (the suite's TestPressureTaint runs it for 40 s).
test-e2e-pressure-long: release cluster-build
	cd tests/cluster && KUBE_OVERCOMMIT_BIN=$(CURDIR)/target/release/kube-overcommit PRESSURE_E2E_NOISE=5m go test -count=1 -v -timeout 20m -run '^TestPressureTaint$$' ./e2e/

test-e2e-leader-long: release cluster-build
	$(LEADER_E2E) LEADER_E2E_LEAF_ROTATIONS=20 LEADER_E2E_CA_ROTATIONS=3 go test -count=1 -v -timeout 40m -run '^TestLeaderBootstrapAndRotations$$' ./e2e/

# Builds everything, shows kube-overcommit on the local control plane, cleans up (tests/cluster/demo.sh).
# KEEP=1 (or DEMO_KEEP=1) keeps the control plane and 3 replicas running; `make cluster-down` stops them.
KEEP ?=
DEMO_ARGS ?=
demo:
	tests/cluster/demo.sh $(if $(filter-out 0,$(KEEP)),--keep) $(DEMO_ARGS)

# Benchmarks (bench/bench.py): builds everything, brings up the local control plane when it needs
# it, writes BENCHMARKS.md. Never part of `make test`; bench-smoke is its short untimed check.
bench:
	tests/tools.sh valgrind >/dev/null
	python3 bench/bench.py run

bench-smoke:
	python3 bench/bench.py smoke
	tests/tools.sh valgrind >/dev/null
	python3 bench/bench.py instructions --check --no-floor

# A flame graph of kube-overcommit serving the 55 KB node review (perf with DWARF call graphs,
# inferno from crates.io): bench/out/flamegraph-kube-overcommit-node-55k.svg.
bench-flamegraph:
	python3 bench/bench.py profile --flamegraph

# The Dockerfile's promises without a container engine: the release build, needing only glibc and
# libgcc, serves a review from a root holding just those, as user 65532 (deploy/image-check.sh;
# needs root for chroot).
image-check:
	bash deploy/image-check.sh

# Supply chain (deny.toml), with the cargo-deny version pinned in tests/tools.sh: the licenses of
# every crate in the tree against the list the project accepts, no openssl, openssl-sys or
# native-tls (TLS is rustls + ring), crates from crates.io only. Advisories (known
# vulnerabilities) are NOT checked: `cargo deny check advisories` needs the RustSec database from
# GitHub, which the machines that run `make test` cannot fetch; run it where GitHub is reachable.
# The check takes under a second; installing cargo-deny the first time means building it (3.5 min
# on 2 busy cores), so `make test` starts that build in the background (nice 19) at the start of
# test-e2e, whose tests mostly wait on timers, and this target waits for it; a failed build fails
# here with its log.
deny:
	deny="$$(tests/tools.sh cargo-deny)" && "$$deny" --locked check licenses bans sources

# The CRD under deploy/ is generated from the Rust type; a unit test fails when it is stale.
crd:
	$(CARGO) run --quiet --locked -- crd > deploy/crd/overcommitpolicies.yaml

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

# Install manifests (deploy/ kustomize, charts/kube-overcommit): rendering, kustomize/Helm parity,
# security invariants, RBAC, PromQL of alerts and dashboard (no cluster needed; installs helm
# through tests/tools.sh on first use).
.PHONY: test-deploy-static chart-sync
test-deploy-static:
	cd tests/deploy && go test -count=1 -run Static ./...

# The chart carries copies of files it cannot reference (Helm reads only inside the chart).
chart-sync:
	mkdir -p charts/kube-overcommit/crds charts/kube-overcommit/files
	cp deploy/crd/overcommitpolicies.yaml charts/kube-overcommit/crds/overcommitpolicies.yaml
	cp deploy/components/monitoring/dashboard.json charts/kube-overcommit/files/dashboard.json

# Install manifests on the local control plane (its own, started and stopped by the script):
# server-side apply of kustomize and helm output, scheduling onto fake nodes, the PDB under node
# drains, RBAC on the real authorizer, the webhook-guard admission policy, and the release binary
# running as two replicas with the ServiceAccount's identity (bootstrap and inflation under RBAC).
.PHONY: test-deploy
test-deploy: test-deploy-static cluster-build release
	tests/deploy/cluster.sh
