"""MILO's search-mechanism ablation ladder (papers/000 App. A.5) on the surrogate.

Runs method=milo_A … milo_E (one-shot mutator over a flat archive -> + agentic
mutator -> + lineage memory -> + islands -> + orchestrator) for several seeds under
the same execution budget, as one sweep of the entry point on the ``ray_jobs`` launcher
(one Ray job, with its own driver, per rung and seed, several at once):

    python -m milo_ray.run -m hydra/launcher=ray_jobs method=milo_A,...,milo_E benchmark=<preset> \
        benchmark.seed=S1,S2,... 'run.seed=${benchmark.seed}' run.budget.executions=<budget> \
        run.dir=<root> run.progress=false execution.join_running=false <overrides>

The launcher starts its own Ray head for the sweep (``execution.join_running=false``: a
`ray start` instance of someone else on a shared machine is never joined) and stops it at
the end; ``--max-concurrent`` caps the jobs running at once (default: one per CPU).

Runs are capped by execution budget (``--budget``) and ``method.max_rounds`` only,
never by wall time, so the figures do not depend on the machine; with
``method.round_sync=true`` (the default overrides) a run is fully reproducible, and
running concurrently does not change its result.

Per run it reads the manifest's summary (the true test quality of the returned
harness: the surrogate's exact expected score; the best seed's; executions used; the
stop reason) and the run's ``events`` Parquet table, where it counts the
orchestrator's interventions: ``milo.decision`` (a valid decision), and the moves
applied (``milo.move_done``, by kind), plus invalid decisions and failed moves. Per
rung it prints the mean ± sd true quality, in how many seeds the run beats the best
seed harness, and the interventions and applied moves per run.

    python scripts/milo_ablation.py --seeds 0 1 2 --budget 700
    python scripts/milo_ablation.py --rungs D E --seeds 0 1 2 3 4 --budget 1500 --optimum -- \
        method.search_size=16 method.val_size=10 method.k_search=2 method.k_val=2 \
        method.k_test=1 method.round_sync=true method.max_rounds=40

A sweep with any failed job (see ``<root>/summary.md`` for each job's error), or a run
stopped by a wall-clock limit, stops the script with exit code 1. A ``--root`` that
already holds a finished sweep of exactly the same resolved configs is read instead of
rerun; one holding anything else is refused.
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_OVERRIDES = ["method.search_size=16", "method.val_size=10", "method.k_search=2", "method.k_val=2",
                     "method.k_test=1", "method.round_sync=true", "method.max_rounds=24"]
# Set by the script itself (per rung / seed / budget), so never accepted as overrides.
OWNED = ("method", "benchmark", "benchmark.seed", "run.seed", "run.dir", "run.budget.executions", "run.resume",
         "hydra/launcher",
         "execution.join_running")


class RunFailed(SystemExit):
    pass


def check_overrides(overrides: list[str]) -> None:
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if "time_limit" in key:
            raise SystemExit(f"error: {o!r}: figures are capped by --budget and method.max_rounds, never by wall time")
        if key in OWNED:
            raise SystemExit(f"error: {o!r}: {key} is set by this script "
                             "(see --rungs, --seeds, --preset, --budget, --root)")
        if "=" not in o:
            raise SystemExit(f"error: {o!r}: expected a Hydra override key=value")


def sweep_argv(rungs: list[str], seeds: list[int], budget: int, preset: str, root: Path, overrides: list[str],
               max_concurrent: int | None) -> list[str]:
    # One job per (rung, seed); run.seed follows each job's benchmark seed. The launcher starts
    # a private Ray head (execution.join_running=false): on a shared machine a `ray start`
    # instance of someone else must never be joined. Where Ray runs does not change a
    # lock-step run's result.
    cap = [] if max_concurrent is None else [f"hydra.launcher.max_concurrent={max_concurrent}"]
    return ["-m", "milo_ray.run", "-m", "hydra/launcher=ray_jobs", f"method={','.join(f'milo_{r}' for r in rungs)}",
            f"benchmark={preset}", f"benchmark.seed={','.join(map(str, seeds))}", "run.seed=${benchmark.seed}",
            f"run.budget.executions={budget}", f"run.dir={root}", "run.progress=false", "execution.join_running=false",
            *overrides, *cap]


def orchestrator_counts(run_dir: Path) -> dict:
    """Orchestrator activity of one run, counted from its ``events`` Parquet table."""
    from milo_ray.store import open_run

    rows = open_run(run_dir).read("events").select(["kind", "payload"]).to_pylist()
    kinds = collections.Counter(r["kind"] for r in rows)
    moves: collections.Counter = collections.Counter()
    for r in rows:
        if r["kind"] == "milo.move_done":
            p = r["payload"]
            moves[(json.loads(p) if isinstance(p, str) else p or {}).get("kind", "?")] += 1
    return {"decisions": kinds["milo.decision"], "invalid_decisions": kinds["milo.decision_invalid"],
            "moves_applied": kinds["milo.move_done"], "moves_failed": kinds["milo.move_failed"],
            "interventions_done": kinds["milo.intervention_done"], "moves_by_kind": dict(sorted(moves.items()))}


def found_round(run_dir: Path, harness_id: str) -> int:
    """The round in which the run's returned harness was made (0: a seed harness), from
    its ``harnesses`` table."""
    from milo_ray.store import open_run

    rows = open_run(run_dir).read("harnesses").select(["harness_id", "round"]).to_pylist()
    return min((int(r["round"] or 0) for r in rows if r["harness_id"] == harness_id), default=0)


def expected_config(overrides: list[str]) -> dict:
    """The resolved config the entry point composes for one job's overrides (as stored in a manifest)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import milo_ray.run  # noqa: F401 - registers the config schemas and resolvers the entry point uses

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)


def comparable(config: dict) -> dict:
    """A resolved config without the keys that cannot change a run's result: where Ray
    runs (``execution``), the progress display and the run's own directory."""
    out = {k: v for k, v in config.items() if k != "execution"}
    out["run"] = {k: v for k, v in (out.get("run") or {}).items() if k not in ("progress", "dir")}
    return out


def job_dirs(root: Path) -> list[Path]:
    """The run directory of each job of the sweep in ``root``, in job order (summary.parquet)."""
    import pandas as pd

    return [Path(d) for d in pd.read_parquet(root / "summary.parquet")["run_dir"]]


def finished_sweep(root: Path, argv: list[str]) -> bool:
    """True when ``root`` holds a finished sweep of exactly these jobs (read, not rerun);
    False when it holds nothing. Anything else in the way is an error."""
    if not root.exists() or not any(root.iterdir()):
        return False
    if not (root / "summary.parquet").is_file():
        raise RunFailed(f"error: {root} holds something other than a finished sweep; "
                        "remove it or choose another --root")
    import pandas as pd

    summary = pd.read_parquet(root / "summary.parquet")
    if set(summary["status"]) != {"SUCCEEDED"}:
        raise RunFailed(f"error: {root} holds a sweep with failed jobs (see {root / 'summary.md'}); remove it or "
                        "choose another --root")
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    wanted = [o for o in argv[4:] if not o.startswith("hydra.")]
    points = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(wanted), None)[0]
    stored = job_dirs(root)
    if len(points) != len(stored) or any(
            comparable(json.loads((d / "manifest.json").read_text())["config"]) != comparable(expected_config(p))
            for d, p in zip(stored, points)):
        raise RunFailed(f"error: {root} holds a sweep of another configuration; remove it or choose another --root")
    return True


def read_run(run_dir: Path, budget: int, reused: bool) -> dict:
    from milo_ray.results import load_run

    manifest = json.loads((run_dir / "manifest.json").read_text())
    rung, seed = load_run(run_dir).rung, int(manifest["config"]["benchmark"]["seed"])
    # The run's own wall time (its manifest), so a reused run reports the time it took.
    seconds = float(manifest.get("finished_at") or 0) - float(manifest.get("started_at") or 0)
    s = manifest.get("summary") or {}
    if manifest.get("status") != "finished" or not s.get("best"):
        raise RunFailed(f"error: rung {rung} seed {seed}: status {manifest.get('status')!r}, no best harness; "
                        f"run dir {run_dir}")
    stop = str(s.get("stop_reason", ""))
    if stop.startswith("time limit"):
        raise RunFailed(f"error: rung {rung} seed {seed} stopped on a time limit ({stop}); figures must be capped "
                        "by the execution budget and max_rounds")
    rounds = [isl.get("rounds") for isl in (s.get("islands") or {}).values()]
    return {"rung": rung, "seed": seed, "true": s["best"]["true_quality"], "best_seed": s["best_seed_true_quality"],
            "executions": s["executions_used"], "budget": budget, "islands": s["n_islands"], "rounds": rounds,
            "returned": f"{s['best']['island']}:{s['best']['node_id']}", "stop_reason": stop,
            "found_round": found_round(run_dir, s["best"]["harness_id"]),
            **orchestrator_counts(run_dir), "seconds": round(seconds, 1), "reused": reused, "run_dir": str(run_dir)}


def run_ladder(rungs: list[str], seeds: list[int], budget: int, preset: str, root: Path, overrides: list[str],
               max_concurrent: int | None) -> list[dict]:
    argv = sweep_argv(rungs, seeds, budget, preset, root, overrides, max_concurrent)
    print(f"# sweep: python {shlex.join(argv)}", flush=True)
    reused = finished_sweep(root, argv)
    if reused:
        print(f"# reused: {root} already holds this sweep, finished", flush=True)
    else:
        # The launcher's progress lines (one per job submitted and ended) go to our stderr.
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RunFailed(f"error: the sweep failed (exit {proc.returncode}); each job's status and error: "
                            f"{root / 'summary.md'}")
    return [read_run(d, budget, reused) for d in job_dirs(root)]


def code_version() -> str:
    """The commit the runs use, and whether milo_ray/ or conf/ differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "milo_ray", "conf"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{sha}" + (" with uncommitted changes in milo_ray/ or conf/" if dirty else "")


def mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def optimum_by_seed(rows: list[dict]) -> dict[int, float]:
    """The surrogate's optimum test score (``best_reachable``) of each run's benchmark seed."""
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark

    out: dict[int, float] = {}
    for r in rows:
        if r["seed"] not in out:
            bench = json.loads((Path(r["run_dir"]) / "manifest.json").read_text())["config"]["benchmark"]
            sb = SurrogateBenchmark(preset=bench["preset"], seed=bench["seed"], label_noise=bench["label_noise"])
            out[r["seed"]] = float(sb.best_reachable(split="test", metric="score")["quality"]["score"])
    return out


def kinds_text(kinds: dict, prefix: str = "") -> str:
    text = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    return f"{prefix}{text})" if text and prefix else text


def print_summary(rows: list[dict], rungs: list[str], optimum: dict[int, float], title: str) -> None:
    """Per-run and per-rung markdown tables."""
    print(f"\nPer run ({title}); true = the surrogate's exact expected test score of the returned harness")
    print("| rung | seed | true | best seed | executions | rounds per island | returned (island:node) "
          "| found in round | interventions | moves applied | stop |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rung']} | {r['seed']} | {r['true']:.4f} | {r['best_seed']:.4f} | {r['executions']} "
              f"| {r['rounds']} | {r['returned']} | {r.get('found_round', '?')} | {r['decisions']} "
              f"| {r['moves_applied']}{kinds_text(r['moves_by_kind'], ' (')} "
              f"| {r['stop_reason'].split(':')[0]} |")
    print(f"\nPer rung ({title}); interventions = milo.decision events per run, moves = milo.move_done "
          "events per run")
    gap = " | gap to optimum closed (mean)" if optimum else ""
    print(f"| rung | true quality (mean ± sd) | beats the best seed | executions (mean) | returned harness found in "
          f"round (per seed) | interventions per run | moves applied per run | moves by kind (all runs){gap} |")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if optimum else ""))
    for rung in rungs:
        rs = [r for r in rows if r["rung"] == rung]
        m, sd = mean_sd([r["true"] for r in rs])
        wins = sum(r["true"] > r["best_seed"] for r in rs)
        kinds: collections.Counter = collections.Counter()
        for r in rs:
            kinds.update(r["moves_by_kind"])
        dec = [r["decisions"] for r in rs]
        mv = [r["moves_applied"] for r in rs]
        closed = ""
        if optimum:
            fr = [(r["true"] - r["best_seed"]) / (optimum[r["seed"]] - r["best_seed"]) for r in rs]
            closed = f" {statistics.mean(fr):.0%} |"
        print(f"| {rung} | {m:.4f} ± {sd:.4f} | {wins}/{len(rs)} | {statistics.mean(r['executions'] for r in rs):.0f} "
              f"| {', '.join(str(r.get('found_round', '?')) for r in rs)} "
              f"| {statistics.mean(dec):.1f} ({', '.join(map(str, dec))}) "
              f"| {statistics.mean(mv):.1f} ({', '.join(map(str, mv))}) "
              f"| {kinds_text(kinds) or '-'} |{closed}")
    bad = sum(r["invalid_decisions"] + r["moves_failed"] for r in rows)
    print(f"invalid decisions + failed moves over all runs: {bad}")
    print(f"best seed harness (true), per seed: "
          f"{ {r['seed']: round(r['best_seed'], 4) for r in rows} }")
    if optimum:
        print(f"surrogate optimum (true test score, best_reachable), per seed: "
              f"{ {k: round(v, 4) for k, v in optimum.items()} }")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rungs", nargs="+", default=list("ABCDE"), choices=list("ABCDE"))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                    help="each seed is both run.seed and benchmark.seed")
    ap.add_argument("--budget", type=int, default=700, help="run.budget.executions of every run (same for every rung)")
    ap.add_argument("--preset", default="surrogate_tb21", help="benchmark config group option")
    ap.add_argument("--root", default=None, help="where run directories go (default: a new temp dir)")
    ap.add_argument("--out", default=None, help="also append every run's row as JSON lines here")
    ap.add_argument("--optimum", action="store_true",
                    help="also compute the surrogate's optimum per benchmark seed (best_reachable, ~1 min each) "
                         "and the fraction of the best-seed-to-optimum gap each rung closes")
    ap.add_argument("--max-concurrent", type=int, default=None,
                    help="runs (Ray jobs) at once (hydra.launcher.max_concurrent; default: one per CPU)")
    ap.add_argument("overrides", nargs="*", default=None,
                    help=f"Hydra overrides applied to every run (after --); default: {' '.join(DEFAULT_OVERRIDES)}")
    a = ap.parse_args(argv)
    overrides = DEFAULT_OVERRIDES if a.overrides is None or a.overrides == [] else a.overrides
    check_overrides(overrides)
    shown = sys.argv[1:] if argv is None else argv
    print(f"command: python scripts/milo_ablation.py {shlex.join(shown)}")
    print(f"overrides applied to every run: {' '.join(overrides)}")
    print(f"code: {code_version()}", flush=True)
    root = Path(a.root or tempfile.mkdtemp(prefix="milo-ablation-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    try:
        rows = run_ladder(a.rungs, a.seeds, a.budget, a.preset, root, overrides, a.max_concurrent)
    except RunFailed as e:
        print(e.code, file=sys.stderr, flush=True)
        return 1
    for r in rows:
        print(json.dumps(r), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")

    optimum = optimum_by_seed(rows) if a.optimum else {}
    print_summary(rows, a.rungs, optimum, f"{a.preset}, {a.budget} executions per run, seeds {a.seeds}")
    print(f"\nstop reasons: {dict(collections.Counter(r['stop_reason'].split(':')[0] for r in rows))}")
    reused = sum(r["reused"] for r in rows)
    print(f"wall time: {time.monotonic() - t_all:.0f} s for this invocation ({reused} of {len(rows)} runs reused); "
          f"the runs' own times sum to {sum(r['seconds'] for r in rows):.0f} s "
          "(machine-dependent; the figures are not)")
    print(f"runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
