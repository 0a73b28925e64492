"""Run an SSR experiment over several seeds and print initial vs final quality.

Each seed is one full offline run of the entry point, all of them one sweep on the
``ray_jobs`` launcher (one Ray job, with its own driver, per seed, several at once):
``python -m milo_ray.run -m hydra/launcher=ray_jobs +experiment=EXP run.seed=S1,S2,...
'benchmark.seed=${run.seed}' run.dir=<root>``, so the search randomness and the simulated
task pool both vary. The launcher starts its own Ray head for the sweep
(``execution.join_running=false``), so a ``ray start`` instance someone else runs on the
same machine is never joined, and stops it at the end. The table reads each
run's ``manifest.json`` summary: true (expected) test quality of the initial and
final harness from the surrogate's ground truth, measured test RR@3, executions
used, rounds and the stop reason. Under each seed, every race of the run judged by
the same ground truth (read from the run's ``harnesses`` and ``events`` tables): the
true score of the parent and of each raced child, and the rank of the child racing
picked among them. A sweep with a failed job stops the script with exit code 1 (each
job's error: ``<root>/summary.md``).

  python scripts/ssr_seeds.py --experiment ssr_swepro --seeds 0 1 2 3 4
  python scripts/ssr_seeds.py --experiment ssr_swepro --seeds 0 1 2 -- method.evidence=fixed_n
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


def run_seeds(experiment: str, seeds: list[int], root: Path, extra: list[str], vary_benchmark: bool,
              max_concurrent: int | None) -> list[dict]:
    """Run one sweep job per seed; returns each run's summary (with its races), in seed order."""
    import pandas as pd

    argv = [sys.executable, "-m", "milo_ray.run", "-m", "hydra/launcher=ray_jobs", f"+experiment={experiment}",
            f"run.seed={','.join(map(str, seeds))}", f"run.dir={root}", "run.progress=false",
            "execution.join_running=false", *extra]
    if vary_benchmark:
        argv.append("benchmark.seed=${run.seed}")
    if max_concurrent is not None:
        argv.append(f"hydra.launcher.max_concurrent={max_concurrent}")
    print(f"# sweep: python {shlex.join(argv[1:])}", flush=True)
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL)  # the launcher's progress lines go to our stderr
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed (exit {proc.returncode}); each job's status and error: "
                         f"{root / 'summary.md'}")
    out = []
    for run_dir in pd.read_parquet(root / "summary.parquet")["run_dir"]:
        summary = json.loads((Path(run_dir) / "manifest.json").read_text())["summary"]
        out.append({**summary, "races": race_picks(Path(run_dir))})
    return out


def race_picks(run_dir: Path) -> list[dict]:
    """Each race of a run, judged by the benchmark's ground truth (the surrogate's exact
    expected test score): the parent's, every raced child's, and the one selected.
    Empty on a benchmark without ground truth."""
    from hydra.utils import instantiate

    from milo_ray.harness.model import Harness
    from milo_ray.store import open_run

    config = json.loads((run_dir / "manifest.json").read_text())["config"]
    bench = instantiate(config["benchmark"], _convert_="all")
    if not hasattr(bench, "true_quality"):
        return []
    store = open_run(run_dir)
    rows = store.read("harnesses").to_pylist()
    refs = {r["harness_id"]: r["source_ref"] for r in rows if r.get("source_ref")}
    scale = {r["harness_id"]: r.get("evidence_scale") or 0 for r in rows}

    def true(hid: str) -> float:
        h = Harness(dict(store.get_blob(refs[hid])))
        return float(bench.true_quality(h, config["method"]["test_split"])["score"])

    races, first_stage = [], {}
    for e in sorted(store.read("events").to_pylist(), key=lambda r: r["seq"]):
        p = json.loads(e["payload"]) if isinstance(e["payload"], str) else e["payload"]
        if e["kind"] == "ssr.stage_result" and e["round"] not in first_stage:
            first_stage[e["round"]] = list(p["scores"])  # parent + every child that entered the race
        elif e["kind"] == "ssr.selection":
            parent = p["parent_id"]
            raced = sorted((h for h in first_stage.get(e["round"], []) if h != parent), key=lambda h: scale.get(h, 0))
            children = {h: true(h) for h in raced}  # in evidence-prefix order (k ascending)
            if not children:
                continue
            races.append({"round": e["round"], "parent": true(parent), "children": children,
                          "scales": [scale.get(h) for h in raced], "selected": p["selected"],
                          "replaced": bool(p["replaced"]),
                          "best_child": max(children.values()), "picked": children.get(p["best_child"]),
                          "rank": 1 + sum(v > children[p["best_child"]] for v in children.values())})
    return races


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="ssr_swepro")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--root", default=None, help="where run directories go (default: a temp dir)")
    p.add_argument("--fixed-benchmark", action="store_true", help="keep benchmark.seed at its configured value")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="runs (Ray jobs) at once (hydra.launcher.max_concurrent; default: one per CPU)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = p.parse_args(argv)
    print(f"command: python scripts/ssr_seeds.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    root = Path(args.root or tempfile.mkdtemp(prefix="ssr-seeds-")).resolve()
    summaries = run_seeds(args.experiment, args.seeds, root, args.overrides, not args.fixed_benchmark,
                          args.max_concurrent)
    rows = []
    head = (f"{'seed':>4} {'score init':>10} {'score final':>11} {'resolve init':>12} {'resolve final':>13} "
            f"{'RR@3 init':>9} {'RR@3 final':>10} {'execs':>6} {'rounds':>6}  stop")
    print("true = the surrogate's exact expected test quality (score: partial credit; resolve: pass@1)")
    print(head)
    print("-" * len(head))
    for s, sm in zip(args.seeds, summaries):
        rows.append(sm)
        print(f"{s:>4} {sm['initial_true_quality']:>10.4f} {sm['final_true_quality']:>11.4f} "
              f"{sm['initial_true_resolve']:>12.4f} {sm['final_true_resolve']:>13.4f} "
              f"{sm['test_initial']['rr_at_k']:>9.3f} {sm['test_final']['rr_at_k']:>10.3f} "
              f"{sm['executions_used']:>6} {sm['rounds']:>6}  {sm['stop_reason']}", flush=True)
        for r in sm["races"]:
            print(f"{'':>6}race {r['round']}: true score parent {r['parent']:.4f}, children "
                  f"{' '.join(f'k={k}: {v:.4f}' for k, v in zip(r['scales'], r['children'].values()))}; "
                  f"racing's best child {r['picked']:.4f} "
                  f"(rank {r['rank']} of {len(r['children'])} by true score), "
                  f"{'replaced the parent' if r['replaced'] else 'parent kept'}", flush=True)
    for key, label in (("true_quality", "score"), ("true_resolve", "resolve")):
        deltas = [r[f"final_{key}"] - r[f"initial_{key}"] for r in rows]
        print(f"true {label}: improved in {sum(d > 0 for d in deltas)}/{len(rows)} seeds, "
              f"mean delta {sum(deltas) / len(deltas):+.4f}")
    races = [r for sm in rows for r in sm["races"]]
    if races:
        print(f"races: {len(races)}; racing's best child beats the parent in true score in "
              f"{sum(r['picked'] > r['parent'] for r in races)}/{len(races)}, is the truly best child in "
              f"{sum(r['rank'] == 1 for r in races)}/{len(races)}; the parent was replaced in "
              f"{sum(r['replaced'] for r in races)}/{len(races)}")
    print(f"runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
