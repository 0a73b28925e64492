"""Runs a small lock-step MILO search in its own process (own Ray instance, Parquet
store) and writes the final lineage/assignment/stall state as JSON; used by the
kill-and-resume tests.

Usage: python milo_resume_runner.py RUN_DIR OUT_JSON [--resume] [--die-before KIND:FIELD=VALUE,...]

``--die-before`` ends the process abruptly (``os._exit``, exit code 3, nothing
flushed or closed) right before the first ``KIND`` event whose payload (or the
payload's ``node``) has all the given fields: a kill at an exact point of the run."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MUTATORS = [{"_target_": "milo_ray.agents.mutators.offline.OfflineMutator", "personality": p}
            for p in ("conservative", "bold", "sloppy")]
CONFIG = dict(num_islands=2, patience=1, max_rounds=5, k_search=1, k_val=1, k_test=1, search_size=8, val_size=6,
              round_sync=True)


async def state_of(run) -> dict:
    out = {"assignment": {str(j): m for j, m in sorted(run.assignment.items())}, "islands": {}}
    for j in sorted(run.islands):
        nodes = await run.islands[j].nodes.remote()
        rounds, stall = await run.islands[j].progress.remote()
        out["islands"][str(j)] = {
            "rounds": rounds, "stall": stall,
            "nodes": [[n["node_id"], n["harness_id"], n["parent"], n["co_parent"], n["admitted"], n["verdict_reason"],
                       n["mutator"], n["val_accuracy"]] for n in nodes],
        }
    return out


DIE_EXIT_CODE = 3


def install_kill_point(spec: str) -> None:
    from milo_ray.milo.loop import MiloRun

    kind, _, conds = spec.partition(":")
    want = dict(c.split("=", 1) for c in conds.split(",") if c)
    emit = MiloRun.emit

    async def emit_or_die(self, k, payload, **cols):
        if k == kind:
            fields = {**payload.get("node", {}), **payload}
            if all(str(fields.get(f)) == v for f, v in want.items()):
                os._exit(DIE_EXIT_CODE)
        return await emit(self, k, payload, **cols)

    MiloRun.emit = emit_or_die


def main() -> None:
    run_dir, out, resume = Path(sys.argv[1]), Path(sys.argv[2]), "--resume" in sys.argv
    if "--die-before" in sys.argv:
        install_kill_point(sys.argv[sys.argv.index("--die-before") + 1])
    import ray

    from milo_ray.execution.cluster import quiet_token_auth_notice

    quiet_token_auth_notice()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, resources={"sandbox_slot": 8})
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.milo.config import MiloConfig
    from milo_ray.milo.loop import MiloRun
    from milo_ray.store.parquet import ParquetRunStore

    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=0)
    store = ParquetRunStore(run_dir, run_id="resume-test", flush_rows=1)
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store,
                             model_id="offline-surrogate", run_id="resume-test", budget=BudgetLedger())
    ctx = RunContext(run_id="resume-test", run_dir=run_dir, seed=0, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline-surrogate", resumed=resume,
                     extras={"agents": {"mutators": MUTATORS, "orchestrator": {
                         "_target_": "milo_ray.agents.orchestrators.offline.OfflineOrchestrator"}}})
    cfg = MiloConfig(**CONFIG)

    async def go():
        run = MiloRun(cfg, ctx)
        await run.main()
        return await state_of(run)

    state = asyncio.run(go())
    sched.close()
    store.close()
    out.write_text(json.dumps(state, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
