"""What one graded rollout costs on this project's PaperBench and ARE fixtures: grader calls,
grader tokens, the verifier's (judge's) seconds and the whole rollout's wall seconds, median
of N rollouts of the reference solution per setting (bwrap; the scripted grader for
PaperBench, ARE's scripted judge for ARE). Baseline in the same run: each paper's codedev
mode, against which full mode (and full mode with ``reproduce.sh``) is a ratio.

    python scripts/graded_rollout_cost.py             # PaperBench, and ARE when its interpreter exists
    python scripts/graded_rollout_cost.py --n 1 --only are

ARE needs ``MILO_RAY_ARE_PYTHON`` (``scripts/are_env.sh``). A model grader adds its own
latency per call; these figures are the framework's part.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from milo_ray.benchmarks.paperbench import PaperBenchBenchmark  # noqa: E402
from milo_ray.execution.agent_executor import AgentExecutor  # noqa: E402
from milo_ray.tasks.executor import ORACLE  # noqa: E402

PAPERS = REPO / "tests" / "fixtures" / "paperbench" / "papers"
SCENARIOS = REPO / "tests" / "fixtures" / "are"
BWRAP = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}


def measure(task, n: int, grader) -> dict:
    ex = AgentExecutor(agent="oracle", sandbox=BWRAP, scratch_dir=tempfile.mkdtemp(prefix="graded-cost-"),
                       grader=grader)
    judge_s, wall_s, out = [], [], {}
    for i in range(n):
        t0 = time.monotonic()
        r = asyncio.run(ex.aexecute(ORACLE, task, i, 0))
        wall_s.append(time.monotonic() - t0)
        judge_s.append(r.trace["verifier"]["seconds"])
        calls = (r.trace.get("grader") or {}).get("calls") or []
        out = {"score": r.score, "error": r.error, "calls": len(calls),
               "tokens": sum(c["input_tokens"] + c["output_tokens"] for c in calls)}
    return {**out, "judge_s": statistics.median(judge_s), "wall_s": statistics.median(wall_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3, help="rollouts per setting (the median is printed)")
    ap.add_argument("--only", choices=("paperbench", "are"), default=None)
    args = ap.parse_args()
    print(f"{'fixture':22s} {'setting':16s} {'score':>5s} {'grader calls':>12s} {'grader tokens':>13s} "
          f"{'judge s':>8s} {'rollout s':>9s} {'judge s vs codedev':>18s}")
    if args.only in (None, "paperbench"):
        for paper in ("tiny-attention", "tiny-layernorm"):
            base = None
            for label, opts in (("codedev", {}), ("full", {"mode": "full"}),
                                ("full+reproduce", {"mode": "full", "reproduce": True, "reproduce_timeout_s": 120})):
                task = PaperBenchBenchmark(str(PAPERS / paper), splits={"search": 1}, **opts).tasks("search")[0]
                m = measure(task, args.n, {"scripted": True})
                base = base or m["judge_s"]
                print(f"{paper:22s} {label:16s} {m['score']:5.2f} {m['calls']:12d} {m['tokens']:13d} "
                      f"{m['judge_s']:8.2f} {m['wall_s']:9.2f} {m['judge_s'] / base:17.2f}x")
    if args.only in (None, "are"):
        if not os.environ.get("MILO_RAY_ARE_PYTHON"):
            print("ARE: skipped (no MILO_RAY_ARE_PYTHON; run scripts/are_env.sh)")
            return
        from milo_ray.benchmarks.are.benchmark import AREBenchmark

        bench = AREBenchmark(str(SCENARIOS), splits={"search": 1.0})
        for task in bench.tasks("search"):
            m = measure(task, args.n, None)
            print(f"{task.task_id:22s} {'oracle, scripted':16s} {m['score']:5.2f} {m['calls']:12d} {m['tokens']:13d} "
                  f"{m['judge_s']:8.2f} {m['wall_s']:9.2f} {'':>18s}")


if __name__ == "__main__":
    main()
