"""End-to-end SSR runs on the surrogate under two racing set-ups, the same seeds, and the
true-quality trajectory against executions used, with ratios to successive halving
measured in the same invocation.

Each (variant, seed) is one offline run of the entry point, one after the other
(``python -m milo_ray.run +experiment=EXP run.seed=S benchmark.seed=S``, its own local
Ray, never one someone else started), so both variants see the same task pools and the
same first parent; everything but the racing overrides is the experiment's. For
every run, after each race: the incumbent's true quality (the surrogate's exact expected
test score, partial credit, in points ×100 below) and the cumulative budgeted
executions (training refreshes and racing, the budget B's count), read from the run's
events. The table gives, per race index and variant, the mean over seeds of both and
the executions as a ratio to successive halving's at the same race; the last lines
the final true quality (mean ± SD over seeds, and paired per seed) and the total
executions used.

  python scripts/ssr_racing_e2e.py --seeds 0 1 2 3 4
  python scripts/ssr_racing_e2e.py --variant 'k4+disc=method.racing=halving method.stages=4 method.b_v=[5] \
      method.b_s=3 method.b_f=2 method.task_draw=discriminative'
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BASELINE = ("successive_halving", "")
# The paper's K=2 race raced on 40 tasks per leader (2 stages of 10 validation + 5 + 5);
# the K=4 halving schedule (4 → 2 → 1 → 1 children) on 4 stages of 10 tasks (5 + 3 + 2)
# races its leaders on the same 40 tasks while the field is cut after 10.
DEFAULT_VARIANT = ("halving_k4", "method.racing=halving method.stages=4 method.b_v=[5] method.b_s=3 method.b_f=2")


def trajectory(run_dir: Path, races: list[dict]) -> list[dict]:
    """After each race of a run: its round, the cumulative budgeted executions, and the
    incumbent's true test score (the race's pick when it replaced the parent); ``races``:
    the run's races judged by ground truth (``ssr_seeds.race_picks``)."""
    from milo_ray.store import open_run

    picks = {r["round"]: r for r in races}
    store = open_run(run_dir)
    out, used = [], 0
    for e in sorted(store.read("events").to_pylist(), key=lambda r: r["seq"]):
        p = json.loads(e["payload"]) if isinstance(e["payload"], str) else e["payload"]
        if e["kind"] == "ssr.refresh":
            used = int(p["executions_used"])  # the run's total after the refresh
        elif e["kind"] == "ssr.selection":
            used += int(p["executions"])
            r = picks.get(e["round"])
            if r is None:  # a race with no child: nothing to score
                continue
            out.append({"round": e["round"], "executions": used,
                        "true": r["picked"] if r["replaced"] else r["parent"]})
    return out


def run_one(experiment: str, seed: int, run_dir: Path, overrides: list[str]) -> dict:
    """One run; its manifest's summary with its races judged by ground truth."""
    import subprocess

    from ssr_seeds import race_picks

    argv = [sys.executable, "-m", "milo_ray.run", f"+experiment={experiment}", f"run.seed={seed}",
            f"benchmark.seed={seed}", f"run.dir={run_dir}", "run.progress=false", "execution.join_running=false",
            *overrides]
    print(f"# run: python {shlex.join(argv[1:])}", flush=True)
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode}); its log: {run_dir / 'run.log'}")
    summary = json.loads((run_dir / "manifest.json").read_text())["summary"]
    return {**summary, "races": race_picks(run_dir)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="ssr_swepro")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--variant", action="append", default=None,
                   help="LABEL=OVERRIDES of a racing set-up compared with successive halving; repeatable "
                        f"(default: {DEFAULT_VARIANT[0]}={DEFAULT_VARIANT[1]})")
    p.add_argument("--root", default=None, help="where run directories go (default: a temp dir)")
    args = p.parse_args(argv)
    print(f"command: python scripts/ssr_racing_e2e.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    variants = [tuple(v.split("=", 1)) for v in args.variant] if args.variant else [DEFAULT_VARIANT]
    root = Path(args.root or tempfile.mkdtemp(prefix="ssr-racing-")).resolve()
    results: dict[str, list[dict]] = {}
    for label, overrides in (BASELINE, *variants):
        runs = []
        for seed in args.seeds:
            run_dir = root / label / f"seed{seed}"
            s = run_one(args.experiment, seed, run_dir, shlex.split(overrides))
            runs.append({"summary": s, "trajectory": trajectory(run_dir, s["races"])})
        results[label] = runs
    labels = [BASELINE[0], *(v[0] for v in variants)]
    base = results[BASELINE[0]]
    print(f"\ntrue = the surrogate's exact expected test score x100 (partial credit), the incumbent after each race "
          f"(seeds that ran it / all); execs = cumulative budgeted executions (refreshes + racing, of B); ratio = "
          f"execs / successive_halving's at the same race; means over seeds {args.seeds}")
    head = f"{'race':>4}  " + "  ".join(f"{lab + ' true':>22} {lab + ' execs':>22}" for lab in labels)
    print(head + "  " + "  ".join(f"{lab + ' ratio':>22}" for lab in labels[1:]))
    n_races = max(len(r["trajectory"]) for runs in results.values() for r in runs)
    for k in range(n_races):
        cells, execs = [], []
        for runs in results.values():
            pts = [r["trajectory"][k] for r in runs if len(r["trajectory"]) > k]
            if not pts:
                cells.append(f"{'-':>22} {'-':>22}")
                execs.append(float("nan"))
                continue
            t = sum(x["true"] for x in pts) / len(pts) * 100
            e = sum(x["executions"] for x in pts) / len(pts)
            execs.append(e)
            cells.append(f"{t:>16.2f} ({len(pts)}/{len(runs)}) {e:>22.0f}")
        ratios = [e / execs[0] if execs[0] == execs[0] and e == e else float("nan") for e in execs[1:]]
        print(f"{k:>4}  " + "  ".join(cells) + "  " + "  ".join(f"{x:>22.2f}" for x in ratios))
    for lab, runs in results.items():
        fin = [r["summary"]["final_true_quality"] * 100 for r in runs]
        init = [r["summary"]["initial_true_quality"] * 100 for r in runs]
        used = [r["summary"]["executions_used"] for r in runs]
        m = sum(fin) / len(fin)
        sd = (sum((x - m) ** 2 for x in fin) / max(1, len(fin) - 1)) ** 0.5
        print(f"{lab}: final true score {m:.2f} ± {sd:.2f} (SD over seeds; initial {sum(init) / len(init):.2f}), "
              f"per seed {' '.join(f'{x:.2f}' for x in fin)}; executions used {sum(used) / len(used):.0f} "
              f"(per seed {' '.join(map(str, used))}), stops {[r['summary']['stop_reason'] for r in runs]}")
    for lab in labels[1:]:
        d = [v["summary"]["final_true_quality"] * 100 - b["summary"]["final_true_quality"] * 100
             for b, v in zip(base, results[lab])]
        md = sum(d) / len(d)
        se = ((sum((x - md) ** 2 for x in d) / max(1, len(d) - 1)) ** 0.5) / len(d) ** 0.5
        print(f"final true score, {lab} - {BASELINE[0]} (paired by seed): {md:+.2f} ± {se:.2f} points (SE)")
    print(f"runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
