"""Measure one seed optimizer program on one start: the best published score against
time, so that programs (and CONFIG settings) are compared at several budgets with one
run each.

    OMP_NUM_THREADS=1 PYTHONPATH=. nice -n 5 python scripts/einstein_seed_measure.py \
        --seed-program slp_polish --problem erdos_minimum_overlap --budget 120 --set upsample_factor=8

Prints the start's score, then the best score reached by 10, 30, 60, 120, 300 s (those
within the budget) and at the end, each re-checked with the benchmark's own scorer.
"""

from __future__ import annotations

import argparse
import ast
import time

import numpy as np

from milo_ray.benchmarks.einstein.problems import PROBLEMS, check, score
from milo_ray.benchmarks.einstein.starts import start_values

from einstein_seed_check import SEEDS_DIR, load  # noqa: E402  (scripts/ is on sys.path when run as a script)

CHECKPOINTS_S = (10.0, 30.0, 60.0, 120.0, 300.0)


def parse_override(text: str) -> tuple[str, float | int]:
    key, sep, raw = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected key=number")
    value = ast.literal_eval(raw)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"--set {key}: {raw!r} is not a number")
    return key, value


def main() -> None:
    names = sorted(p.name for p in SEEDS_DIR.iterdir() if (p / "harness.py").is_file())
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-program", required=True, choices=names)
    ap.add_argument("--problem", required=True, choices=list(PROBLEMS))
    ap.add_argument("--start", default="alphaevolve", choices=["random", "alphaevolve", "constant"])
    ap.add_argument("--n", type=int, default=0, help="grid points (0: the published length for alphaevolve)")
    ap.add_argument("--perturb", type=float, default=0.0)
    ap.add_argument("--budget", type=float, default=60.0, help="seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", type=parse_override, action="append", default=[], metavar="KEY=NUMBER",
                    help="override a CONFIG entry of the program (repeatable)")
    args = ap.parse_args()
    n = args.n or (0 if args.start == "alphaevolve" else 400)
    h0 = start_values({"base": args.start, "n": n, "perturb": args.perturb, "seed": args.seed}, args.problem)
    published: list = []
    module = load(args.seed_program, args.problem, published)
    for key, value in args.set:
        if key not in module.CONFIG:
            raise SystemExit(f"--set {key}: not a CONFIG entry of {args.seed_program} ({sorted(module.CONFIG)})")
        module.CONFIG[key] = type(module.CONFIG[key])(value)
    t0 = time.monotonic()
    out = np.asarray(module.optimize(h0.copy(), seed=args.seed, deadline=t0 + args.budget))
    secs = time.monotonic() - t0
    best = score(args.problem, h0)
    print(f"{args.seed_program} {args.problem} start={args.start} n={h0.size} budget={args.budget:g}s "
          f"overrides={dict(args.set)}")
    print(f"  start        {best:.10f}")
    marks = [c for c in CHECKPOINTS_S if c < args.budget]
    i = 0
    for t, values in published:
        while i < len(marks) and t - t0 > marks[i]:
            print(f"  by {marks[i]:5.0f} s   {best:.10f}")
            i += 1
        if check(args.problem, values) is None:
            best = min(best, score(args.problem, values))
    for mark in marks[i:]:
        print(f"  by {mark:5.0f} s   {best:.10f}")
    reason = check(args.problem, out)
    end = f"{score(args.problem, out):.10f}" if reason is None else f"INFEASIBLE: {reason}"
    print(f"  end {secs:6.1f} s {end}  (n_out={out.size}, {len(published)} published)")


if __name__ == "__main__":
    main()
