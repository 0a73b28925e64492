"""Racing cost-quality audit (SSR §6.5): Racing vs Uniform-Subset selection on a
fixed reward matrix, at validation budgets of 20-60% of the full-matrix cost.

Matrix sources:
  --run RUN_DIR        a run's Parquet ``rollouts`` table (largest complete sub-matrix)
  --generate           the surrogate: 12 children (3 per RER scale) of one parent,
                       every harness run R times on the audit tasks (default): the val
                       split, disjoint from the candidate-generation (train) and test
                       tasks as in the paper (a split overlapping them is refused)

Examples:
  python scripts/racing_audit.py --generate --preset surrogate_swepro --replays 3
  python scripts/racing_audit.py --run runs/2026-01-01_12-00-00 --rollouts 2
  python scripts/racing_audit.py --generate --save m.npz && python scripts/racing_audit.py --load m.npz --replays 20
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--run", help="run directory whose rollouts table holds the matrix")
    src.add_argument("--generate", action="store_true", help="generate the matrix on the surrogate (default)")
    p.add_argument("--preset", default="surrogate_swepro")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-scale", type=int, default=3, help="children per evidence scale (generate)")
    p.add_argument("--rollouts", type=int, default=2, help="R rollouts per (harness, task)")
    p.add_argument("--split", default=None, help="only rollouts of this split (--run)")
    p.add_argument("--parent", default=None, help="parent harness id (--run; default: most complete)")
    p.add_argument("--min-tasks", type=int, default=10)
    p.add_argument("--replays", type=int, default=3, help="task-order replays per budget level")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--budgets", default="0.2,0.3,0.4,0.5,0.6", help="fractions of the full-matrix cost")
    p.add_argument("--embedder", default="packaged", help="sentence-transformers model (generate)")
    p.add_argument("--audit-splits", default="val",
                   help="comma-separated splits the matrix runs on (generate); disjoint from train and test")
    p.add_argument("--save", default=None, help="write the matrix to this .npz file")
    p.add_argument("--load", default=None, help="read the matrix from a .npz file written by --save")
    args = p.parse_args(argv)
    print(f"command: python scripts/racing_audit.py {shlex.join(sys.argv[1:] if argv is None else argv)}")

    from milo_ray.ssr.audit import audit, format_table, generate_surrogate_matrix, matrix_from_rollouts

    if args.load:
        import numpy as np

        from milo_ray.ssr.audit import RewardMatrix

        z = np.load(args.load)
        m = RewardMatrix(tuple(z["harness_ids"].tolist()), tuple(z["task_ids"].tolist()), z["rewards"],
                         tuple(int(x) for x in z["diff_sizes"]))
    elif args.run:
        import pyarrow.dataset as ds

        rows = ds.dataset(os.path.join(args.run, "rollouts"), format="parquet").to_table().to_pylist()
        m = matrix_from_rollouts(rows, rollouts=args.rollouts, parent=args.parent, split=args.split,
                                 min_tasks=args.min_tasks)
    else:
        from milo_ray.agents.embedder import SentenceTransformerEmbedder
        from milo_ray.agents.judges.offline import OfflineJudge
        from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
        from milo_ray.benchmarks.surrogate import SurrogateBenchmark

        bench = SurrogateBenchmark(preset=args.preset, seed=args.seed)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                m = generate_surrogate_matrix(bench, executor=bench.executor_config(),
                                              optimizer=OfflineCandidateOptimizer(), judge=OfflineJudge(),
                                              embedder=SentenceTransformerEmbedder(args.embedder), workdir=tmp,
                                              per_scale=args.per_scale, rollouts=args.rollouts, seed=args.seed,
                                              audit_splits=tuple(args.audit_splits.split(",")))
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
    if args.save:
        import numpy as np

        np.savez(args.save, harness_ids=np.array(m.harness_ids), task_ids=np.array(m.task_ids), rewards=m.rewards,
                 diff_sizes=np.array(m.diff_sizes or (0,) * len(m.harness_ids)))
    q = m.quality()
    print(f"matrix: {len(m.harness_ids)} harnesses (parent + {len(m.harness_ids) - 1} children) x "
          f"{len(m.task_ids)} tasks x {m.rewards.shape[2]} rollouts = {m.full_cost} executions")
    print(f"full-matrix quality: parent {q[0]:.4f}, best {q.max():.4f}, children mean {q[1:].mean():.4f}")
    fractions = [float(x) for x in args.budgets.split(",")]
    print(format_table(audit(m, fractions, replays=args.replays, stages=args.stages, seed=args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
