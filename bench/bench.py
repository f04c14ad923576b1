#!/usr/bin/env python3
"""kube-overcommit benchmark driver (`make bench`, `make bench-smoke`). Python 3.11, stdlib only.

  bench.py run    build everything, check patch equivalence, load every server with every
                  payload, measure through the API server, write BENCHMARKS.md
  bench.py smoke  build, check patch equivalence, a few hundred requests per server and payload;
                  no timing assertions (suitable for `make test`)
  bench.py report re-render BENCHMARKS.md from bench/out/results.json
  bench.py binding only the placement cap's pods/binding check beside the floor (its rows, printed)
  bench.py instructions      instructions per review under callgrind beside the floor's per request
                             (--check: against bench/instructions-committed.json, the guard;
                             --commit: write them as the committed figures)
  bench.py profile           perf record of one server under load: its hottest symbols
  bench.py profile-inprocess the API server's CPU profile (pprof) without and with the compiled
                             MutatingAdmissionPolicy, and the policy's, CEL's and JSON patch's shares

Servers (each pinned to CPU 1, the load generator to CPU 0, all on 127.0.0.1, all stop by
themselves): kube-overcommit serve; bench/go-webhook (controller-runtime CustomDefaulters);
bench/floor (rustls + hyper, fixed answer). Load: oha (installed into a cache directory by this
script when missing), TLS 1.3 over HTTP/1.1 keep-alive.
"""

from __future__ import annotations

import argparse
import fcntl
import http.client
import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import apiserver_bench
import equivalence
import instructions
import report
from common import (BINDING_PAYLOAD, COMMITTED_PAYLOADS, HERE, KCP, OUT, PAYLOADS, RESULTS, ROOT, Server, log, make_servers,
                    payload_path, pinned, post, read_results, tls_context, wait_for, wait_ready, write_results)

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kube-overcommit-bench"
OHA_VERSION = os.environ.get("BENCH_OHA_VERSION", "")  # empty: the newest oha
LOAD_CPU = os.environ.get("BENCH_LOAD_CPU", "0")
P99_LIMIT_MS = 5.0


# Fixed-rate steps measure latency, which the neighbours' builds would otherwise dominate (p99
# of 15-30 ms on an idle floor server): during those steps only, the server and the load
# generator run SCHED_FIFO. The kernel's RT throttling still leaves the others 5% of each core,
# and closed-loop (saturating) runs stay at normal policy so the machine is not held for long.
REALTIME = os.environ.get("BENCH_REALTIME", "1") == "1" and os.geteuid() == 0 and shutil.which("chrt") is not None


def set_realtime(pid: int, on: bool) -> None:
    if REALTIME:
        policy = ["-f", "-a", "-p", "10"] if on else ["-o", "-a", "-p", "0"]
        subprocess.run(["chrt", *policy, str(pid)], check=True, stdout=subprocess.DEVNULL)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


# ---------------------------------------------------------------- building


def build(skip: bool = False) -> dict[str, Path]:
    env = dict(os.environ)
    target = Path(env.get("CARGO_TARGET_DIR", ROOT / "target"))
    bins = OUT / "bin"
    if skip:
        return {"kube-overcommit": target / "release" / "kube-overcommit", "go-webhook": bins / "go-webhook",
                "floor": target / "release" / "tls-floor"}
    if shutil.which("sccache") and "RUSTC_WRAPPER" not in env:
        env["RUSTC_WRAPPER"] = "sccache"
    run(["cargo", "build", "--locked", "--release", "-p", "kube-overcommit", "-p", "tls-floor"], cwd=ROOT, env=env)
    target = Path(env.get("CARGO_TARGET_DIR", ROOT / "target"))
    bins = OUT / "bin"
    build_go_webhook(bins)
    return {
        "kube-overcommit": target / "release" / "kube-overcommit",
        "go-webhook": bins / "go-webhook",
        "floor": target / "release" / "tls-floor",
    }


def build_go_webhook(bins: Path) -> Path:
    """bench/go-webhook into `bins`. A `prebuild-go --start` still building it holds the lock:
    this waits for it, and the Go build cache then has its work."""
    bins.mkdir(parents=True, exist_ok=True)
    with open(OUT / ".go-webhook.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run(["go", "build", "-o", bins / "go-webhook", "."], cwd=HERE / "go-webhook")
    return bins / "go-webhook"


def cmd_prebuild_go(args) -> int:
    """Build go-webhook now, or with --start in the background at the lowest CPU priority: on a
    machine with empty Go caches its first build (module downloads, controller-runtime) takes
    minutes, which `make test` overlaps with its e2e phase (mostly waiting) instead of adding."""
    if not args.start:
        build_go_webhook(OUT / "bin")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "prebuild-go.log", "w") as out:
        subprocess.Popen(["nice", "-n", "19", sys.executable, str(Path(__file__).resolve()), "prebuild-go"],
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    log(f"building go-webhook in the background (nice 19; log: {OUT / 'prebuild-go.log'})")
    return 0


def ensure_oha() -> Path:
    found = shutil.which("oha")
    if found:
        return Path(found)
    oha = CACHE / "oha" / "bin" / "oha"
    if oha.exists():
        return oha
    log("installing oha from crates.io into " + str(CACHE / "oha") + " (one time, a few minutes)")
    env = dict(os.environ, CARGO_TARGET_DIR=str(CACHE / "oha-target"))
    if shutil.which("sccache"):
        env.setdefault("RUSTC_WRAPPER", "sccache")
    spec = ["oha"] + (["--version", OHA_VERSION] if OHA_VERSION else [])
    run(["cargo", "install", "--locked", "--root", CACHE / "oha", *spec], env=env)
    return oha


def ensure_inferno() -> Path:
    """inferno's perf-script folder and flame graph renderer (crates.io), for `profile --flamegraph`."""
    root = CACHE / "inferno"
    tools = root / "bin"
    if (tools / "inferno-flamegraph").exists() and (tools / "inferno-collapse-perf").exists():
        return tools
    log("installing inferno from crates.io into " + str(root) + " (one time, a few minutes)")
    env = dict(os.environ, CARGO_TARGET_DIR=str(CACHE / "inferno-target"))
    if shutil.which("sccache"):
        env.setdefault("RUSTC_WRAPPER", "sccache")
    run(["cargo", "install", "--locked", "--root", root, "inferno"], env=env)
    return tools


def make_certs(tls: Path) -> None:
    """A CA (ECDSA P-256, as the product's leader makes) and a leaf for 127.0.0.1 signed by it."""
    if (tls / "tls.crt").exists() and (tls / "tls.key").exists() and (tls / "ca.crt").exists():
        return
    tls.mkdir(parents=True, exist_ok=True)
    ext = tls / "leaf.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kube-overcommit-bench.overcommit-bench.svc\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n")
    q = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", tls / "ca.key"], **q)
    run(["openssl", "req", "-x509", "-new", "-key", tls / "ca.key", "-subj", "/CN=bench-ca", "-days", "30", "-out", tls / "ca.crt"], **q)
    run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", tls / "leaf.ec"], **q)
    run(["openssl", "pkcs8", "-topk8", "-nocrypt", "-in", tls / "leaf.ec", "-out", tls / "tls.key"], **q)
    run(["openssl", "req", "-new", "-key", tls / "tls.key", "-subj", "/CN=127.0.0.1", "-out", tls / "leaf.csr"], **q)
    run(["openssl", "x509", "-req", "-in", tls / "leaf.csr", "-CA", tls / "ca.crt", "-CAkey", tls / "ca.key",
         "-CAcreateserial", "-days", "30", "-extfile", ext, "-out", tls / "tls.crt"], **q)


# ---------------------------------------------------------------- payloads and equivalence


def payload_files() -> dict[str, Path]:
    return {p: path for p in PAYLOADS if (path := payload_path(p)) is not None}


def ensure_payloads(regenerate: bool) -> dict[str, Path]:
    files = payload_files()
    missing = [p for p in PAYLOADS if p not in files]
    if regenerate or missing:
        wanted = PAYLOADS if regenerate else missing
        log(f"generating payloads {wanted} from the local control plane")
        with_cluster(lambda: run([sys.executable, HERE / "gen_payloads.py", "--out", OUT / "payloads", "--only", ",".join(wanted)]))
        files = payload_files()
    return files


def cluster_running() -> bool:
    r = subprocess.run([KCP, "kubectl", "get", "--raw", "/readyz"], capture_output=True, text=True)
    return r.returncode == 0


def with_cluster(fn):
    """Run fn with the local control plane up; bring it up (and down again after) if it was not."""
    started = False
    if not cluster_running():
        run([KCP, "up"])
        started = True
    try:
        return fn()
    finally:
        if started:
            run([KCP, "down"])


def check_equivalence(servers: list[Server], files: dict[str, Path], tls: Path) -> dict:
    """Every mutating server's patch, applied to the object, must give the same essence; the
    output fed back must change nothing (no compounding). The floor must answer 200."""
    results = {}
    mutating = [s for s in servers if s.name != "floor"]
    for payload, path in files.items():
        body = path.read_bytes()
        review = json.loads(body)
        essences = {}
        for s in servers:
            conn = http.client.HTTPSConnection("127.0.0.1", s.port, context=tls_context(tls), timeout=10)
            status, answer = post(conn, s.url_path(payload), body)
            if status != 200:
                raise AssertionError(f"{s.name} answered HTTP {status} for {payload}: {answer[:300]!r}")
            if s.name == "floor":
                conn.close()
                continue
            patched = equivalence.patched_object(review, json.loads(answer))
            essences[s.name] = equivalence.essence(patched)
            # Feed the result back: the webhook must change nothing (docs/architecture.md rule 3.2).
            again = json.loads(body)
            again["request"]["object"] = patched
            status2, answer2 = post(conn, s.url_path(payload), json.dumps(again).encode())
            conn.close()
            if status2 != 200:
                raise AssertionError(f"{s.name}: HTTP {status2} on its own output for {payload}")
            if equivalence.essence(equivalence.patched_object(again, json.loads(answer2))) != essences[s.name]:
                raise AssertionError(f"{s.name}: its own output for {payload} was changed again (compounding)")
        if not essences:
            continue
        before = equivalence.essence(review["request"]["object"])
        first = essences[mutating[0].name]
        for name, e in essences.items():
            if e != first:
                raise AssertionError(
                    f"patches differ for {payload}:\n  {mutating[0].name}: {equivalence.describe(first)}\n  {name}: {equivalence.describe(e)}")
        if first == before:
            raise AssertionError(f"{payload}: no server changed anything; the payload does not exercise the mutation")
        results[payload] = {"bytes": len(body), "essence": json.loads(equivalence.describe(first))}
        log(f"equivalent: {payload} ({len(body)} bytes): " + ", ".join(essences))
    return results


# ---------------------------------------------------------------- load


def oha_cmd(oha: Path, server: Server, payload: str, body_file: Path, tls: Path, *, conns: int,
            seconds: float | None = None, requests: int | None = None, rate: float | None = None) -> list[str]:
    cmd = [str(oha), "--no-tui", "--output-format", "json", "-m", "POST", "-T", "application/json", "-D", str(body_file),
           "-c", str(conns), "--cacert", str(tls / "ca.crt"), "--worker-threads", "1"]
    if seconds is not None:
        cmd += ["-z", f"{seconds}s"]
    if requests is not None:
        cmd += ["-n", str(requests)]
    if rate is not None:
        cmd += ["-q", str(rate), "--latency-correction"]
    cmd.append(f"https://127.0.0.1:{server.port}{server.url_path(payload)}?timeout=10s")
    return pinned(LOAD_CPU, cmd)


# A fixed-rate step starts by opening its connections (TLS handshakes, the generator's own start-up:
# ~20 ms before the first answer). With --latency-correction every request scheduled meanwhile
# counts that wait, and a 4 s step at 12k req/s lost ~0.8% of its requests to it, most of its p99.
# The API server keeps its webhook connections open, so the steady state after this window is the
# figure; the whole step's p99 is reported beside it.
START_UP_S = 0.5


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    import math
    return sorted_values[max(0, math.ceil(p * len(sorted_values)) - 1)]


def steady_latencies(db: Path, start_up: float = START_UP_S) -> dict:
    """p50/p99/p99.9 (ms) of the requests oha scheduled after the step's first `start_up` seconds,
    from its per-request records (--db-url): latency from the scheduled start, as oha reports it."""
    import sqlite3
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT start_latency_correction, end FROM oha "
                           "WHERE start_latency_correction IS NOT NULL ORDER BY start_latency_correction").fetchall()
    finally:
        con.close()
    if not rows:
        raise RuntimeError(f"oha recorded no requests in {db}")
    first = rows[0][0]
    lat = sorted(end - start for start, end in rows if start - first >= start_up)
    if not lat:
        raise RuntimeError(f"the step was shorter than its {start_up} s start-up window")
    return {"requests": len(lat), **{k: percentile(lat, q) * 1000.0 for k, q in
                                     (("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999))}}


class MachineSample:
    """What the rest of the machine did around a step: the CPU time every process but the server
    and the load generator used (all CPUs' busy time from /proc/stat, minus the two) and the time
    the hypervisor took the CPUs away (steal). A fixed-rate step's tail is the machine's as much
    as the server's; these say which it was. (CPU pressure, PSI, is no help here: it counts the
    others waiting while the two SCHED_FIFO tasks run.)"""

    def __init__(self, server: Server):
        self.server = server
        self.at = time.monotonic()
        self.busy, self.steal = self._cpu_jiffies()
        self.server_cpu = server.cpu_seconds()
        self.children_cpu = self._children_cpu()

    @staticmethod
    def _cpu_jiffies() -> tuple[int, int]:
        # cpu  user nice system idle iowait irq softirq steal ...
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields[i] for i in (0, 1, 2, 5, 6)), fields[7] if len(fields) > 7 else 0

    @staticmethod
    def _children_cpu() -> float:
        # The load generator is a child the step waited for: its CPU time is here once it ended.
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    def since(self) -> dict:
        """ms per second of the step: others' CPU and steal."""
        seconds = max(time.monotonic() - self.at, 1e-3)
        busy, steal = self._cpu_jiffies()
        tick = os.sysconf("SC_CLK_TCK")
        ours = (self.server.cpu_seconds() - self.server_cpu) + (self._children_cpu() - self.children_cpu)
        others = max(0.0, (busy - self.busy) / tick - ours)
        per_s = lambda x: round(x * 1000.0 / seconds, 1)  # noqa: E731
        return {"others_cpu_ms_per_s": per_s(others), "steal_ms_per_s": per_s((steal - self.steal) / tick)}


def load(oha: Path, server: Server, payload: str, body_file: Path, tls: Path, **kw) -> dict:
    cmd = oha_cmd(oha, server, payload, body_file, tls, **kw)
    realtime = REALTIME and kw.get("rate") is not None
    db = OUT / "oha-step.db"
    if kw.get("rate") is not None:
        db.unlink(missing_ok=True)
        cmd += ["--db-url", str(db)]
    if realtime:
        cmd = ["chrt", "-f", "10", *cmd]
        set_realtime(server.proc.pid, True)
    cpu0 = server.cpu_seconds()
    machine_sample = MachineSample(server)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        cpu1 = server.cpu_seconds()
        if realtime:
            set_realtime(server.proc.pid, False)
    machine_during = machine_sample.since()
    if r.returncode != 0:
        raise RuntimeError(f"oha failed ({r.returncode}): {r.stderr.strip()[:500]}")
    doc = json.loads(r.stdout)
    summary = doc["summary"]
    pct = doc.get("latencyPercentiles") or doc.get("latency_percentiles") or {}
    statuses = doc.get("statusCodeDistribution") or {}
    ok = int(statuses.get("200", 0))
    total = sum(int(v) for v in statuses.values())
    errors = sum(int(v) for v in (doc.get("errorDistribution") or {}).values())
    ms = lambda k: (pct.get(k) or 0.0) * 1000.0  # noqa: E731
    result = {
        "requests": total, "ok": ok, "errors": errors,
        "rps": summary.get("requestsPerSec", 0.0),
        "p50_ms": ms("p50"), "p99_ms": ms("p99"), "p999_ms": ms("p99.9"),
        "cpu_s_per_1k": (cpu1 - cpu0) / ok * 1000 if ok else None,
        "target_rate": kw.get("rate"), "conns": kw.get("conns"), "realtime": realtime,
        "machine": machine_during,
    }
    if kw.get("rate") is not None:
        # The step's percentiles are its steady state; oha's whole-step figures stay beside them.
        steady = steady_latencies(db)
        db.unlink(missing_ok=True)
        result.update({"whole_p50_ms": result["p50_ms"], "whole_p99_ms": result["p99_ms"],
                       "whole_p999_ms": result["p999_ms"], "steady_requests": steady["requests"],
                       "start_up_s": START_UP_S, "p50_ms": steady["p50_ms"], "p99_ms": steady["p99_ms"],
                       "p999_ms": steady["p999_ms"]})
    return result


# Cycles per request: perf stat on the server process around two closed-loop runs of different
# lengths, the difference divided by the extra requests (the connections' handshakes cancel out).
# A third view of the throughput ratio, one the one-core load generator cannot bound; host noise
# still moves it (kube-overcommit 72k-98k cycles per round within minutes), hence the median.
CYCLE_RUNS = (4000, 24000)
CYCLE_ROUNDS = 5
CYCLE_CONNS = 8


def perf_counts(pid: int, argv: list[str]) -> dict | None:
    """cycles and instructions of process `pid` while `argv` runs; None where perf cannot count."""
    out = OUT / "perf-stat.csv"
    r = subprocess.run(["perf", "stat", "-x", ",", "-e", "cycles,instructions", "-p", str(pid), "-o", str(out),
                        "--", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counts = {}
    for line in out.read_text().splitlines() if r.returncode == 0 and out.exists() else []:
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in ("cycles", "instructions") and fields[0].isdigit():
            counts[fields[2]] = int(fields[0])
    return counts if len(counts) == 2 else None


def cycles_per_request(oha: Path, servers: list[Server], payload: str, body_file: Path, tls: Path) -> dict:
    """Each server's cycles and instructions per request on `payload`, the median of
    CYCLE_ROUNDS rounds in which the servers take turns; {} where perf cannot count."""
    rounds: dict[str, list[dict]] = {s.name: [] for s in servers}
    for _ in range(CYCLE_ROUNDS):
        for s in servers:
            short, long = (perf_counts(s.proc.pid, oha_cmd(oha, s, payload, body_file, tls, conns=CYCLE_CONNS,
                                                            requests=n)) for n in CYCLE_RUNS)
            if short is None or long is None:
                return {}
            extra = CYCLE_RUNS[1] - CYCLE_RUNS[0]
            rounds[s.name].append({k: (long[k] - short[k]) / extra for k in ("cycles", "instructions")})
    out = {}
    for name, rs in rounds.items():
        out[name] = {"cycles": statistics.median(r["cycles"] for r in rs),
                     "instructions": statistics.median(r["instructions"] for r in rs),
                     "rounds": rs, "conns": CYCLE_CONNS}
        log(f"  {name} {payload}: {out[name]['cycles']:,.0f} cycles, {out[name]['instructions']:,.0f} "
            f"instructions per request (perf stat, median of {len(rs)})")
    return out


def rss_with_connections(server: Server, tls: Path, payload: str, body: bytes, n: int = 128) -> int:
    """VmRSS (KiB) of the server with n TLS keep-alive connections open, each having served one review."""
    conns = []
    try:
        for _ in range(n):
            c = http.client.HTTPSConnection("127.0.0.1", server.port, context=tls_context(tls), timeout=10)
            post(c, server.url_path(payload), body)
            conns.append(c)
        time.sleep(0.5)  # let the server settle after the last answer (not a wait for a condition)
        return server.status_kib("VmRSS")
    finally:
        for c in conns:
            c.close()


# ---------------------------------------------------------------- the runs


def start_all(servers, files, tls):
    for s in servers:
        s.start()
    any_payload = next(iter(files))
    for s in servers:
        wait_ready(s, tls, files[any_payload].read_bytes(), any_payload)


def machine() -> dict:
    def first(path, key):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            return "?"
        return "?"

    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[0]
        except (OSError, IndexError):
            return "?"

    return {
        "nproc": os.cpu_count(), "cpu": first("/proc/cpuinfo", "model name"), "kernel": platform.release(),
        "memory": first("/proc/meminfo", "MemTotal"), "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "rustc": version(["rustc", "--version"]), "go": version(["go", "version"]),
        "oha": None, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def cmd_smoke(args) -> int:
    bins = build()
    tls = OUT / "tls"
    make_certs(tls)
    # The smoke check never starts the control plane: it uses the committed payloads (and the
    # generated ones when a `make bench` left them in bench/out/).
    files = payload_files()
    if not all(p in files for p in ("node-10k", "node-55k", "pod-4k")):
        raise SystemExit(f"bench-smoke: committed payloads missing in {COMMITTED_PAYLOADS}")
    servers = make_servers(bins, tls, max_seconds=600)
    try:
        start_all(servers, files, tls)
        check_equivalence(servers, files, tls)
        for s in servers:
            for payload, f in files.items():
                conn = http.client.HTTPSConnection("127.0.0.1", s.port, context=tls_context(tls), timeout=10)
                body = f.read_bytes()
                for _ in range(args.requests):
                    status, _ = post(conn, s.url_path(payload), body)
                    if status != 200:
                        raise AssertionError(f"{s.name} {payload}: HTTP {status}")
                conn.close()
            log(f"smoke: {s.name}: {args.requests} requests x {len(files)} payloads answered 200; peak RSS {s.status_kib('VmHWM')} KiB")
    finally:
        for s in servers:
            s.stop()
    print(f"bench-smoke: {len(servers)} servers x {len(files)} payloads equivalent and answering")
    return 0


# Fixed-rate steps, as fractions of the server's own closed-loop maximum; the 50% step is the
# "p99 at half of maximum throughput" target. Stepping stops once p99 passes 5 ms.
RATE_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1)
RATE_CONNS = 8  # few, like the API server's pool per webhook


# Closed-loop runs alternate the servers in rounds: this machine's speed drifts by 20% and more
# within the hour, and one server measured minutes after another would carry that into the ratio.
# Each server's best run counts; with three rounds one server could miss the machine's quiet
# spells altogether (node-55k rounds of 85%, 55% and 69% in one run), so five.
CLOSED_ROUNDS = 5
CLOSED_CONNS = (16, 64)


def closed_loops(oha, servers: list[Server], payload: str, f: Path, tls: Path, quick: bool) -> dict[str, list[dict]]:
    """Every server's closed-loop runs on one payload: rounds of (16, 64) connections, the servers
    taking turns within each round."""
    secs = 3 if quick else 5
    for s in servers:
        load(oha, s, payload, f, tls, conns=16, seconds=1)  # warm-up
    runs: dict[str, list[dict]] = {s.name: [] for s in servers}
    for round_no in range(1 if quick else CLOSED_ROUNDS):
        for s in servers:
            for conns in CLOSED_CONNS:
                r = load(oha, s, payload, f, tls, conns=conns, seconds=secs)
                r["round"] = round_no
                runs[s.name].append(r)
        log(f"  {payload} closed loop, round {round_no + 1}: " + ", ".join(
            f"{name} {max(r['rps'] for r in rs if r['round'] == round_no):.0f}/s" for name, rs in runs.items()))
    return runs


def bench_server_payload(oha, s: Server, payload: str, f: Path, tls: Path, quick: bool, closed: list[dict]) -> dict:
    best = max(closed, key=lambda r: r["rps"])
    rates = []
    half = None
    for frac in RATE_FRACTIONS:
        rate = max(1, round(best["rps"] * frac))
        # Long enough for >= 2,500 requests (a stable p99.9), within 4-20 s (2-6 s when quick).
        step = min(6 if quick else 20, max(2 if quick else 4, 2500 / rate))
        r = load(oha, s, payload, f, tls, conns=RATE_CONNS, seconds=round(step, 1), rate=rate)
        if frac == 0.5:
            # The target's step: measured twice, the better kept, so that one burst of a
            # neighbour's work does not decide it (both are recorded).
            again = load(oha, s, payload, f, tls, conns=RATE_CONNS, seconds=round(step, 1), rate=rate)
            r, other = sorted([r, again], key=lambda x: x["p99_ms"])
            r["other_try_p99_ms"] = other["p99_ms"]
            r["other_try_machine"] = other["machine"]
        r["fraction"] = frac
        rates.append(r)
        if frac == 0.5:
            half = r
        log(f"  {s.name} {payload} @{rate}/s ({frac:.0%} of max): {r['rps']:.0f}/s p50 {r['p50_ms']:.2f} "
            f"p99 {r['p99_ms']:.2f} p99.9 {r['p999_ms']:.2f} ms; machine {report.describe_machine(r['machine'])}")
        if r["p99_ms"] > P99_LIMIT_MS and frac >= 0.5:
            break
    log(f"  {s.name} {payload}: max {best['rps']:.0f}/s; at half max p99 {half['p99_ms']:.2f} ms")
    return {"closed": closed, "max": best, "rates": rates, "half_max": half}


def cmd_run(args) -> int:
    bins = build(args.no_build)
    oha = ensure_oha()
    tls = OUT / "tls"
    make_certs(tls)
    files = ensure_payloads(args.regenerate)
    info = machine()
    info["oha"] = subprocess.run([oha, "--version"], capture_output=True, text=True).stdout.strip()
    # --skip-apiserver keeps the API-server part of the previous run, marked as carried over.
    kept = read_results().get("apiserver") if args.skip_apiserver and RESULTS.exists() else None
    if kept:
        kept["carried_over"] = True
    results = {"machine": info, "payloads": {}, "servers": {}, "apiserver": kept}
    servers = [s for s in make_servers(bins, tls, max_seconds=3 * 3600) if not args.servers or s.name in args.servers.split(",")]
    try:
        start_all(servers, files, tls)
        results["payloads"] = check_equivalence(servers, files, tls)
        results["servers"] = {s.name: {"payloads": {}} for s in servers}
        # Also before any load: what the connections themselves cost, apart from what the
        # allocator keeps of the run's peaks (measured again at the end, the target's figure).
        for s in servers:
            results["servers"][s.name]["fresh_rss_128_conns_kib"] = rss_with_connections(
                s, tls, "node-55k", files["node-55k"].read_bytes())
        for payload in PAYLOADS:
            if payload not in files:
                continue
            closed = closed_loops(oha, servers, payload, files[payload], tls, args.quick)
            for s in servers:
                results["servers"][s.name]["payloads"][payload] = bench_server_payload(
                    oha, s, payload, files[payload], tls, args.quick, closed[s.name])
            write_results(results)
        measured = [s for s in servers if s.name in ("kube-overcommit", "floor")]
        if "node-55k" in files and perf_works() and len(measured) == 2:
            results["cycles"] = {"node-55k": cycles_per_request(oha, measured, "node-55k", files["node-55k"], tls)}
        for s in servers:
            res = results["servers"][s.name]
            res["rss_128_conns_kib"] = rss_with_connections(s, tls, "node-55k", files["node-55k"].read_bytes())
            res["peak_rss_kib"] = s.status_kib("VmHWM")
        write_results(results)
    finally:
        for s in servers:
            s.stop()
    add_binding(results, binding_check(bins, oha, tls, args.quick))
    # The regression guard: instructions per review, beside the floor's per request.
    results["instructions"] = instructions.measure(bins["floor"], tls)
    write_results(results)
    if not args.skip_apiserver:
        results["apiserver"] = apiserver_bench.run(bins, tls, nodes=args.nodes, quick=args.quick,
                                                   update_s=apiserver_bench.update_frequency(args))
    results["pod_index"] = pod_index_memory()
    write_results(results)
    if perf_works():
        cmd_profile(argparse.Namespace(server="kube-overcommit", payload="node-55k", seconds=8, dwarf=False, no_build=True))
        results = read_results()
    else:
        log("perf cannot count instructions here (perf stat -e instructions true failed): no profile section")
    report.write(results, ROOT / "BENCHMARKS.md")
    log("wrote BENCHMARKS.md")
    return 0


# The binding check (issue 17): a kube-overcommit with --request-cap on the local control plane,
# its node cache holding CAP_NODE (raw cpu CAP_RAW_CPU, capped at CAP_PERCENT) with CAP_BOUND pods
# of 1 cpu bound there, and its pod index holding the pending pod the payload binds (CAP_POD_CPU):
# every review is a real decision (allowed: 40.5 of a cap of 70.4), the ledger entry included.
CAP_NAMESPACE, CAP_POD, CAP_NODE = "bench-cap", "capped-0", "bench-capped"
CAP_LABEL = "overcommit.dev/bench-cap"
CAP_RAW_CPU, CAP_PERCENT, CAP_BOUND, CAP_POD_CPU = "64", "110%", 40, "500m"
CAP_PORT, CAP_PROBE_PORT = 18447, 18081
CAP_POLICY = f"""apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata:
  name: bench-cap
spec:
  nodeSelector:
    matchLabels:
      {CAP_LABEL}: "true"
  priority: 10
  nodeRatios:
    cpu: "1.1"
  requestCap:
    cpu: "{CAP_PERCENT}"
"""


def cap_objects() -> list[dict]:
    """The node, the pods bound to it and the pending pod the binding payload names."""
    def pod(name: str, cpu: str, node: str | None) -> dict:
        spec = {"containers": [{"name": "app", "image": "registry.invalid/app", "resources": {"requests": {"cpu": cpu}}}],
                "automountServiceAccountToken": False}
        if node:
            spec["nodeName"] = node
        else:
            spec["schedulerName"] = "bench-no-scheduler"  # stays pending: only the payload binds it
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": CAP_NAMESPACE}, "spec": spec}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": CAP_NODE, "labels": {CAP_LABEL: "true"}},
            "status": {"capacity": {"cpu": CAP_RAW_CPU, "pods": "110"}, "allocatable": {"cpu": CAP_RAW_CPU, "pods": "110"}}}
    return [node] + [pod(f"bound-{i}", "1", CAP_NODE) for i in range(CAP_BOUND)] + [pod(CAP_POD, CAP_POD_CPU, None)]


def placement_outcomes(probe_port: int) -> dict[str, float]:
    """kube_overcommit_placement_reviews_total by outcome, from the probe port's /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", probe_port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for m in re.finditer(r'^kube_overcommit_placement_reviews_total\{outcome="([a-z-]+)"\} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def binding_check(bins: dict[str, Path], oha: Path, tls: Path, quick: bool) -> dict:
    """The binding check's latency beside the floor, measured as the other payloads are (closed
    loop, then fixed rates as fractions of each server's maximum): {"bytes", "essence",
    "servers": {name: payload result}}. Brings the local control plane up if it is not."""
    return with_cluster(lambda: _binding_check(bins, oha, tls, quick))


def _binding_check(bins: dict[str, Path], oha: Path, tls: Path, quick: bool) -> dict:
    body_file = payload_path(BINDING_PAYLOAD)
    if body_file is None:
        raise SystemExit(f"bench: {BINDING_PAYLOAD}.json missing in {COMMITTED_PAYLOADS}")
    d = OUT / "cap"
    d.mkdir(parents=True, exist_ok=True)
    kubeconfig, policy = d / "kubeconfig", d / "policy.yaml"
    kubeconfig.write_text(run([KCP, "kubectl", "config", "view", "--raw"], capture_output=True, text=True).stdout)
    policy.write_text(CAP_POLICY)
    kubectl = [KCP, "kubectl"]
    run(kubectl + ["delete", "namespace", CAP_NAMESPACE, "--ignore-not-found", "--wait=true"])
    run(kubectl + ["delete", "node", CAP_NODE, "--ignore-not-found"])
    run(kubectl + ["create", "namespace", CAP_NAMESPACE])
    run(kubectl + ["create", "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List", "items": cap_objects()}),
        text=True, capture_output=True)
    product = Server("kube-overcommit", [str(bins["kube-overcommit"]), "serve", "--listen", f"127.0.0.1:{CAP_PORT}",
                                         "--tls-dir", str(tls), "--probe-listen", f"127.0.0.1:{CAP_PROBE_PORT}",
                                         "--policy-file", str(policy), "--request-cap", "--leader-election=false"],
                     CAP_PORT, {"binding": "/validate"}, env={"KUBECONFIG": str(kubeconfig)})
    floor = next(s for s in make_servers(bins, tls, max_seconds=3600) if s.name == "floor")
    floor.paths = {"binding": "/mutate"}
    servers = [product, floor]
    body = body_file.read_bytes()
    try:
        for s in servers:
            s.start()
        wait_ready(floor, tls, body, BINDING_PAYLOAD)
        # Ready once the review is decided on the node and pod (not failed open for want of them).
        def decided() -> bool:
            conn = http.client.HTTPSConnection("127.0.0.1", CAP_PORT, context=tls_context(tls), timeout=5)
            status, answer = post(conn, product.url_path(BINDING_PAYLOAD), body)
            conn.close()
            if status != 200 or not json.loads(answer)["response"]["allowed"]:
                raise AssertionError(f"HTTP {status}: {answer[:300]!r}")
            return placement_outcomes(CAP_PROBE_PORT).get("allowed", 0) > 0
        wait_for("kube-overcommit --request-cap deciding the binding (node cache and pod index synced)", decided, timeout=90)
        before = placement_outcomes(CAP_PROBE_PORT)
        closed = closed_loops(oha, servers, BINDING_PAYLOAD, body_file, tls, quick)
        results = {s.name: bench_server_payload(oha, s, BINDING_PAYLOAD, body_file, tls, quick, closed[s.name])
                   for s in servers}
        after = placement_outcomes(CAP_PROBE_PORT)
    finally:
        for s in servers:
            s.stop()
        run(kubectl + ["delete", "namespace", CAP_NAMESPACE, "--ignore-not-found", "--wait=false"])
        run(kubectl + ["delete", "node", CAP_NODE, "--ignore-not-found"])
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    if grew.get("allowed", 0) == 0 or any(v for k, v in grew.items() if k != "allowed"):
        raise AssertionError(f"binding check: every review must be decided and allowed; outcomes during the load: {grew}")
    log(f"binding check: {grew['allowed']:.0f} reviews, all decided and allowed")
    essence = {"decision": "allowed", "node": CAP_NODE, "raw cpu": CAP_RAW_CPU, "cap": CAP_PERCENT,
               "bound": f"{CAP_BOUND} pods, {CAP_BOUND} cpu", "pod": CAP_POD_CPU, "reviews": int(grew["allowed"])}
    return {"bytes": len(body), "essence": essence, "servers": results}


def add_binding(results: dict, binding: dict) -> None:
    """Put the binding check into results as one more payload (the report renders it so)."""
    results.setdefault("payloads", {})[BINDING_PAYLOAD] = {"bytes": binding["bytes"], "essence": binding["essence"]}
    for name, r in binding["servers"].items():
        results.setdefault("servers", {}).setdefault(name, {"payloads": {}})["payloads"][BINDING_PAYLOAD] = r


def cmd_binding(args) -> int:
    """Only the binding check (development): printed, BENCHMARKS.md and results.json untouched."""
    bins = build(args.no_build)
    oha = ensure_oha()
    tls = OUT / "tls"
    make_certs(tls)
    b = binding_check(bins, oha, tls, args.quick)
    for name, r in b["servers"].items():
        h = r["half_max"]
        print(f"{BINDING_PAYLOAD} {name}: max {r['max']['rps']:.0f}/s (p50 {r['max']['p50_ms']:.2f} ms); at half max "
              f"{h['rps']:.0f}/s p50 {h['p50_ms']:.3f} ms p99 {h['p99_ms']:.3f} ms p99.9 {h['p999_ms']:.3f} ms")
    print(json.dumps(b["essence"]))
    return 0


POD_INDEX_PODS, POD_INDEX_NODES = 100_000, 1_000


def pod_index_memory() -> dict:
    """RSS of the usage rule's lean pod index (core/examples/pod_index_rss.rs) holding
    POD_INDEX_PODS pods on POD_INDEX_NODES nodes."""
    env = {k: v for k, v in os.environ.items() if k != "RUSTC_WRAPPER"}
    run(["cargo", "build", "--locked", "--release", "-p", "kube-overcommit-core", "--example", "pod_index_rss"],
        cwd=ROOT, env=env)
    target = Path(env.get("CARGO_TARGET_DIR", ROOT / "target"))
    out = subprocess.run([str(target / "release" / "examples" / "pod_index_rss"), str(POD_INDEX_PODS), str(POD_INDEX_NODES)],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"RSS \+([\d.]+) MiB \(([\d.]+) MiB per 10,000 pods; (\d+) bytes per pod\)", out)
    if not m:
        raise RuntimeError(f"pod_index_rss printed {out!r}")
    return {"pods": POD_INDEX_PODS, "nodes": POD_INDEX_NODES, "rss_mib": float(m.group(1)),
            "mib_per_10k": float(m.group(2)), "bytes_per_pod": int(m.group(3))}


def perf_works() -> bool:
    if not shutil.which("perf"):
        return False
    return subprocess.run(["perf", "stat", "-e", "instructions", "true"], capture_output=True).returncode == 0


def cmd_profile(args) -> int:
    """perf record one server under closed-loop load with one payload; print the hottest symbols."""
    bins = build(getattr(args, "no_build", False))
    oha = ensure_oha()
    flamegraph = getattr(args, "flamegraph", False)
    inferno = ensure_inferno() if flamegraph else None
    tls = OUT / "tls"
    make_certs(tls)
    files = payload_files()
    servers = [s for s in make_servers(bins, tls, max_seconds=600) if s.name == args.server]
    if not servers:
        raise SystemExit(f"unknown server {args.server}")
    s = servers[0]
    data = OUT / f"perf-{s.name}-{args.payload}.data"
    try:
        start_all([s], {args.payload: files[args.payload]}, tls)
        load(oha, s, args.payload, files[args.payload], tls, conns=16, seconds=1)
        # Flat self time by default; call graphs from DWARF (the release profile keeps debuginfo).
        graph = ["--call-graph", "dwarf,16384"] if args.dwarf or flamegraph else []
        rec = subprocess.Popen(["perf", "record", "-F", "1999", *graph,
                                "-o", str(data), "-p", str(s.proc.pid), "--", "sleep", str(args.seconds)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = load(oha, s, args.payload, files[args.payload], tls, conns=32, seconds=args.seconds)
        rec.wait()
        log(f"{s.name} {args.payload}: {r['rps']:.0f} req/s during the profile")
    finally:
        s.stop()
    if flamegraph:
        svg = OUT / f"flamegraph-{s.name}-{args.payload}.svg"
        script = subprocess.run(["perf", "script", "-i", str(data)], capture_output=True, check=True).stdout
        folded = subprocess.run([str(inferno / "inferno-collapse-perf")], input=script, capture_output=True,
                                check=True).stdout
        title = f"{s.name}, {args.payload}, {r['rps']:.0f} req/s (perf record -F 1999, DWARF call graphs)"
        svg.write_bytes(subprocess.run([str(inferno / "inferno-flamegraph"), "--title", title], input=folded,
                                       capture_output=True, check=True).stdout)
        log(f"wrote {svg}")
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "symbol", "--stdio",
                             "--percent-limit", "0.7", *(["-g", "caller,0.5,callee,function,percent"] if args.dwarf else [])], capture_output=True, text=True).stdout
    out = OUT / f"profile-{s.name}-{args.payload}.txt"
    out.write_text(report)
    if not (args.dwarf or flamegraph) and s.name == "kube-overcommit" and RESULTS.exists():
        top = []
        for line in report.splitlines():
            m = re.match(r"\s+([\d.]+)%\s+(\[[.k]\])\s+(.+?)\s*$", line)
            if m:
                sym = m.group(3).split("  ")[0].strip()
                top.append((float(m.group(1)), ("[k] " if m.group(2) == "[k]" else "") + sym))
        results = read_results()
        results["profile"] = {"payload": args.payload, "rps": r["rps"], "top": top[:25]}
        write_results(results)
    print(report)
    log(f"wrote {out}")
    return 0


def cmd_apiserver(args) -> int:
    """Only the API-server part; merged into bench/out/results.json, BENCHMARKS.md re-rendered."""
    bins = build(args.no_build)
    tls = OUT / "tls"
    make_certs(tls)
    ensure_payloads(False)
    # Without the server benchmarks of a `run`, there is no BENCHMARKS.md to re-render: print the part.
    results = read_results() if RESULTS.exists() else {}
    results["apiserver"] = apiserver_bench.run(bins, tls, nodes=args.nodes, quick=args.quick,
                                               update_s=apiserver_bench.update_frequency(args))
    write_results(results)
    if "servers" in results:
        report.write(results, ROOT / "BENCHMARKS.md")
    else:
        print("\n".join(results["apiserver"]["markdown"]))
    return 0


def cmd_profile_inprocess(args) -> int:
    """A CPU profile of the API server without and with the compiled MutatingAdmissionPolicy
    (bench/out/pprof-apiserver-PHASE.pb.gz), and the policy's share of it: where the README's
    in-process profile figures come from."""
    bins = build(args.no_build)
    ensure_payloads(False)
    map_files = {phase: Path(f) for phase, f in (("in-process", args.map_file), ("in-process-quiet", args.map_file_quiet))
                 if f}
    rows = apiserver_bench.profile_inprocess(bins["kube-overcommit"], args.patches, args.seconds, map_files)
    print("| phase | status PATCHes | p50 ms | control plane CPU ms per PATCH | profiled CPU s | policy | CEL | patch | "
          "of it SMD |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        share = lambda k: f"{100 * r[k] / r['total_s']:.0f}%" if r["total_s"] else "-"  # noqa: E731
        print(f"| {r['phase']} | {r['patches']:,} | {r['p50_ms']:.2f} | {r['cpu_ms_per_patch']:.2f} | {r['total_s']:.1f} | "
              f"{share('policy_s')} | {share('cel_s')} | {share('patch_s')} | {share('smd_s')} |")
    print("(shares of the API server's profiled CPU; CEL and patch (a JSON patch or an ApplyConfiguration "
          "applied, SMD its structured merge diff) are parts of the policy's; "
          "`go tool pprof -top bench/out/pprof-apiserver-in-process.pb.gz` for the functions)")
    return 0


def cmd_instructions(args) -> int:
    """Instruction counts alone (no load, no control plane); --check fails outside the guard."""
    floor = None
    tls = OUT / "tls"
    if not args.no_floor:
        floor = build()["floor"]
        make_certs(tls)
    measured = instructions.measure(floor, tls, args.payload or None)
    if measured.get("skipped"):
        print(f"instructions: NOT MEASURED: {measured['skipped']}")
        # The guard must not pass by not looking: `make bench-smoke` installs valgrind first.
        return 1 if args.check else 0
    print("\n".join(report.instructions_markdown(measured)))
    if args.commit:
        figures = {**instructions.committed(), **{p: r["review"] for p, r in measured["payloads"].items()}}
        instructions.COMMITTED.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
        print(f"instructions: committed figures written to {instructions.COMMITTED.relative_to(ROOT)}")
    if args.check:
        bad = instructions.check(measured, instructions.committed())
        for line in bad:
            print(f"instructions: OUTSIDE THE GUARD: {line}")
        return 1 if bad else 0
    return 0


def cmd_report(_args) -> int:
    report.write(read_results(), ROOT / "BENCHMARKS.md")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--quick", action="store_true", help="shorter steps (a rough look, not for BENCHMARKS.md)")
    r.add_argument("--regenerate", action="store_true", help="rebuild every payload from the control plane")
    r.add_argument("--nodes", type=int, default=int(os.environ.get("BENCH_NODES", "1000")),
                   help="fake nodes for the API server part (BENCH_NODES)")
    r.add_argument("--status-update-frequency", type=int, default=int(os.environ.get("BENCH_STATUS_UPDATE", "0")),
                   help="fake kubelets' status update frequency in s (BENCH_STATUS_UPDATE; default 10 s per 250 nodes, "
                        "so 1,000 nodes at 40 s load a 2-core machine like 250 kubelets at their real 10 s)")
    r.add_argument("--skip-apiserver", action="store_true",
                   help="leave out the API-server part (the previous run's, if any, is kept and marked as carried over)")
    r.add_argument("--servers", default="", help="comma-separated subset (development only)")
    r.add_argument("--no-build", action="store_true", help="use the binaries already built (development only)")
    b = sub.add_parser("binding", help="only the binding check's rows (printed; BENCHMARKS.md untouched)")
    b.add_argument("--quick", action="store_true", help="shorter steps (a rough look)")
    b.add_argument("--no-build", action="store_true", help="use the binaries already built")
    s = sub.add_parser("smoke")
    s.add_argument("--requests", type=int, default=200)
    sub.add_parser("report")
    pg = sub.add_parser("prebuild-go", help="build go-webhook (--start: in the background, for make test)")
    pg.add_argument("--start", action="store_true")
    ap_ = sub.add_parser("apiserver")
    ap_.add_argument("--nodes", type=int, default=int(os.environ.get("BENCH_NODES", "1000")))
    ap_.add_argument("--status-update-frequency", type=int, default=int(os.environ.get("BENCH_STATUS_UPDATE", "0")))
    ap_.add_argument("--quick", action="store_true")
    ap_.add_argument("--no-build", action="store_true")
    pr = sub.add_parser("profile")
    pr.add_argument("--server", default="kube-overcommit")
    pr.add_argument("--no-build", action="store_true", help="use the binaries already built")
    pr.add_argument("--payload", default="node-55k")
    pr.add_argument("--seconds", type=int, default=10)
    pr.add_argument("--dwarf", action="store_true", help="DWARF call graphs (bigger, slower)")
    pr.add_argument("--flamegraph", action="store_true",
                    help="also write bench/out/flamegraph-SERVER-PAYLOAD.svg (DWARF call graphs; installs inferno)")
    ins = sub.add_parser("instructions", help="instructions per review under callgrind (the regression guard)")
    ins.add_argument("--check", action="store_true", help="fail when a review count is outside the guard")
    ins.add_argument("--commit", action="store_true", help="write the measured counts as the committed figures")
    ins.add_argument("--no-floor", action="store_true", help="leave out the floor's count (faster)")
    ins.add_argument("--payload", action="append", help="only this payload (repeatable)")
    pi = sub.add_parser("profile-inprocess", help="the API server's CPU profile with the compiled policy (see the README)")
    pi.add_argument("--patches", type=int, default=3000, help="sequential status PATCHes per phase")
    pi.add_argument("--seconds", type=int, default=20, help="profile length per phase (the PATCHes outlast it)")
    pi.add_argument("--no-build", action="store_true", help="use the binaries already built")
    pi.add_argument("--map-file", help="a hand-written MutatingAdmissionPolicy (JSON) for the in-process phase "
                    "instead of the compiled one; the phases without one are left out")
    pi.add_argument("--map-file-quiet", help="the same for the in-process-quiet phase")
    args = ap.parse_args()
    return {"run": cmd_run, "smoke": cmd_smoke, "report": cmd_report, "profile": cmd_profile,
            "apiserver": cmd_apiserver, "binding": cmd_binding, "prebuild-go": cmd_prebuild_go,
            "profile-inprocess": cmd_profile_inprocess, "instructions": cmd_instructions}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
