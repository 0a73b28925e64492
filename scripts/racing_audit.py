"""Racing cost-quality audit (SSR §6.5): every racing rule against the uniform subset on
fixed reward matrices, scored by true quality, at 20/40/60% of the full-matrix cost.

Matrix sources (one audit pools all the matrices it is given):
  --generate (default)  the surrogate, one matrix per --seeds entry: the SSR experiment's
                        parent (stock, calibrated to stock) and 12 children (3 per RER
                        scale) run R=2 times on the preset's 160-task audit split
                        (disjoint from train, val and test); truth = each harness's exact
                        expected score on the test split
  --regimes a,b         synthetic matrices with a documented generator and known truth
                        (milo_ray/ssr/audit_regimes.py), one per seed, per regime
  --run RUN_DIR         a run's Parquet rollouts table (largest complete sub-matrix),
                        scored by the run's other executions of the same harnesses
                        (--held-out-split, never the selection cells); the table goes
                        to RUN_DIR/racing_audit.parquet, where the run's report plots it
  --load a.npz,b.npz    matrices written by --save-dir

Rules: uniform subset, successive halving (K=2, the paper's), halving (K=4), paired
elimination, successive halving with the parent-replacement gate, paired successive
rejects, the successive-elimination bandit and low-rank racing (racing_*.py), the last
also fitted with the matrix's history as earlier races' rows ("lowrank+prior").

Task draws (--draws): every rule also races with the discriminative draw (label
"<rule>+disc"): each replay's tasks ordered by the pass rates of an earlier population
on them (the matrix's history, never a selection cell: on the surrogate the preset's
seed harnesses, --history-rollouts executions each per task at rollout indices from 100;
synthetic matrices carry their own), the tasks passed at an intermediate rate first.

Each matrix gets --replays task orders shared by every rule (paired differences).
The table gives true regret in points (mean ± SE across matrices), the paired
difference to the uniform subset (± SE across matrices), the in-sample regret
(selection scored on the matrix itself, labelled), actual spend, how often the truly
best child survives to the decision, and how often the pick is truly worse than the
parent. --parquet writes the same rows (per matrix and summary).

Examples:
  python scripts/racing_audit.py --seeds 0-4 --save-dir audit_matrices --parquet racing_audit.parquet
  python scripts/racing_audit.py --regimes near_tied,surrogate_like,wide,bimodal --seeds 0-9
  python scripts/racing_audit.py --run runs/2026-01-01_12-00-00 --held-out-split test
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


def _generate(args, seeds):
    from milo_ray.agents.embedder import SentenceTransformerEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.audit import generate_surrogate_matrix, seed_history

    embedder = SentenceTransformerEmbedder(args.embedder)
    for seed in seeds:
        bench = SurrogateBenchmark(preset=args.preset, seed=seed, calibrate_to=args.calibrate_to or None,
                                   audit_split=True)
        parent = next((h for h in bench.seed_harnesses() if h.name == args.parent), None) if args.parent else None
        if args.parent and parent is None:
            raise ValueError(f"--parent {args.parent!r}: not a seed harness of {args.preset}")
        with tempfile.TemporaryDirectory() as tmp:
            m = generate_surrogate_matrix(bench, executor=bench.executor_config(), optimizer=OfflineCandidateOptimizer(),
                                          judge=OfflineJudge(), embedder=embedder, workdir=tmp,
                                          per_scale=args.per_scale, rollouts=args.rollouts, seed=seed, parent=parent,
                                          audit_splits=tuple(args.audit_splits.split(",")) if args.audit_splits else None)
        if args.history_rollouts:
            m = seed_history(m, bench, executor=bench.executor_config(), rollouts=args.history_rollouts, seed=seed)
        yield f"{args.preset}-seed{seed}", m


def _with_history(args, name, m):
    """A loaded surrogate matrix (named <preset>-seed<N>) without a history gets the
    preset's seed harnesses run on its tasks; any other matrix is returned as it is."""
    if m.history is not None or not args.history_rollouts or "-seed" not in name:
        return m
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.audit import seed_history

    preset, _, seed = name.rpartition("-seed")
    bench = SurrogateBenchmark(preset=preset, seed=int(seed), calibrate_to=args.calibrate_to or None,
                               audit_split=True)
    return seed_history(m, bench, executor=bench.executor_config(), rollouts=args.history_rollouts, seed=int(seed))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--generate", action="store_true", help="generate matrices on the surrogate (default)")
    src.add_argument("--regimes", default=None, help="synthetic regimes (comma-separated; see audit_regimes.py)")
    src.add_argument("--run", help="run directory whose rollouts table holds the matrix")
    src.add_argument("--load", default=None, help="comma-separated .npz matrices written by --save-dir")
    p.add_argument("--preset", default="surrogate_swepro")
    p.add_argument("--calibrate-to", default="stock", help="surrogate calibration seed ('' = best seed)")
    p.add_argument("--parent", default="stock", help="parent seed harness (generate; '' = the first seed)")
    p.add_argument("--seeds", default="0-4", help="matrix seeds, e.g. 0-4 or 0,3,7")
    p.add_argument("--per-scale", type=int, default=3, help="children per evidence scale (generate)")
    p.add_argument("--rollouts", type=int, default=2, help="R rollouts per (harness, task)")
    p.add_argument("--audit-splits", default=None, help="splits the matrix runs on (generate; default: audit)")
    p.add_argument("--split", default=None, help="only rollouts of this split (--run)")
    p.add_argument("--parent-id", default=None, help="parent harness id (--run; default: most complete)")
    p.add_argument("--held-out-split", default=None, help="split whose rollouts score the selections (--run)")
    p.add_argument("--min-tasks", type=int, default=10)
    p.add_argument("--replays", type=int, default=500, help="task-order replays per matrix (>= 500 for a report)")
    p.add_argument("--budgets", default="0.2,0.4,0.6", help="fractions of the full-matrix cost")
    p.add_argument("--paired-alpha", type=float, default=0.05)
    p.add_argument("--paired-block", type=int, default=5, help="paired: tasks per stage")
    p.add_argument("--gate-alpha", type=float, default=0.1, help="the gated rule's parent-replacement level")
    p.add_argument("--rejects-stages", type=int, default=4, help="paired_rejects: K stages of its schedule")
    p.add_argument("--bandit-delta", type=float, default=0.1, help="bandit: elimination level delta")
    p.add_argument("--lowrank-rank", type=int, default=1, help="lowrank: interaction rank")
    p.add_argument("--lowrank-z", type=float, default=2.5, help="lowrank: elimination threshold in SEs")
    p.add_argument("--draws", default="uniform,discriminative",
                   help="task draws every rule races with (uniform; discriminative needs a matrix history)")
    p.add_argument("--history-rollouts", type=int, default=1,
                   help="executions per task of each seed harness in a surrogate matrix's history (0: none)")
    p.add_argument("--target-fraction", type=float, default=0.2,
                   help="budget at which rules are judged against successive halving and the full matrix")
    p.add_argument("--embedder", default="packaged", help="sentence-transformers model (generate)")
    p.add_argument("--save-dir", default=None, help="write each matrix to DIR/<name>.npz")
    p.add_argument("--parquet", default=None, help="write the per-matrix and summary rows to this Parquet file")
    args = p.parse_args(argv)
    print(f"command: python scripts/racing_audit.py {shlex.join(sys.argv[1:] if argv is None else argv)}")

    from milo_ray.ssr.audit import RewardMatrix, held_out_from_rollouts, matrix_from_rollouts
    from milo_ray.ssr.audit_replay import RuleSpec
    from milo_ray.ssr.audit_table import (audit_matrix, format_spreads, format_table, summarize, verdict,
                                          versus_reference, write_parquet)

    seeds = _seeds(args.seeds)
    groups: list[tuple[str, Any]]  # one table per group (a regime, or the matrices given)
    if args.load:
        matrices = ((n, _with_history(args, n, RewardMatrix.load(f)))
                    for f in args.load.split(",") for n in [os.path.basename(f).removesuffix(".npz")])
    elif args.regimes:
        from milo_ray.ssr.audit_regimes import synthetic_matrix

        def regime(r: str):  # binds r now: a generator expression would read it when consumed
            return ((f"{r}-seed{s}", synthetic_matrix(r, seed=s, rollouts=args.rollouts)) for s in seeds)

        groups = [(r, regime(r)) for r in args.regimes.split(",")]
    elif args.run:
        import pyarrow.dataset as ds

        rows = ds.dataset(os.path.join(args.run, "rollouts"), format="parquet").to_table().to_pylist()
        m = matrix_from_rollouts(rows, rollouts=args.rollouts, parent=args.parent_id, split=args.split,
                                 min_tasks=args.min_tasks)
        matrices = iter([(os.path.basename(os.path.normpath(args.run)),
                          held_out_from_rollouts(m, rows, split=args.held_out_split))])
    else:
        matrices = _generate(args, seeds)
    if not args.regimes:
        groups = [(args.load or args.run or args.preset, matrices)]
    rules = (RuleSpec("uniform", "uniform", stages=1),
             RuleSpec("successive_halving", "successive_halving", stages=2),
             RuleSpec("halving_k4", "halving", stages=4),
             RuleSpec("paired", "paired", block=args.paired_block, alpha=args.paired_alpha),
             RuleSpec("successive_halving+gate", "successive_halving", stages=2, replace_alpha=args.gate_alpha),
             RuleSpec("paired_rejects", "paired_rejects", stages=args.rejects_stages, alpha=args.paired_alpha),
             RuleSpec("bandit", "bandit", block=args.paired_block, alpha=args.bandit_delta),
             RuleSpec("lowrank", "lowrank", block=args.paired_block, rank=args.lowrank_rank, z=args.lowrank_z),
             RuleSpec("lowrank+prior", "lowrank", block=args.paired_block, rank=args.lowrank_rank, z=args.lowrank_z,
                      prior=True))
    if args.run:  # a run's matrix has no history for the prior
        rules = rules[:-1]
    from dataclasses import replace

    draws = [d for d in args.draws.split(",") if d]
    if args.run and draws != ["uniform"]:
        print("note: a run's matrix has no history to draw by; --draws uniform only")
        draws = ["uniform"]
    rules = tuple(replace(r, label=r.label if d == "uniform" else f"{r.label}+{d[:4]}", draw=d)
                  for d in draws for r in rules)
    fractions = [float(x) for x in args.budgets.split(",")]
    all_matrix, all_summary = [], []
    for group, matrices in groups:
        per_matrix = []
        t0 = time.perf_counter()
        try:
            for k, (name, m) in enumerate(matrices):
                if args.save_dir:
                    os.makedirs(args.save_dir, exist_ok=True)
                    m.save(os.path.join(args.save_dir, f"{name}.npz"))
                per_matrix += audit_matrix(m, fractions=fractions, rules=rules, replays=args.replays, seed=k,
                                           label=name)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        summary = summarize(per_matrix)
        n = len({r["matrix"] for r in per_matrix})
        print(f"\n== {group}: {n} matrices, {args.replays} task-order replays each "
              f"({time.perf_counter() - t0:.1f} s incl. generation)")
        print(format_spreads(per_matrix))
        print("true regret in points (mean ± SE across matrices); '- uniform': paired difference to the uniform "
              "subset at the same budget; in-sample: the same selections scored on the matrix itself")
        print(format_table(summary))
        print(verdict(summary))
        if args.target_fraction in fractions:
            print(versus_reference(per_matrix, fraction=args.target_fraction))
        all_matrix += [{"group": group, **r} for r in per_matrix]
        all_summary += [{"group": group, **r} for r in summary]
    if args.run and not args.parquet:  # where the run's report finds it (milo_ray/ssr/figures.py)
        args.parquet = os.path.join(args.run, "racing_audit.parquet")
    if args.parquet:
        write_parquet(args.parquet, all_matrix, all_summary)
        print(f"wrote {args.parquet}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
