"""MILO's search-mechanism ablation ladder (papers/000 App. A.5) on the surrogate.

Runs method=milo_A … milo_E (one-shot mutator over a flat archive -> + agentic
mutator -> + lineage memory -> + islands -> + orchestrator) for several seeds under
the same execution budget and reports the true test quality (the surrogate's exact
expected score) of each run's final best harness, mean ± sd per rung, next to the
best seed harness. Also reports in how many seeds full MILO (E) beats the best seed.

    python scripts/milo_ablation.py --seeds 0 1 2 --budget 1500
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def method_fields(rung: str, overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from milo_ray.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"method=milo_{rung}", *[f"method.{o}" for o in overrides]])
    d = OmegaConf.to_container(cfg.method, resolve=True)
    d.pop("_target_", None)
    return d, OmegaConf.to_container(cfg.backend.agents, resolve=True)


def run_one(rung: str, seed: int, budget: int, preset: str, overrides: list[str]) -> dict:
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.milo.loop import MiloMethod
    from milo_ray.store.memory import MemoryRunStore

    fields, agents = method_fields(rung, overrides)
    bench = SurrogateBenchmark(preset=preset, seed=seed)
    store = MemoryRunStore(run_id=f"ablation-{rung}-{seed}")
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store,
                             model_id="offline-surrogate", run_id=store.run_id, budget=BudgetLedger(executions=budget))
    with tempfile.TemporaryDirectory() as tmp:
        ctx = RunContext(run_id=store.run_id, run_dir=Path(tmp), seed=seed, store=store, benchmark=bench,
                         scheduler=sched, model_id="offline-surrogate", extras={"agents": agents})
        t0 = time.monotonic()
        try:
            s = MiloMethod(**fields).run(ctx)
        finally:
            sched.close()
    return {"rung": rung, "seed": seed, "true": s["best"]["true_quality"], "best_seed": s["best_seed_true_quality"],
            "executions": s["executions_used"], "islands": s["n_islands"], "interventions": s["interventions"],
            "seconds": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rungs", nargs="+", default=list("ABCDE"))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=1500, help="search executions per run (same for every rung)")
    ap.add_argument("--preset", default="surrogate_tb21")
    ap.add_argument("--out", default=None, help="write every run's row as JSON lines here")
    ap.add_argument("overrides", nargs="*", default=["search_size=16", "val_size=10", "k_search=2", "k_val=2",
                                                     "k_test=1", "round_sync=true", "time_limit_s=900"],
                    help="method.<key>=<value> overrides applied to every rung")
    a = ap.parse_args(argv)
    import ray

    from milo_ray.execution.cluster import quiet_token_auth_notice

    if not ray.is_initialized():
        quiet_token_auth_notice()
        ray.init(include_dashboard=False, log_to_driver=False, resources={"sandbox_slot": 8})
    rows = []
    for rung in a.rungs:
        for seed in a.seeds:
            r = run_one(rung, seed, a.budget, a.preset, a.overrides)
            rows.append(r)
            print(json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
    print(f"\nAblation ladder on {a.preset}, budget {a.budget} executions, seeds {a.seeds}")
    print(f"{'rung':<6}{'true quality (mean ± sd)':<28}{'best seed':<12}{'> best seed':<12}")
    for rung in a.rungs:
        rs = [r for r in rows if r["rung"] == rung]
        q = [r["true"] for r in rs]
        sd = statistics.stdev(q) if len(q) > 1 else 0.0
        wins = sum(r["true"] > r["best_seed"] for r in rs)
        print(f"{rung:<6}{statistics.mean(q):.4f} ± {sd:.4f}{'':<11}{statistics.mean(r['best_seed'] for r in rs):.4f}"
              f"{'':<6}{wins}/{len(rs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
