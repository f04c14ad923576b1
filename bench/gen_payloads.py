#!/usr/bin/env python3
"""Build the benchmark AdmissionReviews from real objects of the local control plane.

Needs a running tests/cluster control plane (`tests/cluster/kcp.sh up`). For each node size it
starts a fake kubelet (`kcp.sh fake-nodes`) with the given number of images, waits for its Node,
optionally adds attached volumes to its status the way the attach/detach controller and the
kubelet report them, GETs the stored Node (managedFields included) and builds the nodes/status
UPDATE review the API server would send on the kubelet's next status write:
  oldObject = the stored Node, in the steady state of an overcommitted node (allocatable as the
              webhook wrote it, the overcommit.dev annotations present);
  object    = the Node after the kubelet's status patch (its own, raw allocatable again and fresh
              condition heartbeats), which the webhook has to inflate again.
The pod review is the CREATE of a real pod created in the cluster, as admission sees it (defaults
applied, no uid/resourceVersion/status yet).

Usage: gen_payloads.py --out DIR [--kcp tests/cluster/kcp.sh] [--only node-10k,...]
Python 3.11, stdlib only.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import uuid
from fractions import Fraction
from pathlib import Path

from common import HERE, KCP, quantity, wait_for

# The policy of bench/policy.yaml (kept in sync by hand; the equivalence check would catch drift
# only in the servers' answers, so the generator asserts the file says the same).
POLICY_NAME = "bench"
NODE_RATIOS = {"cpu": "1.5", "memory": "1.2", "pods": "2"}

# name -> (images, attached volumes). Sizes are of the whole review (object + oldObject).
# The fake kubelet's image entries are ~210 bytes; a real node's 50 images (longer registry
# paths, several tags each) plus its larger managedFields and labels make a ~55 KB review, which
# here takes 115 fake images: same shape of work, same bytes.
NODE_SHAPES = {
    "node-10k": (6, 0),
    "node-55k": (115, 0),
    "node-200k": (300, 150),
}


def log(msg: str) -> None:
    print(f"gen_payloads: {msg}", file=sys.stderr, flush=True)


class Kcp:
    def __init__(self, script: Path):
        self.script = script

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        r = subprocess.run([str(self.script), "kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def get_raw(self, path: str) -> dict | None:
        r = subprocess.run([str(self.script), "kubectl", "get", "--raw", path], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            if "NotFound" in r.stderr or "not found" in r.stderr:
                return None
            raise RuntimeError(f"GET {path}: {r.stderr.strip()}")
        return json.loads(r.stdout)


def format_quantity(resource: str, value: Fraction) -> str:
    if resource == "cpu":
        milli = int(value * 1000)
        return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
    n = int(value)
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return f"{n // 1024}Ki" if n % 1024 == 0 else str(n)
    return str(n)


def inflate(raw: dict, ratios: dict) -> dict:
    """floor(raw x ratio): cpu to whole millicores, the rest to whole units."""
    out = {}
    for res, text in raw.items():
        if res not in ratios:
            out[res] = text
            continue
        v = quantity(text) * Fraction(ratios[res])
        if res == "cpu":
            v = Fraction(int(v * 1000), 1000)
        else:
            v = Fraction(int(v))
        out[res] = format_quantity(res, v)
    return out


def rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def listed(pairs: dict) -> str:
    """The product's listed annotation format: name=value pairs joined by ",", sorted."""
    return ",".join(f"{k}={v}" for k, v in sorted(pairs.items()))


def node_review(stored: dict) -> dict:
    raw = stored["status"]["allocatable"]
    old = copy.deepcopy(stored)
    ann = old["metadata"].setdefault("annotations", {})
    # As the product writes it: the kubelet's value of each inflated resource only.
    inflated = {k: v for k, v in raw.items() if k in NODE_RATIOS}
    ann["overcommit.dev/raw-allocatable"] = listed(inflated)
    ann["overcommit.dev/applied"] = f"policy={POLICY_NAME};ratios={listed(NODE_RATIOS)}"
    old["status"]["allocatable"] = inflate(raw, NODE_RATIOS)

    new = copy.deepcopy(old)
    new["status"]["allocatable"] = dict(raw)
    beat = rfc3339(dt.datetime.now(dt.timezone.utc))
    for cond in new["status"].get("conditions", []):
        cond["lastHeartbeatTime"] = beat
    name = stored["metadata"]["name"]
    gvk = {"group": "", "version": "v1", "kind": "Node"}
    gvr = {"group": "", "version": "v1", "resource": "nodes"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk, "resource": gvr, "subResource": "status",
            "requestKind": gvk, "requestResource": gvr, "requestSubResource": "status",
            "name": name,
            "operation": "UPDATE",
            "userInfo": {"username": f"system:node:{name}", "groups": ["system:nodes", "system:authenticated"]},
            "object": new,
            "oldObject": old,
            "dryRun": False,
            "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def attach_volumes(kcp: Kcp, name: str, count: int) -> None:
    vols = [f"kubernetes.io/csi/ebs.csi.aws.com^vol-{uuid.UUID(int=i + 1).hex[:17]}" for i in range(count)]
    patch = {"status": {
        "volumesInUse": vols,
        "volumesAttached": [{"name": v, "devicePath": f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{v[-17:]}"} for v in vols],
    }}
    kcp.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(patch))


def real_node(kcp: Kcp, payload: str, images: int, volumes: int) -> dict:
    prefix = f"bench-{payload}"
    name = f"{prefix}-0"
    cmd = [str(kcp.script), "fake-nodes", "--count", "1", "--prefix", prefix, "--images", str(images),
           "--cpu", "16", "--memory", "64Gi", "--allocatable-cpu", "15890m", "--allocatable-memory", "62Gi",
           "--run-pods=false", "--delete-on-exit"]
    log(f"{payload}: starting a fake kubelet with {images} images")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        def registered():
            if proc.poll() is not None:
                raise RuntimeError(f"fake-nodes exited: {proc.stderr.read() if proc.stderr else ''}")
            n = kcp.get_raw(f"/api/v1/nodes/{name}")
            return n if n and len(n.get("status", {}).get("images") or []) == images and n["status"].get("conditions") else None
        wait_for(f"node {name}", registered, timeout=120)
        if volumes:
            attach_volumes(kcp, name, volumes)
            wait_for(f"volumes on {name}", lambda: len((kcp.get_raw(f"/api/v1/nodes/{name}") or {}).get("status", {}).get("volumesAttached") or []) == volumes)
        return kcp.get_raw(f"/api/v1/nodes/{name}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


BENCH_NAMESPACE = "bench-apps"

POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {
        "name": "bench-web-7d4b9c8f6d-x2k9p", "namespace": BENCH_NAMESPACE,
        "labels": {"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "bench", "pod-template-hash": "7d4b9c8f6d"},
    },
    "spec": {
        "initContainers": [{
            "name": "migrate", "image": "registry.example.invalid/bench/web:v1.42.0",
        }],
        "containers": [
            {
                "name": "web", "image": "registry.example.invalid/bench/web:v1.42.0",
                "ports": [{"name": "http", "containerPort": 8080}],
                "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}],
            },
            {
                "name": "sidecar", "image": "registry.example.invalid/bench/proxy:v2.1.3",
            },
        ],
        "volumes": [{"name": "config", "configMap": {"name": "web-config"}}],
    },
}


def real_pod(kcp: Kcp) -> dict:
    kcp.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BENCH_NAMESPACE}}))
    # The ServiceAccount admission plugin needs the namespace's default ServiceAccount.
    wait_for("the default ServiceAccount", lambda: kcp.get_raw(f"/api/v1/namespaces/{BENCH_NAMESPACE}/serviceaccounts/default"))
    name = POD["metadata"]["name"]
    kcp.kubectl("delete", "pod", "-n", BENCH_NAMESPACE, name, "--ignore-not-found", "--wait=false", "--grace-period=0", "--force")
    wait_for("the old bench pod to go", lambda: kcp.get_raw(f"/api/v1/namespaces/{BENCH_NAMESPACE}/pods/{name}") is None)
    kcp.kubectl("create", "-f", "-", stdin=json.dumps(POD))
    pod = kcp.get_raw(f"/api/v1/namespaces/{BENCH_NAMESPACE}/pods/{name}")
    kcp.kubectl("delete", "pod", "-n", BENCH_NAMESPACE, name, "--wait=false", "--grace-period=0", "--force")
    # As mutating admission sees a CREATE: defaulted, before uid/resourceVersion/status are set.
    meta = pod["metadata"]
    for k in ("uid", "resourceVersion", "creationTimestamp", "generation"):
        meta.pop(k, None)
    pod["spec"].pop("nodeName", None)
    pod["status"] = {}
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": name, "namespace": BENCH_NAMESPACE, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]},
            "object": pod, "oldObject": None, "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kube-controller-manager"},
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--kcp", type=Path, default=KCP)
    ap.add_argument("--only", default="", help="comma-separated subset of node-10k,node-55k,node-200k,pod-4k")
    args = ap.parse_args()
    policy_text = (HERE / "policy.yaml").read_text()
    for res, ratio in NODE_RATIOS.items():
        if f'{res}: "{ratio}"' not in policy_text:
            raise SystemExit(f"bench/policy.yaml does not say {res}: \"{ratio}\"")
    kcp = Kcp(args.kcp)
    wait_for("the API server", lambda: kcp.kubectl("get", "--raw", "/readyz").strip() == "ok", timeout=30)
    wanted = [w for w in args.only.split(",") if w] or [*NODE_SHAPES, "pod-4k"]
    args.out.mkdir(parents=True, exist_ok=True)
    for payload in wanted:
        if payload in NODE_SHAPES:
            review = node_review(real_node(kcp, payload, *NODE_SHAPES[payload]))
        elif payload == "pod-4k":
            review = real_pod(kcp)
        else:
            raise SystemExit(f"unknown payload {payload}")
        text = json.dumps(review, separators=(",", ":"))
        (args.out / f"{payload}.json").write_text(text)
        log(f"{payload}: {len(text)} bytes -> {args.out / (payload + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
