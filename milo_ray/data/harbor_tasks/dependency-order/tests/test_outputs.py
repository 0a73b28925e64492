import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, "/app")
from deps.resolver import CycleError, build_order  # noqa: E402

PROJECT_ORDER = ["assets", "config", "crypto", "log", "db", "auth", "api", "cli", "queue", "ui", "app", "worker"]


def cli(graph):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g.json")
        with open(path, "w") as f:
            json.dump(graph, f)
        return subprocess.run([sys.executable, "-m", "deps", path], cwd="/app", capture_output=True, text=True)


class TestBuildOrder(unittest.TestCase):
    def test_chain_and_smallest_first(self):
        self.assertEqual(build_order({"c": ["b"], "b": ["a"]}), ["a", "b", "c"])
        self.assertEqual(build_order({"z": [], "y": [], "b": ["z"], "a": ["y"]}), ["y", "a", "z", "b"])

    def test_dependency_only_nodes_and_duplicates(self):
        graph = {"app": ["lib", "lib", "core"], "lib": ["core"]}
        before = copy.deepcopy(graph)
        self.assertEqual(build_order(graph), ["core", "lib", "app"])
        self.assertEqual(graph, before)
        self.assertEqual(build_order({}), [])

    def test_cycle_error(self):
        with self.assertRaises(CycleError) as ctx:
            build_order({"a": ["b"], "b": ["c"], "c": ["a"], "d": [], "e": ["a"], "f": ["e"], "g": ["d"]})
        self.assertIsInstance(ctx.exception, ValueError)
        self.assertEqual(ctx.exception.nodes, ["a", "b", "c", "e", "f"])

    def test_self_dependency(self):
        with self.assertRaises(CycleError) as ctx:
            build_order({"x": ["x"], "y": []})
        self.assertEqual(ctx.exception.nodes, ["x"])

    def test_random_against_reference(self):
        rng = random.Random(9)
        for _ in range(150):
            names = [f"n{i}" for i in range(rng.randint(1, 25))]
            rng.shuffle(names)
            graph = {n: rng.sample(names[:i], rng.randint(0, min(i, 3))) for i, n in enumerate(names)}
            order = build_order(graph)
            done = set()
            expected = []
            while len(expected) < len(names):
                nxt = min(n for n in names if n not in done and set(graph[n]) <= done)
                expected.append(nxt)
                done.add(nxt)
            self.assertEqual(order, expected)

    def test_large_chain(self):
        graph = {f"m{i:05d}": [f"m{i - 1:05d}"] for i in range(1, 20000)}
        start = time.perf_counter()
        order = build_order(graph)
        self.assertEqual(order, [f"m{i:05d}" for i in range(20000)])
        self.assertLess(time.perf_counter() - start, 5.0)


class TestCliAndOutput(unittest.TestCase):
    def test_cli_prints_order(self):
        proc = cli({"b": ["a"], "c": []})
        self.assertEqual((proc.returncode, proc.stdout), (0, "a\nb\nc\n"), proc.stderr[-1000:])

    def test_cli_reports_cycle(self):
        proc = cli({"b": ["a"], "a": ["b"], "c": ["b"], "d": []})
        self.assertEqual((proc.returncode, proc.stderr.strip().splitlines()[-1:]), (1, ["cycle: a,b,c"]))

    def test_project_order_file(self):
        self.assertEqual(Path("/app/project/order.txt").read_text(), "\n".join(PROJECT_ORDER) + "\n")


if __name__ == "__main__":
    unittest.main()
