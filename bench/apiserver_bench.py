"""Through the API server (issue 6 item 4), on the local control plane (tests/cluster).

With N fake kubelets running (kcp.sh fake-nodes, real status loop: PATCH every 10 s when the
status differs, else every 5 min), measures with the webhook registered and without:
  - the latency of a nodes/status strategic-merge PATCH (the kubelet's write) of a real-sized
    Node, from a client on this machine, sequential, keep-alive;
  - Node writes that reach etcd: MODIFIED events of a watch on the fake nodes, per node per minute;
  - the API server's own view of the webhook call (apiserver_admission_webhook_admission_duration_seconds);
  - the control plane's CPU (one process here: API server and embedded etcd, its
    process_cpu_seconds_total) per nodes/status PATCH it served (apiserver_request_total).
  - in the in-process phase, the node reviews kube-overcommit's webhook received (its own metrics):
    0, or the run fails.
Phases (MEASURED_PHASES): no overcommit; in-process (kube-overcommit `serve --mode in-process`, one
replica with its leader, which keeps the compiled policy and narrows its node webhook); each webhook
(kube-overcommit with quiet heartbeats as `serve --mode webhook`, one replica with its leader, which
keeps its webhook configuration; the others registered by the bench).
kube-overcommit runs as a local process behind a Service through `kcp.sh backend` (the cluster's
service resolver), with failurePolicy Ignore and timeoutSeconds 2 as the product deploys it.
The probe PATCHes are written as the node (impersonated), as the fake kubelets write: the compiled
policy takes kubelet writes only.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from common import (HERE, INPROCESS_QUIET_PHASE, KCP, KUBELET_UPDATE_S, MEASURED_PHASES, OUT, PHASES, QUIET_PHASE, REPORT_FREQUENCY_S,
                    ROOT, Server, apiserver_markdown, die_with_parent, make_servers, payload_path, quantity, wait_for, wait_ready)

NAMESPACE = "overcommit-bench"
SERVICE = "kube-overcommit-bench"
WEBHOOK = "kube-overcommit-bench"
FLEET_PREFIX = "bench-fleet"
PROBE_NODE = "bench-latency-0"


def log(msg: str) -> None:
    print(f"bench(apiserver): {msg}", file=sys.stderr, flush=True)


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    r = subprocess.run([str(KCP), "kubectl", *args], input=stdin, capture_output=True, text=True, timeout=180)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class Api:
    """A minimal client for the local API server, authenticated with the admin kubeconfig."""

    def __init__(self):
        cfg = json.loads(kubectl("config", "view", "--raw", "-o", "json"))
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        d = OUT / "kube"
        d.mkdir(parents=True, exist_ok=True)

        def material(key_data, key_file, name):
            if key_data in cluster or key_data in user:
                src = cluster if key_data in cluster else user
                p = d / name
                p.write_bytes(base64.b64decode(src[key_data]))
                return str(p)
            return (cluster.get(key_file) or user.get(key_file))

        self.ctx = ssl.create_default_context(cafile=material("certificate-authority-data", "certificate-authority", "ca.crt"))
        cert = material("client-certificate-data", "client-certificate", "client.crt")
        key = material("client-key-data", "client-key", "client.key")
        if cert and key:
            self.ctx.load_cert_chain(cert, key)
        self.token = user.get("token")
        u = urllib.parse.urlparse(cluster["server"])
        self.host, self.port = u.hostname, u.port or 443
        self.conn = self.new_conn()

    def new_conn(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def headers(self, content_type: str | None = None, as_node: str | None = None) -> dict:
        h = {"Accept": "application/json"}
        if content_type:
            h["Content-Type"] = content_type
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if as_node:
            # As the kubelet of that node writes (the fake kubelets do the same); the API server
            # adds system:authenticated.
            h["Impersonate-User"] = f"system:node:{as_node}"
            h["Impersonate-Group"] = "system:nodes"
        return h

    def request(self, method: str, path: str, body=None, content_type="application/json",
                as_node: str | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        for attempt in (1, 2):
            try:
                self.conn.request(method, path, body=data,
                                  headers=self.headers(content_type if data is not None else None, as_node))
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.RemoteDisconnected, ConnectionError):
                # The API server closes idle keep-alive connections (during a long watch): reconnect once.
                self.conn.close()
                self.conn = self.new_conn()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get(self, path: str):
        status, body = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)


def webhook_config(ca_pem: bytes, path: str, port: int) -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK},
        "webhooks": [{
            "name": "nodes.overcommit.dev",
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 2, "matchPolicy": "Equivalent",
            "reinvocationPolicy": "Never",
            "clientConfig": {"service": {"namespace": NAMESPACE, "name": SERVICE, "path": path, "port": port},
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes/status"]},
                      {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["nodes"]}],
        }],
    }


def phase_port(phase: str) -> int:
    """Each phase reaches its server through its own Service port. The API server keeps its
    keep-alive connections to a webhook Service per host:port and asks the service resolver only
    when it dials, so re-pointing one port at another server would leave the earlier phase's
    server answering (it still runs) for as long as those connections live."""
    return 443 + PHASES.index(phase)


def webhook_on(api: Api, tls: Path, addr: str, path: str, port: int) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
    kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": p, "port": phase_port(p), "targetPort": 8443} for p in PHASES],
                 "selector": {"app": SERVICE}}}))
    subprocess.run([str(KCP), "backend", "add", "--namespace", NAMESPACE, "--service", SERVICE, "--port", str(port), "--addr", addr],
                   check=True)
    kubectl("apply", "-f", "-", stdin=json.dumps(webhook_config((tls / "ca.crt").read_bytes(), path, port)))


def webhook_off(api: Api, addr: str, port: int) -> None:
    kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")
    subprocess.run([str(KCP), "backend", "remove", "--namespace", NAMESPACE, "--service", SERVICE, "--port", str(port), "--addr", addr],
                   check=False)


def inprocess_on(binary: Path, heartbeat_refresh: str, map_file: Path | None = None) -> None:
    """The bench policy compiled into a MutatingAdmissionPolicy + binding (what `serve --mode
    in-process` keeps), named like the bench's webhook. It takes registrations and kubelet writes
    only (its variable `takes`), so the probe PATCHes are written as the node; a hand-written
    variant's matchConditions are dropped. `heartbeat_refresh` "0" (quiet
    heartbeats off) in the phase compared with the "kube-overcommit" phase (the same writes reach
    storage); the report frequency in the quiet one, as the quiet webhook phase has it.
    `map_file`: a hand-written MutatingAdmissionPolicy (JSON: the policy, or a List holding it)
    instead of the compiled one, to measure a variant before compiling it."""
    if map_file is None:
        out = subprocess.run([str(binary), "compile-inprocess", "--policy-file", str(HERE / "policy.yaml"),
                              "--heartbeat-refresh", heartbeat_refresh],
                             capture_output=True, text=True, check=True).stdout
        items = json.loads(out)["items"]
    else:
        doc = json.loads(map_file.read_text())
        items = [i for i in doc.get("items", [doc]) if i["kind"] == "MutatingAdmissionPolicy"]
        items.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
                      "metadata": {"name": WEBHOOK}, "spec": {"matchResources": items[0]["spec"]["matchConstraints"]}})
    for item in items:
        item["metadata"]["name"] = WEBHOOK
        if item["kind"] == "MutatingAdmissionPolicy":
            item["spec"].pop("matchConditions", None)
        else:
            item["spec"]["policyName"] = WEBHOOK
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def inprocess_off() -> None:
    kubectl("delete", "mutatingadmissionpolicybinding", WEBHOOK, "--ignore-not-found")
    kubectl("delete", "mutatingadmissionpolicy", WEBHOOK, "--ignore-not-found")


# kube-overcommit as installed (`serve` with its leader): in-process mode as
# deploy/components/in-process installs it (the placeholder policy and binding it ships, named like
# the webhook configuration the leader keeps, --webhook-config-name), and webhook mode.
INPROCESS_NAME = "kube-overcommit"
INPROCESS_SERVICE = "kube-overcommit-replica"
INPROCESS_SHIPPED = ROOT / "deploy" / "components" / "in-process"
INPROCESS_PORT, INPROCESS_PROBE_PORT = 18448, 18088
NARROWING_CONDITION = "served-by-webhook"


class ProductReplica:
    """One replica of kube-overcommit `serve --mode MODE` with its leader, as tests/cluster's
    install package runs one: KUBECONFIG and the namespace in its environment, its serving Secret
    (made by its leader) mirrored into its tls directory by `kcp secret-volume`, and the ready
    backend of its own Service (port 443, which the leader's webhook configuration names). So the
    in-process phase and the quiet webhook phase both carry the leader's watches, as an install does.
    Nudges off: this process writes with the admin's credentials, not the ServiceAccount the
    compiled policy's condition names, so its nudges would be PATCHes neither path mutates; the
    phase waits for the fleet's own reports instead, as the bench-registered webhook phases do."""

    def __init__(self, binary: Path, heartbeat_refresh: str, phase: str, mode: str):
        self.mode = mode
        self.tls = OUT / "replica-tls"
        self.addr = f"127.0.0.1:{INPROCESS_PORT}"
        self.server = Server(phase, [
            str(binary), "serve", "--mode", mode, "--listen", self.addr, "--tls-dir", str(self.tls),
            "--probe-listen", f"127.0.0.1:{INPROCESS_PROBE_PORT}", "--policy-file", str(HERE / "policy.yaml"),
            "--heartbeat-refresh", heartbeat_refresh, "--namespace", NAMESPACE, "--service-name", INPROCESS_SERVICE,
            "--webhook-config-name", INPROCESS_NAME, "--identity", "bench-replica", "--nudge-rate", "0",
            # Quick bootstrap and hand-over, as tests/cluster runs it.
            "--lease-ttl", "6s", "--lease-renew", "2s", "--check-interval", "1s", "--propagation-delay", "5s",
            "--cert-reload-interval", "1s", "--shutdown-grace", "5s"],
            INPROCESS_PORT, {"node": "/mutate", "pod": "/mutate"},
            env={"KUBECONFIG": str(Path(os.environ["KCP_RUN_DIR"]) / "kubeconfig"), "POD_NAMESPACE": NAMESPACE})
        self.volume: subprocess.Popen | None = None

    def start(self) -> None:
        self.stop()
        shutil.rmtree(self.tls, ignore_errors=True)
        self.tls.mkdir(parents=True)
        (OUT / "logs").mkdir(parents=True, exist_ok=True)
        kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        if self.mode == "in-process":
            for shipped in ("policy.yaml", "binding.yaml"):
                kubectl("apply", "-f", str(INPROCESS_SHIPPED / shipped))
        self.volume = subprocess.Popen([str(KCP), "secret-volume", "--namespace", NAMESPACE, "--name", "kube-overcommit-tls",
                                        "--dir", str(self.tls)], stdout=subprocess.DEVNULL,
                                       stderr=open(OUT / "logs" / "replica-secret-volume.log", "wb"),
                                       start_new_session=True, preexec_fn=die_with_parent)
        subprocess.run([str(KCP), "backend", "add", "--namespace", NAMESPACE, "--service", INPROCESS_SERVICE, "--port", "443",
                        "--addr", self.addr, "--ready-url", f"http://127.0.0.1:{INPROCESS_PROBE_PORT}/readyz"], check=True)
        self.server.start()

    def ready(self) -> bool:
        if self.server.proc.poll() is not None:
            raise RuntimeError(f"serve --mode {self.mode} exited with {self.server.proc.returncode}; see {self.server.logfile}")
        with urllib.request.urlopen(f"http://127.0.0.1:{INPROCESS_PROBE_PORT}/readyz", timeout=5) as resp:
            return resp.status == 200

    def narrowed(self, api: Api) -> bool:
        """The leader's node webhook carries its narrowing, or is left out of the configuration
        (the compiled policy, in force, serves every node: the bench's policy is static)."""
        config = api.get(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{INPROCESS_NAME}") or {}
        if not config.get("webhooks"):
            return False
        nodes = [w for w in config["webhooks"] if w.get("name") == "nodes.overcommit.dev"]
        return not nodes or any(c.get("name") == NARROWING_CONDITION for w in nodes for c in w.get("matchConditions") or [])

    def wait_in_force(self, api: Api, raw: dict) -> None:
        wait_for(f"the {self.mode} replica ready (its certificate from its leader)", self.ready, timeout=180, interval=1)
        if self.mode != "in-process":
            def served_by_webhook() -> bool:
                before = product_reviews(self.server)
                return patch_latencies(api, raw, 1, as_node=True)["mutated"] == 1 and product_reviews(self.server) > before
            wait_for("a probe PATCH inflated by the replica's webhook", served_by_webhook, timeout=90, interval=1)
            return
        wait_for("the in-process leader to narrow its node webhook", lambda: self.narrowed(api), timeout=120, interval=1)

        def served_in_process() -> bool:
            # Inflated without a node review at the webhook: the API server runs the compiled
            # policy and has loaded the narrowed webhook configuration.
            before = product_reviews(self.server)
            return patch_latencies(api, raw, 1, as_node=True)["mutated"] == 1 and product_reviews(self.server) == before
        wait_for("a probe PATCH inflated in-process, not by the webhook", served_in_process, timeout=90, interval=1)

    def stop(self) -> None:
        """Stops the replica, then removes what it kept (webhook configuration, compiled policy,
        binding), so that the next phase starts from none of them."""
        self.server.stop()
        if self.volume and self.volume.poll() is None:
            os.killpg(self.volume.pid, signal.SIGTERM)
            self.volume.wait(timeout=30)
        self.volume = None
        subprocess.run([str(KCP), "backend", "remove", "--namespace", NAMESPACE, "--service", INPROCESS_SERVICE, "--port", "443",
                        "--addr", self.addr], check=False, capture_output=True)
        kubectl("delete", "mutatingwebhookconfiguration", INPROCESS_NAME, "--ignore-not-found")
        kubectl("delete", "mutatingadmissionpolicybinding", INPROCESS_NAME, "--ignore-not-found")
        kubectl("delete", "mutatingadmissionpolicy", INPROCESS_NAME, "--ignore-not-found")


def control_plane_counters(api: Api) -> dict:
    """The control plane process's CPU seconds and the nodes/status PATCHes its API server served."""
    status, body = api.request("GET", "/metrics")
    out = {"cpu_s": 0.0, "status_patches": 0}
    for line in body.decode().splitlines():
        if line.startswith("process_cpu_seconds_total "):
            out["cpu_s"] = float(line.rsplit(" ", 1)[1])
        elif (line.startswith("apiserver_request_total{") and 'resource="nodes"' in line and 'subresource="status"' in line
              and 'verb="PATCH"' in line):
            out["status_patches"] += int(float(line.rsplit(" ", 1)[1]))
    return out


def product_reviews(server: Server) -> int | None:
    """Node reviews a kube-overcommit server has answered (its own metrics), None for other servers."""
    probe = next((a.split(":")[-1] for prev, a in zip(server.argv, server.argv[1:]) if prev == "--probe-listen"), None)
    if probe is None:
        return None
    with urllib.request.urlopen(f"http://127.0.0.1:{probe}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("kube_overcommit_reviews_total{") and 'resource="node"' in line)


def create_probe_node(api: Api) -> dict:
    """A Node of real size (from the node-55k payload) that only this client writes."""
    review = json.loads(_payload("node-55k").read_text())
    node = copy.deepcopy(review["request"]["object"])
    meta = node["metadata"]
    for k in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        meta.pop(k, None)
    meta["name"] = PROBE_NODE
    meta["labels"]["kubernetes.io/hostname"] = PROBE_NODE
    for k in ("overcommit.dev/raw-allocatable", "overcommit.dev/applied"):
        meta.get("annotations", {}).pop(k, None)
    api.request("DELETE", f"/api/v1/nodes/{PROBE_NODE}")
    wait_for("the old probe node to go", lambda: api.get(f"/api/v1/nodes/{PROBE_NODE}") is None)
    status, body = api.request("POST", "/api/v1/nodes", node)
    if status != 201:
        raise RuntimeError(f"creating {PROBE_NODE}: HTTP {status}: {body[:300]!r}")
    # Node creation drops status; write it as the kubelet does after registering.
    status, body = api.request("PATCH", f"/api/v1/nodes/{PROBE_NODE}/status", {"status": node["status"]},
                               "application/strategic-merge-patch+json")
    if status != 200:
        raise RuntimeError(f"status of {PROBE_NODE}: HTTP {status}: {body[:300]!r}")
    return node


def _payload(name: str) -> Path:
    path = payload_path(name)
    if path is None:
        raise FileNotFoundError(name)
    return path


def patch_latencies(api: Api, raw_allocatable: dict, count: int, as_node: bool = False) -> dict:
    """Sequential kubelet-style status PATCHes (heartbeat + the kubelet's own allocatable); `as_node`:
    written as the node itself (impersonated), as its kubelet does."""
    lat = []
    mutated = 0
    for i in range(count):
        beat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {"status": {"allocatable": raw_allocatable,
                            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": beat,
                                            "reason": "KubeletReady", "message": f"kubelet is posting ready status ({i})"}]}}
        t0 = time.perf_counter()
        status, body = api.request("PATCH", f"/api/v1/nodes/{PROBE_NODE}/status", patch, "application/strategic-merge-patch+json",
                                   as_node=PROBE_NODE if as_node else None)
        lat.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            raise RuntimeError(f"PATCH status: HTTP {status}: {body[:300]!r}")
        stored = json.loads(body)["status"]["allocatable"]
        if any(quantity(stored.get(k, "0")) != quantity(v) for k, v in raw_allocatable.items()):
            mutated += 1  # the API server stored something else than the kubelet's own value
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]  # noqa: E731
    return {"count": count, "mutated": mutated, "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99),
            "mean_ms": statistics.fmean(lat), "max_ms": lat[-1]}


def node_writes(api: Api, nodes: int, seconds: int) -> dict:
    """Count resourceVersion changes of the fleet's Nodes through a watch for `seconds`."""
    lst = api.get(f"/api/v1/nodes?labelSelector={urllib.parse.quote('kcp.overcommit.dev/fake-node=true')}&limit=1")
    rv = lst["metadata"]["resourceVersion"]
    conn = api.new_conn(timeout=seconds + 30)
    conn.request("GET", f"/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds={seconds}"
                        f"&labelSelector={urllib.parse.quote('kcp.overcommit.dev/fake-node=true')}", headers=api.headers())
    resp = conn.getresponse()
    per_node: dict[str, int] = {}
    mutated_events = 0
    for line in resp:
        ev = json.loads(line)
        if ev.get("type") != "MODIFIED":
            continue
        name = ev["object"]["metadata"]["name"]
        if not name.startswith(FLEET_PREFIX):
            continue
        per_node[name] = per_node.get(name, 0) + 1
        if "overcommit.dev/applied" in (ev["object"]["metadata"].get("annotations") or {}):
            mutated_events += 1
    conn.close()
    total = sum(per_node.values())
    return {"seconds": seconds, "nodes": nodes, "writes": total, "mutated_writes": mutated_events,
            "per_node_per_minute": total / nodes / (seconds / 60)}


def webhook_metrics(api: Api) -> dict:
    """Sum and count of the API server's webhook call latency histogram for our webhook."""
    status, body = api.request("GET", "/metrics")
    out = {"sum": 0.0, "count": 0}
    for line in body.decode().splitlines():
        if line.startswith("apiserver_admission_webhook_admission_duration_seconds_") and 'name="nodes.overcommit.dev"' in line:
            v = float(line.rsplit(" ", 1)[1])
            if "_sum{" in line:
                out["sum"] += v
            elif "_count{" in line:
                out["count"] += int(v)
    return out


def update_frequency(args) -> int:
    """--status-update-frequency, else 10 s per 250 nodes (the load this machine carries), 10-60 s."""
    if args.status_update_frequency:
        return args.status_update_frequency
    return max(KUBELET_UPDATE_S, min(REPORT_FREQUENCY_S, round(KUBELET_UPDATE_S * args.nodes / 250)))


def fleet_versions(api: Api) -> dict[str, str] | None:
    """Each fleet node's resourceVersion once every one carries an allocatable above its capacity
    (cpu: the webhook or the compiled policy has written it); None before."""
    sel = urllib.parse.quote("kcp.overcommit.dev/fake-node=true")
    nodes = [n for n in api.get(f"/api/v1/nodes?labelSelector={sel}")["items"] if n["metadata"]["name"].startswith(FLEET_PREFIX)]
    if not nodes or any(quantity(n["status"]["allocatable"]["cpu"]) <= quantity(n["status"]["capacity"]["cpu"]) for n in nodes):
        return None
    return {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in nodes}


def wait_settled(api: Api, poll_s: float) -> None:
    """Every fleet node inflated, then stored once more. The kubelet write after the one that
    inflated a node is stored even where quiet heartbeats keep its heartbeat (seen with the
    compiled policy on 300 fake kubelets: the kept heartbeat stored with a new managedFields time),
    once per node; the next ones follow the refresh period. A phase that inflates the fleet afresh
    (in-process, after none) would otherwise count those writes in its window, and a phase that
    follows an inflated one (the quiet webhook) would not."""
    inflated: dict[str, dict[str, str]] = {}

    def first() -> bool:
        inflated["rv"] = fleet_versions(api) or {}
        return bool(inflated["rv"])
    wait_for("every fleet node inflated", first, timeout=REPORT_FREQUENCY_S * 3, interval=poll_s)

    def stored_again() -> bool:
        now = fleet_versions(api) or {}
        return bool(now) and all(now.get(name) != rv for name, rv in inflated["rv"].items())
    wait_for("every fleet node stored once more since", stored_again, timeout=REPORT_FREQUENCY_S * 3, interval=poll_s)


def without_quiet_heartbeats(product: Server) -> None:
    """kube-overcommit without quiet heartbeats (the "kube-overcommit" phase, which shows what the
    overcommit itself costs); the quiet phase is a ProductReplica refreshing at the fake kubelets'
    report frequency."""
    product.argv = [*product.argv, "--heartbeat-refresh", "0"]


def reviews_wrong(phase: str, reviews: int | None, calls: int, probes: int) -> str | None:
    """Why a phase's node reviews at kube-overcommit (its metrics; None: not kube-overcommit) make
    its figures wrong, None if they do not."""
    if phase == INPROCESS_QUIET_PHASE:
        # The bench policy is static and selects every node: in-process mode serves them all.
        if reviews != 0:
            return (f"phase {phase}: the webhook received {reviews} node reviews (its kube_overcommit_reviews_total) "
                    f"for nodes served in-process, want 0 (the API server called nodes.overcommit.dev {calls} times)")
    elif reviews is not None and reviews < probes:
        # The phase's own server must have answered the API server's calls (at least the
        # probes), or the phase measured another server.
        return (f"phase {phase}: its server answered {reviews} node reviews, "
                f"fewer than the {probes} probe PATCHes: the API server called another server")
    return None


def measure_phase(api: Api, phase: str, server: Server | None, raw: dict, nodes: int, probes: int, window: int) -> dict:
    """One phase's figures: `probes` status PATCHes of the probe node (as the node), then `window`
    seconds of the fleet's writes; the API server's and `server`'s counters over both."""
    m0 = webhook_metrics(api)
    cp0 = control_plane_counters(api)
    cpu0 = server.cpu_seconds() if server else 0.0
    reviews0 = product_reviews(server) if server else None
    log(f"phase {phase}: {probes} status PATCHes, then {window}s of watching the fleet's writes")
    lat = patch_latencies(api, raw, probes, as_node=True)
    writes = node_writes(api, nodes, window)
    m1 = webhook_metrics(api)
    cp1 = control_plane_counters(api)
    calls = m1["count"] - m0["count"]
    reviews = None if reviews0 is None else product_reviews(server) - reviews0
    wrong = reviews_wrong(phase, reviews, calls, probes)
    if wrong:
        raise RuntimeError(wrong)
    out = {"patch": lat, "writes": writes, "webhook_calls": calls, "webhook_node_reviews": reviews,
           "webhook_mean_ms": (m1["sum"] - m0["sum"]) / calls * 1000 if calls else None,
           "server_cpu_s": (server.cpu_seconds() - cpu0) if server else None,
           "control_plane": {"cpu_s": cp1["cpu_s"] - cp0["cpu_s"], "status_patches": cp1["status_patches"] - cp0["status_patches"]},
           "server_rss_kib": server.status_kib("VmHWM") if server else None}
    log(f"phase {phase}: PATCH p50 {lat['p50_ms']:.2f} p99 {lat['p99_ms']:.2f} ms; "
        f"{writes['per_node_per_minute']:.2f} writes/node/min; node reviews at kube-overcommit {reviews}, API server's calls {calls}")
    return out


def run(bins: dict, tls: Path, nodes: int, quick: bool, update_s: int = KUBELET_UPDATE_S) -> dict:
    """`update_s`: each fake kubelet's status update frequency; the lease duration scales with it
    (renewed every quarter). Above the kubelet's 10 s a large fleet puts the write load of a
    smaller one on the API server (1,000 nodes at 40 s: the writes of 250 at 10 s), which is what
    lets 1,000 nodes run on a 2-core machine; the report scales the write rates back to 10 s."""
    if update_s < KUBELET_UPDATE_S or update_s > REPORT_FREQUENCY_S:
        raise ValueError(f"status update frequency must be {KUBELET_UPDATE_S}-{REPORT_FREQUENCY_S} s, not {update_s}")
    window = 60 if quick else 120
    probes = 100 if quick else 400
    # Listing the whole fleet (~45 KB per Node) is itself load: poll a big fleet less often.
    poll_s = max(3.0, nodes / 100)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    results: dict = {"nodes": nodes, "window_s": window, "probes": probes, "update_s": update_s, "probe_as_node": True,
                     "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit or "unknown"}
    cluster_started = False
    if subprocess.run([str(KCP), "kubectl", "get", "--raw", "/readyz"], capture_output=True).returncode != 0:
        subprocess.run([str(KCP), "up"], check=True)
        cluster_started = True
    servers = {s.name: s for s in make_servers(bins, tls, max_seconds=3600) if s.name in PHASES}
    without_quiet_heartbeats(servers["kube-overcommit"])
    for s in servers.values():
        s.start()
    fleet = replica = None
    api = Api()
    addr = {name: f"127.0.0.1:{s.port}" for name, s in servers.items()}
    try:
        for s in servers.values():
            wait_ready(s, tls, _payload("node-55k").read_bytes(), "node-55k")
        for name, a in addr.items():
            webhook_off(api, a, phase_port(name))
        inprocess_off()
        node = create_probe_node(api)
        raw = node["status"]["allocatable"]
        log(f"starting {nodes} fake kubelets (50 images each)")
        (OUT / "logs").mkdir(parents=True, exist_ok=True)
        fleet = subprocess.Popen([str(KCP), "fake-nodes", "--count", str(nodes), "--prefix", FLEET_PREFIX, "--images", "50",
                                  "--status-report-frequency", f"{REPORT_FREQUENCY_S}s", "--status-update-frequency", f"{update_s}s",
                                  "--lease-duration", f"{4 * update_s}s", "--run-pods=false", "--delete-on-exit"],
                                 stdout=subprocess.DEVNULL, stderr=open(OUT / "logs" / "fake-nodes.log", "wb"), start_new_session=True)
        sel = urllib.parse.quote("kcp.overcommit.dev/fake-node=true")
        wait_for(f"{nodes} fleet nodes", lambda: len([n for n in api.get(f"/api/v1/nodes?labelSelector={sel}")["items"]
                                                     if n["metadata"]["name"].startswith(FLEET_PREFIX)]) >= nodes, timeout=900, interval=poll_s)
        # Registration writes (first status, controller-manager taints and annotations) settle first.
        warmup = 20 if quick else 60
        log(f"fleet registered; {warmup}s warm-up")
        time.sleep(warmup)
        replicas = {INPROCESS_QUIET_PHASE: "in-process", QUIET_PHASE: "webhook"}
        for phase in MEASURED_PHASES:
            for name, a in addr.items():
                webhook_off(api, a, phase_port(name))
            server = servers.get(phase)
            if phase in replicas:
                replica = ProductReplica(bins["kube-overcommit"], f"{REPORT_FREQUENCY_S}s", phase, replicas[phase])
                replica.start()
                server = replica.server
                replica.wait_in_force(api, raw)
                # Each fake kubelet's next report (within REPORT_FREQUENCY_S) is inflated by the API server.
                wait_settled(api, poll_s)
            elif server:
                webhook_on(api, tls, addr[phase], server.paths["node"], phase_port(phase))
                # Wait until the API server calls the webhook: a probe PATCH comes back mutated.
                wait_for("the webhook to be called", lambda: patch_latencies(api, raw, 1, as_node=True)["mutated"] == 1,
                         timeout=60, interval=1)
                # Each fake kubelet's next report (within REPORT_FREQUENCY_S) goes through the webhook;
                # from then on its stored allocatable differs from its own, and it writes every 10 s.
                wait_settled(api, poll_s)
            else:
                # Back to the kubelet's value (the annotations of an earlier phase stay, unused).
                wait_for("the webhook to be gone", lambda: patch_latencies(api, raw, 1, as_node=True)["mutated"] == 0,
                         timeout=60, interval=1)
            results[phase] = measure_phase(api, phase, server, raw, nodes, probes, window)
            if replica:
                replica.stop()
                replica = None
                wait_for("the replica's policy or webhook to be gone",
                         lambda: patch_latencies(api, raw, 1, as_node=True)["mutated"] == 0, timeout=60, interval=1)
    finally:
        for name, a in addr.items():
            webhook_off(api, a, phase_port(name))
        if replica:
            replica.stop()
        inprocess_off()
        if fleet and fleet.poll() is None:
            os.killpg(fleet.pid, signal.SIGTERM)
            try:
                fleet.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(fleet.pid, signal.SIGKILL)
        try:
            api.request("DELETE", f"/api/v1/nodes/{PROBE_NODE}")
        except OSError:
            pass
        for s in servers.values():
            s.stop()
        if cluster_started:
            subprocess.run([str(KCP), "down"], check=False)
    results["markdown"] = apiserver_markdown(results)
    return results


# Where the API server spends the in-process policy's time (`bench.py profile-inprocess`): a CPU
# profile (pprof) of the control plane during one client's sequential status PATCHes of the probe
# node, without a policy, with the compiled policy (quiet heartbeats off, then on), without again.
PROFILE_PHASES = (("none", None), ("in-process", "0"), ("in-process-quiet", f"{REPORT_FREQUENCY_S}s"), ("none-again", None))
# What a sample's stack holds to count in a share: the mutating admission policy plugin; within
# it, CEL (the API server's CEL evaluator, which also turns the object into CEL values, and cel-go);
# within it and outside CEL, applying the policy's patch: a JSON patch (the API server turns the
# whole node into JSON, patches it and decodes it again) or an ApplyConfiguration (structured
# merge diff: the node turned into a typed value, merged, turned back), with the conversion and
# defaulting of the result (the dispatcher's, after the patcher). SMD_FRAMES: the structured merge
# diff part of it.
POLICY_FRAMES = "k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
CEL_FRAMES = ("github.com/google/cel-go/", "k8s.io/apiserver/pkg/admission/plugin/cel.", "k8s.io/apiserver/pkg/cel/")
PATCH_FRAMES = ("k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch.",
                "k8s.io/apiserver/pkg/admission/plugin/policy/mutating.(*dispatcher).dispatchOne")
SMD_FRAMES = ("sigs.k8s.io/structured-merge-diff", "k8s.io/apimachinery/pkg/util/managedfields")


def _pprof(api: Api, seconds: int, into: Path) -> None:
    conn = api.new_conn(timeout=seconds + 60)
    conn.request("GET", f"/debug/pprof/profile?seconds={seconds}", headers=api.headers())
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"pprof: HTTP {r.status}: {data[:300]!r}")
    into.write_bytes(data)


def profile_shares(profile: Path) -> dict:
    """CPU seconds of the whole profile and of its shares (POLICY_FRAMES and the rest above), from
    the samples `go tool pprof -traces` lists."""
    text = subprocess.run(["go", "tool", "pprof", "-traces", str(profile)], capture_output=True, text=True,
                          check=True).stdout
    unit = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0}
    shares = {"total_s": 0.0, "policy_s": 0.0, "cel_s": 0.0, "patch_s": 0.0, "smd_s": 0.0}
    for block in text.split("-----------+-------------------------------------------------------")[1:]:
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        value = lines[0].split()[0] if lines else ""
        number = value.rstrip("nu\u00b5ms")
        if not number or value[len(number):] not in unit:
            continue
        seconds = float(number) * unit[value[len(number):]]
        # A frame by its function's package (a frame's generic type arguments name others).
        frames = [lines[0][len(value):].strip(), *lines[1:]]
        in_frames = lambda *packages: any(f.startswith(packages) for f in frames)  # noqa: E731
        shares["total_s"] += seconds
        if not in_frames(POLICY_FRAMES):
            continue
        shares["policy_s"] += seconds
        if in_frames(*CEL_FRAMES):
            shares["cel_s"] += seconds
        elif in_frames(*PATCH_FRAMES):
            shares["patch_s"] += seconds
            if in_frames(*SMD_FRAMES):
                shares["smd_s"] += seconds
    return shares


def profile_inprocess(binary: Path, patches: int, seconds: int, map_files: dict | None = None) -> list[dict]:
    """Starts its own control plane, with the API server's profiling on (tests/cluster runs it
    off), unless one with profiling on is running. `map_files`: phase -> a hand-written policy
    for it (`inprocess_on`); with them, the in-process phases without one are left out."""
    cluster_started = False
    if subprocess.run([str(KCP), "kubectl", "get", "--raw", "/readyz"], capture_output=True).returncode != 0:
        subprocess.run([str(KCP), "up", "--apiserver-arg=--profiling=true"], check=True)
        cluster_started = True
    elif subprocess.run([str(KCP), "kubectl", "get", "--raw", "/debug/pprof/"], capture_output=True).returncode != 0:
        raise SystemExit(f"a control plane without profiling is running: `{KCP} down` first, and this starts one with it")
    api = Api()
    rows = []
    try:
        inprocess_off()
        node = create_probe_node(api)
        raw = node["status"]["allocatable"]
        for phase, refresh in PROFILE_PHASES:
            if map_files and refresh is not None and phase not in map_files:
                continue
            inprocess_off()
            if refresh is None:
                wait_for("no compiled policy in force", lambda: patch_latencies(api, raw, 1, as_node=True)["mutated"] == 0,
                         timeout=60, interval=1)
            else:
                inprocess_on(binary, refresh, (map_files or {}).get(phase))
                wait_for("the compiled policy to be in force", lambda: patch_latencies(api, raw, 1, as_node=True)["mutated"] == 1,
                         timeout=60, interval=1)
            patch_latencies(api, raw, 50, as_node=True)
            profile = OUT / f"pprof-apiserver-{phase}.pb.gz"
            c0 = control_plane_counters(api)
            # The profile runs beside the PATCHes, which outlast it.
            recorder = threading.Thread(target=_pprof, args=(api, seconds, profile))
            recorder.start()
            lat = patch_latencies(api, raw, patches, as_node=True)
            recorder.join()
            c1 = control_plane_counters(api)
            done = c1["status_patches"] - c0["status_patches"]
            row = {"phase": phase, "patches": done, "p50_ms": lat["p50_ms"], "mutated": lat["mutated"],
                   "cpu_ms_per_patch": (c1["cpu_s"] - c0["cpu_s"]) * 1000 / max(1, done),
                   "profile": str(profile.relative_to(ROOT)), **profile_shares(profile)}
            rows.append(row)
            log(f"{phase}: {done} status PATCHes, p50 {row['p50_ms']:.2f} ms, control plane CPU "
                f"{row['cpu_ms_per_patch']:.2f} ms per PATCH; profile {row['profile']}")
    finally:
        inprocess_off()
        api.request("DELETE", f"/api/v1/nodes/{PROBE_NODE}")
        if cluster_started:
            subprocess.run([str(KCP), "down"], check=False)
    return rows
