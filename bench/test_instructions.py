"""The instruction-count guard (bench/instructions.py) and its rendering: a count within 5% of the
committed figure passes, one outside or without a figure fails; wall-clock ratio targets below
their mark are reported as information, not failed. Stdlib only, no valgrind, cluster or build:
part of `make test-unit`.
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import instructions  # noqa: E402
import report  # noqa: E402


class InstructionGuard(unittest.TestCase):
    def test_check(self):
        figures = {"node-55k": 50_000, "pod-4k": 90_000}
        measured = {"payloads": {"node-55k": {"review": 52_400}, "pod-4k": {"review": 94_600}, "binding-cap": {"review": 1}}}
        bad = instructions.check(measured, figures)
        self.assertEqual(len(bad), 2, bad)
        self.assertTrue(bad[0].startswith("pod-4k: 94,600 instructions per review, committed 90,000 (+5.1%"), bad)
        self.assertTrue(bad[1].startswith("binding-cap: no committed figure"), bad)

    def test_markdown_rows(self):
        lines = report.instructions_markdown({"payloads": {"node-55k": {"review": 51_000, "floor": 320_000}}})
        self.assertTrue(any(line.startswith("| node-55k | 51,000 | ") and "| 320,000 |" in line for line in lines), lines)
        skipped = report.instructions_markdown({"skipped": "valgrind not installed"})
        self.assertIn("Not measured in this run (valgrind not installed).\n", skipped)

    def test_wall_clock_targets_are_information(self):
        self.assertTrue(report.verdict("throughput >= 70% of the floor's (55 KB review)", False).startswith("below"))
        self.assertTrue(report.verdict("same, by server CPU per request", False).startswith("below"))
        self.assertEqual(report.verdict("p99 < 2 ms at half of max throughput (55 KB review)", False), "FAIL")
        self.assertEqual(report.verdict("anything", True), "PASS")


if __name__ == "__main__":
    unittest.main()
