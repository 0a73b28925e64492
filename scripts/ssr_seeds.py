"""Run an SSR experiment over several seeds and print initial vs final quality.

Each seed is one full offline run of the entry point
(``python -m milo_ray.run +experiment=EXP run.seed=S benchmark.seed=S``), so the
search randomness and the simulated task pool both vary. The table reads each
run's ``manifest.json`` summary: true (expected) test quality of the initial and
final harness from the surrogate's ground truth, measured test RR@3, executions
used, rounds and the stop reason.

  python scripts/ssr_seeds.py --experiment ssr_swepro --seeds 0 1 2 3 4
  python scripts/ssr_seeds.py --experiment ssr_swepro --seeds 0 1 2 -- method.evidence=fixed_n
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run_seed(experiment: str, seed: int, root: Path, extra: list[str], vary_benchmark: bool) -> dict:
    run_dir = root / f"{experiment}-seed{seed}"
    argv = [sys.executable, "-m", "milo_ray.run", f"+experiment={experiment}", f"run.seed={seed}",
            f"run.dir={run_dir}", "run.progress=false", *extra]
    if vary_benchmark:
        argv.append(f"benchmark.seed={seed}")
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "manifest.json").read_text())["summary"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="ssr_swepro")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--root", default=None, help="where run directories go (default: a temp dir)")
    p.add_argument("--fixed-benchmark", action="store_true", help="keep benchmark.seed at its configured value")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = p.parse_args(argv)
    root = Path(args.root or tempfile.mkdtemp(prefix="ssr-seeds-"))
    rows = []
    head = (f"{'seed':>4} {'score init':>10} {'score final':>11} {'resolve init':>12} {'resolve final':>13} "
            f"{'RR@3 init':>9} {'RR@3 final':>10} {'execs':>6} {'rounds':>6}  stop")
    print("true = the surrogate's exact expected test quality (score: partial credit; resolve: pass@1)")
    print(head)
    print("-" * len(head))
    for s in args.seeds:
        sm = run_seed(args.experiment, s, root, args.overrides, not args.fixed_benchmark)
        rows.append(sm)
        print(f"{s:>4} {sm['initial_true_quality']:>10.4f} {sm['final_true_quality']:>11.4f} "
              f"{sm['initial_true_resolve']:>12.4f} {sm['final_true_resolve']:>13.4f} "
              f"{sm['test_initial']['rr_at_k']:>9.3f} {sm['test_final']['rr_at_k']:>10.3f} "
              f"{sm['executions_used']:>6} {sm['rounds']:>6}  {sm['stop_reason']}", flush=True)
    for key, label in (("true_quality", "score"), ("true_resolve", "resolve")):
        deltas = [r[f"final_{key}"] - r[f"initial_{key}"] for r in rows]
        print(f"true {label}: improved in {sum(d > 0 for d in deltas)}/{len(rows)} seeds, "
              f"mean delta {sum(deltas) / len(deltas):+.4f}")
    print(f"runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
