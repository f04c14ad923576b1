"""report.render with the binding check (bench.py binding_check): its payload row says what was
decided, its section has kube-overcommit and the floor, and the ratio line names only the floor
(go-webhook has no such check). The API-server section: the in-process targets computed from its
rows (CPU per status PATCH against the quiet webhook and no overcommit, node reviews at the webhook)
and the check that fails a phase on the node reviews its server received. Stdlib only, no cluster
or build: part of `make test-unit`.
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


def apiserver_phase(p50_ms: float, writes_per_node_min: float) -> dict:
    return {"patch": {"p50_ms": p50_ms, "p90_ms": p50_ms, "p99_ms": p50_ms, "mutated": 10, "count": 10},
            "writes": {"per_node_per_minute": writes_per_node_min, "writes": 1, "seconds": 120},
            "webhook_calls": 0, "webhook_mean_ms": None, "server_cpu_s": None,
            "control_plane": {"cpu_s": 12.0, "status_patches": 1000}}


class InProcessQuietRow(unittest.TestCase):
    def test_the_quiet_in_process_phase_has_its_row_and_its_write_rate(self):
        from common import apiserver_markdown
        r = {"nodes": 1000, "probes": 10, "window_s": 120, "update_s": 40, "off": apiserver_phase(4.5, 0.5),
             "in-process": apiserver_phase(6.8, 1.5), "in-process-quiet": apiserver_phase(6.9, 0.55),
             "kube-overcommit": apiserver_phase(6.3, 1.5)}
        text = "\n".join(apiserver_markdown(r))
        self.assertIn("| in-process, quiet heartbeats | 6.90 |", text)
        self.assertIn("0.55 Node writes per node per minute against 0.50 without overcommit (1.10x)", text)



def cpu_phase(cpu_ms_per_patch: float, **extra) -> dict:
    p = apiserver_phase(6.0, 0.5)
    p["control_plane"] = {"cpu_s": cpu_ms_per_patch, "status_patches": 1000}
    p.update(extra)
    return p


class InProcessTargets(unittest.TestCase):
    def run_of(self, inproc: float, webhook: float, off: float, reviews: int | None = 0, calls: int = 0) -> dict:
        return {"nodes": 30, "probes": 10, "window_s": 60, "update_s": 10, "probe_as_node": True, "off": cpu_phase(off),
                "in-process-quiet": cpu_phase(inproc, webhook_node_reviews=reviews, webhook_calls=calls),
                "kube-overcommit-quiet": cpu_phase(webhook, webhook_node_reviews=400, webhook_calls=2000)}

    def test_verdicts(self):
        from common import inprocess_targets
        cases = [  # in-process, webhook, off CPU ms per PATCH; reviews, calls -> PASS/FAIL of the three targets
            ((11.0, 12.0, 10.0, 0, 0), [True, True, True]),
            ((12.0, 12.0, 10.5, 0, 0), [True, True, True]),    # equal to the webhook's; +14% over none
            ((12.1, 12.0, 10.0, 0, 0), [False, False, True]),  # above the webhook's; +21% over none
            ((11.6, 12.0, 10.0, 0, 0), [True, False, True]),   # +16% over none
            ((11.0, 12.0, 10.0, 3, 3), [True, True, False]),   # the hop is still there
            ((11.0, 12.0, 10.0, 0, 1), [True, True, False]),   # the API server's witness disagrees
        ]
        for (inproc, webhook, off, reviews, calls), want in cases:
            got = [ok for _, _, ok in inprocess_targets(self.run_of(inproc, webhook, off, reviews, calls))]
            self.assertEqual(got, want, (inproc, webhook, off, reviews, calls))

    def test_not_measured_and_old_runs(self):
        from common import inprocess_targets
        self.assertEqual(inprocess_targets({"off": cpu_phase(10.0)}), [])
        r = self.run_of(11.0, 12.0, 10.0, reviews=None)
        del r["kube-overcommit-quiet"]["control_plane"]
        got = inprocess_targets(r)
        self.assertEqual([ok for _, _, ok in got], [None, True, None])
        self.assertIn("not counted", got[2][1])

    def test_rendered_with_the_review_column(self):
        from common import apiserver_markdown
        text = "\n".join(apiserver_markdown(self.run_of(11.0, 12.0, 10.0)))
        self.assertIn("| in-process control plane CPU per status PATCH at or below the webhook's (quiet heartbeats on in both) | "
                      "11.00 against 12.00 ms (-8%) | PASS |", text)
        self.assertIn("within 15% of no overcommit | 11.00 against 10.00 ms (+10%) | PASS |", text)
        self.assertIn("| node reviews at the webhook during the in-process phase (every node is served in-process) | 0 (", text)
        row = next(line for line in text.splitlines() if line.startswith("| in-process, quiet heartbeats |"))
        self.assertEqual(row.split(" | ")[7:9], ["0", "0"])  # API server's calls, node reviews at kube-overcommit
        self.assertIn("written as the node", text)


class PhaseReviews(unittest.TestCase):
    def test_in_process_phase_fails_on_any_node_review(self):
        import apiserver_bench
        wrong = apiserver_bench.reviews_wrong
        self.assertIsNone(wrong("in-process-quiet", 0, 0, 400))
        self.assertIn("the webhook received 3 node reviews", wrong("in-process-quiet", 3, 3, 400))
        self.assertIn("received None node reviews", wrong("in-process-quiet", None, 0, 400))  # not counted: fails too
        self.assertIsNone(wrong("kube-overcommit", 520, 520, 400))
        self.assertIn("answered 12 node reviews", wrong("kube-overcommit-quiet", 12, 420, 400))
        self.assertIsNone(wrong("go-webhook", None, 420, 400))
        self.assertIsNone(wrong("off", None, 0, 400))

if __name__ == "__main__":
    unittest.main()
