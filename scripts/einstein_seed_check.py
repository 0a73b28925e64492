"""Measure the seed optimizer programs: for each seed x problem, the start's score, the
returned point's score (re-checked with the benchmark's own scorer), the number of
published points and the seconds taken.

    PYTHONPATH=. python scripts/einstein_seed_check.py --start random --n 400 --budget 3
    PYTHONPATH=. python scripts/einstein_seed_check.py --start alphaevolve --budget 30 \
        --seeds lse_lbfgs ratchet_upsample --problems first_autocorrelation

    PYTHONPATH=. python scripts/einstein_seed_check.py --clock-step 1e-3 --budget 2

Runs sequentially in this process (the programs are plain modules); use the executor
for sandboxed runs. A run's result depends on how many steps fit its budget, i.e. on the
machine's load; ``--clock-step S`` replaces ``time.monotonic`` by a clock that advances S
seconds per call, so a run depends only on the code and is reproducible to the bit (the
``digest`` column: compare two versions of a program or of the runner's helpers).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import time
from pathlib import Path

import numpy as np

from milo_ray.benchmarks.einstein.problems import PROBLEMS, check, score
from milo_ray.benchmarks.einstein.starts import start_values
from milo_ray.boundary.inside.optimizer_runner import load_program

SEEDS_DIR = Path(__file__).resolve().parents[1] / "milo_ray" / "benchmarks" / "einstein" / "seeds"


def load(name: str, problem: str, published: list):
    """The seed loaded as the runner loads it: with the names it is given."""
    return load_program(str(SEEDS_DIR / name / "harness.py"), problem,
                        lambda values: published.append((time.monotonic(), np.array(values, dtype=np.float64))),
                        module_name=f"einstein_seed_{name}")


def main() -> None:
    names = sorted(p.name for p in SEEDS_DIR.iterdir() if (p / "harness.py").is_file())
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", nargs="+", default=names, choices=names)
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    ap.add_argument("--start", default="random", choices=["random", "alphaevolve", "constant"])
    ap.add_argument("--n", type=int, default=0, help="grid points (0: the published length for alphaevolve)")
    ap.add_argument("--perturb", type=float, default=0.0)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock-step", type=float, default=0.0,
                    help="seconds a fake time.monotonic advances per call (0: the real clock)")
    args = ap.parse_args()
    if args.clock_step < 0:
        ap.error(f"--clock-step={args.clock_step}: give 0 (the real clock) or a positive number of seconds")
    if args.clock_step:
        ticks = itertools.count(1)
        time.monotonic = lambda: next(ticks) * args.clock_step
    n = args.n or (0 if args.start == "alphaevolve" else 400)
    print(f"{'seed':18s} {'problem':24s} {'n_in':>6s} {'n_out':>6s} {'start':>14s} {'end':>14s} "
          f"{'published':>9s} {'seconds':>8s} {'digest':>12s}")
    for name in args.seeds:
        for problem in args.problems:
            h0 = start_values({"base": args.start, "n": n, "perturb": args.perturb, "seed": args.seed}, problem)
            published: list = []
            module = load(name, problem, published)
            t0 = time.monotonic()
            out = np.asarray(module.optimize(h0.copy(), seed=args.seed, deadline=t0 + args.budget))
            secs = time.monotonic() - t0
            reason = check(problem, out)
            end = f"{score(problem, out):.10f}" if reason is None else f"INFEASIBLE: {reason}"
            print(f"{name:18s} {problem:24s} {h0.size:6d} {out.size:6d} {score(problem, h0):14.10f} {end:>14s} "
                  f"{len(published):9d} {secs:8.2f} {hashlib.sha256(out.tobytes()).hexdigest()[:12]:>12s}", flush=True)


if __name__ == "__main__":
    main()
