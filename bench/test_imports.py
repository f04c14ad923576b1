"""The bench scripts' imports of each other: at the top of each file only, without a cycle, and in
the layers bench/common.py sets (common imports no other bench module; report.py and
apiserver_bench.py only common). Stdlib only, no cluster or build: part of `make test-unit`
(python3 -m unittest discover -s bench -p 'test_*.py').
"""

from __future__ import annotations

import ast
import subprocess
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = {p.stem: p for p in sorted(HERE.glob("*.py")) if not p.stem.startswith("test_")}

# Which bench modules each may import (stdlib aside); a module not named here may import any.
ALLOWED = {
    "common": set(),
    "report": {"common"},
    "apiserver_bench": {"common"},
}


def imported_modules(node: ast.stmt) -> list[str]:
    """Top-level module names an import statement names (`import a.b` -> a; `from a import b` -> a)."""
    if isinstance(node, ast.Import):
        return [a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module.split(".")[0]]
    return []


def bench_imports(path: Path) -> tuple[set[str], list[str]]:
    """(bench modules the file imports anywhere, those imports not made by a statement of the module body)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_nodes = {id(stmt) for stmt in tree.body}
    found = [(node, m) for node in ast.walk(tree) for m in imported_modules(node) if m in FILES]
    nested = [f"{path.name}:{node.lineno} imports {m}" for node, m in found if id(node) not in top_nodes]
    return {m for _, m in found}, nested


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


class BenchImports(unittest.TestCase):
    def setUp(self):
        self.graph: dict[str, set[str]] = {}
        self.nested: list[str] = []
        for name, path in FILES.items():
            self.graph[name], nested = bench_imports(path)
            self.nested += nested

    def test_files_found(self):
        self.assertTrue({"bench", "common", "report", "apiserver_bench"} <= set(FILES), sorted(FILES))

    def test_no_import_of_a_bench_module_below_the_top(self):
        self.assertEqual(self.nested, [], "bench modules imported inside a function, class or block")

    def test_no_cycle(self):
        self.assertIsNone(find_cycle(self.graph), f"import cycle between bench modules; graph {self.graph}")

    def test_layers(self):
        for name, allowed in ALLOWED.items():
            self.assertIn(name, self.graph, f"bench/{name}.py missing")
            self.assertLessEqual(self.graph[name], allowed, f"{name}.py imports {sorted(self.graph[name] - allowed)}")

    def test_each_module_imports(self):
        for name in FILES:
            r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=HERE, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"import {name}: {r.stderr}")

    def test_checker_sees_a_cycle_and_a_nested_import(self):
        self.assertEqual(find_cycle({"a": {"b"}, "b": {"a"}}), ["a", "b", "a"])
        self.assertIsNone(find_cycle({"a": {"b"}, "b": set()}))
        stmt = ast.parse("def f():\n    import report\n")
        self.assertEqual([m for n in ast.walk(stmt) for m in imported_modules(n)], ["report"])


if __name__ == "__main__":
    unittest.main()
