"""Runs one small MILO search (offline agents, surrogate benchmark, Parquet store) as its
own Ray driver, for the mutator-seat tests (``test_mutator_pool_actor.py``).

Usage: python milo_seats_runner.py RUN_DIR OUT_JSON --ray-address ADDR [--run-id ID]
           [--seats N] [--sleep S] [--kill-pool-after N] [--barrier DIR --parties N]

Every island uses one mutator, ``sleepy``: the offline mutator behind a sleep of ``S``
seconds, so mutations overlap, with ``seats: N`` declared (omitted when N is 0). The
mutator appends a line to ``RUN_DIR/mutations.jsonl`` (fsynced) when it starts and
when it ends: a record of every mutation call that survives the run, the tests' own.

``--barrier DIR --parties N``: once initialized (seeds evaluated, islands founded), the
run writes ``DIR/<run id>`` and waits for N such files before its first round, so that
runs whose initializations took different times compete for the seats from round 1.

``--kill-pool-after N``: right after the N-th seat is granted, the pool actor is killed
with ``ray.kill`` (no restart) while mutations run and wait; the run must go on.

OUT_JSON gets the run's end: its stop reason, rounds per island, the pool actor's
assignment, and how many times the driver rebuilt its pool actor."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MUTATIONS = "mutations.jsonl"
CONFIG = dict(num_islands=3, max_rounds=3, k_search=1, k_val=1, k_test=1, search_size=4, val_size=3,
              orchestrator=False, round_sync=False)


def log_line(path: str, record: dict) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


class SleepyMutator:
    """The offline mutator after a sleep, logging the start and end of each call."""

    def __init__(self, log: str, run: str, sleep_s: float, name: str = "sleepy") -> None:
        from milo_ray.agents.mutators.offline import OfflineMutator

        self.inner = OfflineMutator(personality="bold")
        self.log, self.run, self.sleep_s, self.name = log, run, float(sleep_s), name

    def mutate(self, request):
        work = f"{request.context['island']}-{request.context['round']}"
        log_line(self.log, {"run": self.run, "work": work, "at": "start", "t": time.time(), "pid": os.getpid()})
        time.sleep(self.sleep_s)
        try:
            return self.inner.mutate(request)
        finally:
            log_line(self.log, {"run": self.run, "work": work, "at": "end", "t": time.time(), "pid": os.getpid()})


def _opt(name: str, default: str | None = None) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    run_id = _opt("--run-id", "seats-test")
    seats, sleep_s = int(_opt("--seats", "2")), float(_opt("--sleep", "1.0"))
    kill_after = int(_opt("--kill-pool-after", "0"))
    run_dir.mkdir(parents=True, exist_ok=True)
    from milo_ray.execution.cluster import join

    join(_opt("--ray-address"))
    import ray

    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.milo.config import MiloConfig
    from milo_ray.milo.loop import MiloRun
    from milo_ray.store.parquet import ParquetRunStore

    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=0)
    store = ParquetRunStore(run_dir, run_id=run_id, flush_rows=1)
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store,
                             model_id="offline-surrogate", run_id=run_id, budget=BudgetLedger())
    spec = {"_target_": "milo_seats_runner.SleepyMutator", "name": "sleepy", "log": str(run_dir / MUTATIONS),
            "run": run_id, "sleep_s": sleep_s}
    if seats:
        spec["seats"] = seats
    ctx = RunContext(run_id=run_id, run_dir=run_dir, seed=0, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline-surrogate", agents={"mutators": [spec]})

    async def go():
        run = MiloRun(MiloConfig(**CONFIG), ctx)
        if _opt("--barrier"):
            barrier, parties, rounds = Path(_opt("--barrier")), int(_opt("--parties", "2")), run.run_free

            async def run_free_together():
                (barrier / run_id).write_text("ready")
                while len(list(barrier.iterdir())) < parties:
                    await asyncio.sleep(0.1)
                await rounds()

            run.run_free = run_free_together
        if kill_after:
            acquire, granted = run.pool.acquire, []

            async def acquire_then_kill(island, lease_id):
                lease = await acquire(island, lease_id)
                granted.append(lease_id)
                if len(granted) == kill_after:
                    ray.kill(run.pool.actor, no_restart=True)
                return lease

            run.pool.acquire = acquire_then_kill
        await run.main()
        progress = await run._progress(sorted(run.state.islands))
        return {"stop": run.stop_reason or "finished", "rounds": {str(j): p[0] for j, p in progress.items()},
                "assignment": {str(j): m for j, m in (await run.pool.assignment()).items()},
                "restores": run.pool.restores}

    result = asyncio.run(go())
    sched.close()
    store.close()
    out.write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
