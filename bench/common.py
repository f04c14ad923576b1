"""What the bench scripts share: paths, the benchmark servers, payload files, results.json, the
poll-until helper, Kubernetes quantities and the API-server section's rendering. Python 3.11,
stdlib only; imports no other bench module (bench.py, apiserver_bench.py, report.py,
gen_payloads.py and equivalence.py import this one).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
RESULTS = OUT / "results.json"
KCP = ROOT / "tests" / "cluster" / "kcp.sh"
# The benchmark runs its own control plane in bench/out/kcp, apart from any other run dir.
os.environ.setdefault("KCP_RUN_DIR", str(OUT / "kcp"))

PAYLOADS = ["node-10k", "node-55k", "node-200k", "pod-4k"]
COMMITTED_PAYLOADS = HERE / "payloads"  # small payloads are committed; node-200k is generated
# The placement cap's pods/binding review (committed, bench/payloads/binding-cap.json): measured
# apart from PAYLOADS, by a kube-overcommit with --request-cap whose node cache and pod index
# hold the node and pod it names (bench.py binding_check), beside the floor.
BINDING_PAYLOAD = "binding-cap"
# The regression guard (bench/instructions.py): instructions per review within this fraction of
# the committed figures.
INSTRUCTIONS_COMMITTED = HERE / "instructions-committed.json"
INSTRUCTIONS_GUARD = 0.05

SERVER_CPU = os.environ.get("BENCH_SERVER_CPU", "1")
# The machine is shared with builds: the servers and the load generator run at a raised priority
# (nice) so that the numbers are theirs, not the neighbours'. Empty or non-root: unchanged.
NICE = os.environ.get("BENCH_NICE", "-15")


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def read_results() -> dict:
    return json.loads(RESULTS.read_text())


def write_results(results: dict) -> None:
    RESULTS.write_text(json.dumps(results, indent=1))


def payload_path(name: str) -> Path | None:
    """The payload's file: generated (bench/out/payloads) before committed (bench/payloads)."""
    for d in (OUT / "payloads", COMMITTED_PAYLOADS):
        if (d / f"{name}.json").exists():
            return d / f"{name}.json"
    return None


def wait_for(what: str, fn, timeout: float = 90.0, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last_err = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - reported on timeout
            last_err = e
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}" + (f": {last_err}" if last_err else ""))


# ---------------------------------------------------------------- quantities

_SUFFIX = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


def quantity(text: str) -> Fraction:
    """Parse a Kubernetes quantity into an exact number."""
    s = str(text).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and s.endswith(suffix):
            return Fraction(s[: -len(suffix)]) * _SUFFIX[suffix]
    if "e" in s.lower():
        mant, _, exp = s.lower().partition("e")
        return Fraction(mant) * Fraction(10) ** int(exp)
    return Fraction(s)


# ---------------------------------------------------------------- servers


def pinned(cpu: str, argv: list[str]) -> list[str]:
    """argv pinned to one CPU (taskset) and, when we may, at the benchmark's priority."""
    out = list(argv)
    if shutil.which("taskset"):
        out = ["taskset", "-c", cpu, *out]
    if NICE and os.geteuid() == 0:
        out = ["nice", "-n", NICE, *out]
    return out


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the driver dies, so no server outlives a killed run."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    paths: dict[str, str]  # payload kind ("node" / "pod") -> URL path
    proc: subprocess.Popen | None = None
    logfile: Path | None = None
    env: dict[str, str] | None = None  # added to this process's environment

    def url_path(self, payload: str) -> str:
        kind = "binding" if payload == BINDING_PAYLOAD else "pod" if payload.startswith("pod") else "node"
        return self.paths[kind]

    def start(self) -> None:
        self.logfile = OUT / "logs" / f"{self.name}.log"
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.logfile, "wb")
        argv = pinned(SERVER_CPU, self.argv)
        log(f"starting {self.name}: {' '.join(argv)}")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent, env=env)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime and stime are fields 14 and 15 of stat(5); fields[0] is field 3.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)


def make_servers(bins: dict[str, Path], tls: Path, max_seconds: int) -> list[Server]:
    policy = HERE / "policy.yaml"
    return [
        Server("kube-overcommit", [str(bins["kube-overcommit"]), "serve", "--listen", "127.0.0.1:18443", "--tls-dir", str(tls),
                                   "--probe-listen", "127.0.0.1:18080", "--policy-file", str(policy)],
               18443, {"node": "/mutate", "pod": "/mutate"}),
        Server("go-webhook", [str(bins["go-webhook"]), "--host", "127.0.0.1", "--port", "18444", "--tls-dir", str(tls),
                              "--policy-file", str(policy), "--max-seconds", str(max_seconds)],
               18444, {"node": "/mutate--v1-node", "pod": "/mutate--v1-pod"}),
        Server("floor", [str(bins["floor"]), "--listen", "127.0.0.1:18445", "--tls-dir", str(tls), "--max-seconds", str(max_seconds)],
               18445, {"node": "/mutate", "pod": "/mutate"}),
    ]


def tls_context(tls: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path + "?timeout=10s", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def wait_ready(server: Server, tls: Path, body: bytes, payload: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}; see {server.logfile}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=tls_context(tls), timeout=5)
            status, _ = post(conn, server.url_path(payload), body)
            conn.close()
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as e:
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{server.name} not answering on 127.0.0.1:{server.port}: {last}")


# ---------------------------------------------------------------- the API-server section
# Written by apiserver_bench.run into its results and by report.render from stored results (so
# wording fixes apply to old results too).

# The phases the table renders, in order ("in-process", quiet heartbeats off, is only in results
# of runs before issue 37's harness: it applied `compile-inprocess` with no webhook running).
PHASES = ("off", "in-process", "in-process-quiet", "kube-overcommit", "kube-overcommit-quiet", "go-webhook")
PHASE_NAMES = {"off": "none (no overcommit)",
               "in-process": "in-process (MutatingAdmissionPolicy, no webhook), quiet heartbeats off",
               "in-process-quiet": "in-process, quiet heartbeats",
               "kube-overcommit": "kube-overcommit webhook, quiet heartbeats off",
               "kube-overcommit-quiet": "kube-overcommit webhook, quiet heartbeats"}
# kube-overcommit's static policies compiled into a MutatingAdmissionPolicy: the API server
# applies the node rule in CEL (the phase of older runs, quiet heartbeats off).
INPROCESS_PHASE = "in-process"
# What a user runs: kube-overcommit `serve --mode in-process` (one replica and its leader, behind
# its own Service): the leader keeps the compiled policy (quiet heartbeats compiled in, at the fake
# kubelets' report frequency as in QUIET_PHASE) and narrows the node webhook to the nodes it leaves
# (none here: it leaves the node webhook out of its configuration).
INPROCESS_QUIET_PHASE = "in-process-quiet"
# The phases `apiserver_bench.run` measures, in order.
MEASURED_PHASES = ("off", INPROCESS_QUIET_PHASE, "kube-overcommit", "kube-overcommit-quiet", "go-webhook")
# kube-overcommit with quiet heartbeats (--heartbeat-refresh at the fake kubelets' report
# frequency, as the default 5m is the kubelet's), as a user runs it: `serve --mode webhook` with its
# leader keeping the webhook configuration; the "kube-overcommit" phase runs without them.
QUIET_PHASE = "kube-overcommit-quiet"
# The fake kubelets report an unchanged status every minute instead of the kubelet's 5 min, so
# that a 2-minute window sees the unmutated writes at all; the rate with the webhook (every 10 s,
# nodeStatusUpdateFrequency) does not depend on it. The report scales the "off" rate to 5 min.
REPORT_FREQUENCY_S = 60
# The kubelet's nodeStatusUpdateFrequency and node-lease renewal (a quarter of the 40 s lease).
KUBELET_UPDATE_S = 10


def cpu_ms_per_patch(p: dict | None) -> float | None:
    """Control plane CPU milliseconds per nodes/status PATCH in a phase (None for runs without it)."""
    cp = (p or {}).get("control_plane")
    if not cp or not cp.get("status_patches"):
        return None
    return cp["cpu_s"] / cp["status_patches"] * 1000


def control_plane_per_patch(p: dict) -> str:
    v = cpu_ms_per_patch(p)
    return "–" if v is None else f"{v:.2f}"


# Issue 37's targets for in-process mode: control plane CPU per status PATCH at or below the
# webhook's, and within this fraction above no overcommit (quiet heartbeats on in both).
INPROCESS_OVER_OFF = 0.15


def inprocess_targets(r: dict) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met; None: not measured) for the in-process phase against the quiet
    webhook phase and no overcommit, and the hop: node reviews its webhook received in the phase."""
    inproc = r.get(INPROCESS_QUIET_PHASE)
    if not inproc:
        return []
    ours, webhook, off = cpu_ms_per_patch(inproc), cpu_ms_per_patch(r.get(QUIET_PHASE)), cpu_ms_per_patch(r.get("off"))
    out: list[tuple[str, str, bool | None]] = []
    name = "in-process control plane CPU per status PATCH at or below the webhook's (quiet heartbeats on in both)"
    if ours is None or webhook is None:
        out.append((name, "not measured", None))
    else:
        out.append((name, f"{ours:.2f} against {webhook:.2f} ms ({(ours / webhook - 1) * 100:+.0f}%)", ours <= webhook))
    name = f"in-process control plane CPU per status PATCH within {INPROCESS_OVER_OFF * 100:.0f}% of no overcommit"
    if ours is None or off is None:
        out.append((name, "not measured", None))
    else:
        out.append((name, f"{ours:.2f} against {off:.2f} ms ({(ours / off - 1) * 100:+.0f}%)",
                    ours <= off * (1 + INPROCESS_OVER_OFF)))
    name = "node reviews at the webhook during the in-process phase (every node is served in-process)"
    reviews = inproc.get("webhook_node_reviews")
    if reviews is None:
        out.append((name, "not counted (a run before `serve --mode in-process` ran in this phase: no webhook at all)", None))
    else:
        calls = inproc.get("webhook_calls")
        out.append((name, f"{reviews} (kube_overcommit_reviews_total, its /metrics); the API server's calls of "
                          f"nodes.overcommit.dev: {calls} (apiserver_admission_webhook_admission_duration_seconds count)",
                    reviews == 0 and calls == 0))
    return out


def apiserver_markdown(r: dict) -> list[str]:
    update_s = r.get("update_s", KUBELET_UPDATE_S)
    # Rates measured at update_s, as they would be at the kubelet's 10 s (the webhook-on rate is set
    # by the update frequency alone; the off rate by the report frequency, not scaled).
    scale = update_s / KUBELET_UPDATE_S
    L = []
    if r.get("carried_over"):
        L += [f"Carried over from the run of {r.get('measured_at', '?')} (commit {r.get('commit', '?')}): this run of the "
              "server benchmarks skipped the API-server part (`bench.py run --skip-apiserver`).", ""]
    elif r.get("measured_at"):
        L += [f"Measured {r['measured_at']} at commit {r.get('commit', '?')}.", ""]
    cadence = (f"status PATCH every {update_s} s when changed, else every {REPORT_FREQUENCY_S} s here, where the kubelet "
               "waits 5 min")
    if update_s != KUBELET_UPDATE_S:
        cadence += (f"; status updates and lease renewals every {update_s} s, {scale:g}x slower than the kubelet's 10 s, "
                    f"so that {r['nodes']} nodes put the write load of {r['nodes'] / scale:.0f} on this 2-core machine")
    L += [f"{r['nodes']} fake kubelets (tests/cluster fake-nodes: 50 images each, {cadence}) on the local control plane; "
         "each webhook as a local process behind a Service "
         "(failurePolicy Ignore, timeoutSeconds 2, UPDATE nodes/status and CREATE nodes). PATCH latency: "
         f"{r['probes']} sequential kubelet-style strategic-merge PATCHes of one more real-sized Node from a client on this machine. "
         f"Node writes: MODIFIED events of the fleet's Nodes in a {r['window_s']} s watch (each is a new resourceVersion in etcd).",
         ""]
    if r.get("probe_as_node"):
        L += ["The probe PATCHes are written as the node, as the fake kubelets write (impersonated: user system:node:NAME, "
              "group system:nodes), in every phase: the compiled policy takes node registrations and kubelet writes only, "
              "as the product's own webhook configuration does.", ""]
    if r.get(INPROCESS_QUIET_PHASE, {}).get("webhook_node_reviews") is not None:
        L += ["In-process: what a user runs, kube-overcommit `serve --mode in-process` (one replica, its own leader, "
              "bench/policy.yaml, --heartbeat-refresh at the fake kubelets' report frequency) behind its own Service; the "
              "leader fills in the placeholder MutatingAdmissionPolicy of deploy/components/in-process, keeps its "
              "MutatingWebhookConfiguration and narrows the node webhook (served-by-webhook) to the nodes the compiled "
              "policy leaves to it: none here, the bench policy being static and selecting every node, so the node webhook "
              "is left out of the configuration (the API server evaluates nothing of it for node writes). The phase is "
              "measured once the webhook is narrowed, a probe PATCH comes back inflated and every fleet node is inflated; "
              "its node reviews are counted from its own /metrics over the phase. The quiet webhook phase is what a user "
              "runs in webhook mode, the same replica with `--mode webhook`: its leader keeps the webhook configuration "
              "(failurePolicy Ignore, timeoutSeconds 2 by default) and watches the Nodes as the in-process leader does, so both "
              "phases' control plane CPU includes serving a leader's watches. The quiet-off webhook phase and go-webhook "
              "run without a leader, registered by the bench (timeoutSeconds 2).", ""]
    L += [
         "| path | PATCH nodes/status p50 ms | p90 ms | p99 ms | allocatable rewritten | Node writes / node / min | "
         "control plane CPU ms / status PATCH | webhook calls (API server's metric) | node reviews at kube-overcommit (its metrics) | "
         "mean webhook call, API server's metric (ms) | kube-overcommit or webhook CPU s | its peak RSS MiB |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for phase in PHASES:
        p = r.get(phase)
        if not p:
            continue
        lat, w = p["patch"], p["writes"]
        mean = "–" if p["webhook_mean_ms"] is None else f"{p['webhook_mean_ms']:.2f}"
        cpu = "–" if p["server_cpu_s"] is None else f"{p['server_cpu_s']:.2f}"
        rss = "–" if p.get("server_rss_kib") is None else f"{p['server_rss_kib'] / 1024:.1f}"
        L.append(f"| {PHASE_NAMES.get(phase, phase)} | {lat['p50_ms']:.2f} | {lat['p90_ms']:.2f} | {lat['p99_ms']:.2f} | {lat['mutated']}/{lat['count']} | "
                 f"{w['per_node_per_minute']:.2f} ({w['writes']} in {w['seconds']} s) | {control_plane_per_patch(p)} | "
                 f"{p['webhook_calls']} | {'–' if p.get('webhook_node_reviews') is None else p['webhook_node_reviews']} | "
                 f"{mean} | {cpu} | {rss} |")
    L += ["", "The API server's metric covers its whole webhook call (encoding the review with both objects, TLS, the "
              "webhook, decoding and applying the answer) on a machine where the API server itself competes for 2 shared "
              f"cores with {r['nodes']} fake kubelets and other work; the phases ran one after the other, so differences between "
              "the two webhooks there, and in PATCH p99, are within this machine's noise. The PATCH p50 and the write rate "
              "are the stable figures."]
    targets = inprocess_targets(r)
    if targets:
        L += ["", "In-process mode's targets (issue 37), computed from the rows above:", "", "| target | measured | |", "|---|---|---|"]
        L += [f"| {name} | {measured} | {'?' if ok is None else 'PASS' if ok else 'FAIL'} |" for name, measured, ok in targets]
    if any(r.get(phase, {}).get("control_plane") for phase in PHASES):
        L += ["", "Control plane CPU: the CPU seconds of the process that runs the API server and its embedded etcd "
                  "(process_cpu_seconds_total; the scheduler and controller-manager run in it too, idle here) over the phase, "
                  "divided by the nodes/status PATCHes its API server served in it (apiserver_request_total): the fleet's "
                  "writes and the probes. With a webhook it includes encoding every review and decoding every answer, with "
                  "in-process mode the CEL evaluation."]
    inproc, webhook = r.get(INPROCESS_PHASE), r.get("kube-overcommit")
    if inproc and webhook:
        d50 = webhook["patch"]["p50_ms"] - inproc["patch"]["p50_ms"]
        faster = f"{d50:.2f} ms faster" if d50 >= 0 else f"{-d50:.2f} ms slower"
        L += ["", f"In-process mode against the webhook (quiet heartbeats off in both, so the same writes): a status PATCH "
                  f"is {faster} at p50 without the webhook call, the API server evaluating the compiled CEL instead "
                  f"({inproc['patch']['p50_ms']:.2f} against {webhook['patch']['p50_ms']:.2f} ms), for "
                  f"{control_plane_per_patch(inproc)} against {control_plane_per_patch(webhook)} ms of control plane CPU "
                  "per status PATCH."]
    off, on = r.get("off"), r.get("kube-overcommit")
    off_5min = off["writes"]["per_node_per_minute"] * REPORT_FREQUENCY_S / 300 if off else None
    if off:
        L += ["", f"The fake kubelets here report an unchanged status every {REPORT_FREQUENCY_S} s (flag "
                  "--status-report-frequency) so that the window sees those writes; at the kubelet's default 5 min the "
                  f"webhook-off rate is {off_5min:.2f} writes per node "
                  f"per minute (scaled), while the rate with the webhook is set by the {update_s} s update frequency alone."]
    if off and on:
        d50 = on["patch"]["p50_ms"] - off["patch"]["p50_ms"]
        d99 = on["patch"]["p99_ms"] - off["patch"]["p99_ms"]
        on_rate = on["writes"]["per_node_per_minute"]
        at_kubelet = "" if scale == 1 else (f" as measured at {update_s} s, {on_rate * scale:.2f} at the kubelet's 10 s "
                                            f"({r['nodes'] * on_rate * scale / 60:.0f} writes/s for these {r['nodes']} nodes)")
        L += ["", f"kube-overcommit adds {d50:.2f} ms at p50 and {d99:.2f} ms at p99 to a status PATCH. "
                  "With it, every kubelet writes its status at every status update instead of every 5 min (the stored allocatable "
                  "always differs from the kubelet's own), so Node writes reaching etcd go from "
                  f"{off_5min:.2f} (5 min reports) to {on_rate:.2f} per node per minute{at_kubelet} "
                  "(docs/architecture.md §1: this is the cost of the overcommit itself, the same for any webhook doing it)."]
    inproc_quiet = r.get(INPROCESS_QUIET_PHASE)
    if off and inproc_quiet:
        off_rate = off["writes"]["per_node_per_minute"]
        rate = inproc_quiet["writes"]["per_node_per_minute"]
        ratio = rate / off_rate if off_rate else float("inf")
        L += ["", f"In-process mode with quiet heartbeats (the compiled policy puts the stored heartbeat times back; "
                  "its clock is the heartbeat the kubelet sends): "
                  f"{rate:.2f} Node writes per node per minute against {off_rate:.2f} without overcommit ({ratio:.2f}x), "
                  f"status PATCH p50 {inproc_quiet['patch']['p50_ms']:.2f} ms, "
                  f"{control_plane_per_patch(inproc_quiet)} ms of control plane CPU per status PATCH."]
    quiet = r.get(QUIET_PHASE)
    if off and quiet:
        off_rate = off["writes"]["per_node_per_minute"]
        quiet_rate = quiet["writes"]["per_node_per_minute"]
        ratio = quiet_rate / off_rate if off_rate else float("inf")
        verdict = "PASS" if ratio <= 1.2 else "FAIL"
        L += ["", f"Quiet heartbeats (`--heartbeat-refresh {REPORT_FREQUENCY_S}s` here, the fake kubelets' report "
                  "frequency; the default 5m is the kubelet's): a status PATCH that changes nothing but heartbeat times is "
                  "given the stored times back and stored as nothing. Node writes with the webhook: "
                  f"{quiet_rate:.2f} per node per minute against {off_rate:.2f} without any webhook at the same report "
                  f"frequency: {ratio:.2f}x (target at most 1.2x: {verdict}). Leases, not heartbeats, carry node health."]
    return L
