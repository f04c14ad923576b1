"""report.render with the binding check (bench.py binding_check): its payload row says what was
decided, its section has kube-overcommit and the floor, and the ratio line names only the floor
(go-webhook has no such check). Stdlib only, no cluster or build: part of `make test-unit`.
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
from common import BINDING_PAYLOAD  # noqa: E402

MACHINE = {"date": "2026-01-01", "nproc": 2, "cpu": "test", "memory": "1 GiB", "kernel": "6", "loadavg": ["0", "0", "0"],
           "rustc": "rustc", "go": "go", "oha": "oha"}


def step(rps: float, p99: float, fraction: float | None = None) -> dict:
    r = {"rps": rps, "p50_ms": 0.2, "p99_ms": p99, "p999_ms": p99 * 2, "cpu_s_per_1k": 0.05, "conns": 16, "round": 0,
         "target_rate": rps, "whole_p99_ms": p99, "machine": {"others_cpu_ms_per_s": 10, "steal_ms_per_s": 0}}
    if fraction is not None:
        r["fraction"] = fraction
    return r


def payload_result(rps: float, half_p99: float) -> dict:
    half = step(rps / 2, half_p99, 0.5)
    return {"closed": [step(rps, 3.0)], "max": step(rps, 3.0), "rates": [half], "half_max": half}


class BindingRows(unittest.TestCase):
    def test_binding_payload_renders_beside_the_floor(self):
        results = {
            "machine": MACHINE,
            "payloads": {BINDING_PAYLOAD: {"bytes": 866, "essence": {
                "decision": "allowed", "node": "bench-capped", "raw cpu": "64", "cap": "110%",
                "bound": "40 pods, 40 cpu", "pod": "500m", "reviews": 12345}}},
            "servers": {"kube-overcommit": {"payloads": {BINDING_PAYLOAD: payload_result(20000, 0.61)}},
                        "floor": {"payloads": {BINDING_PAYLOAD: payload_result(25000, 0.42)}}},
        }
        md = report.render(results)
        self.assertIn(f"## {BINDING_PAYLOAD}", md)
        self.assertIn("pods/binding of a pending pod asking cpu 500m to node bench-capped", md)
        self.assertIn("12,345 reviews", md)
        self.assertIn("kube-overcommit / floor: **80%**", md)
        self.assertNotIn("kube-overcommit / go-webhook", md)
        self.assertIn("**0.61**", md)
        self.assertIn("**0.42**", md)


if __name__ == "__main__":
    unittest.main()
