"""Test-only targets for sweep jobs (importable by the jobs' drivers and Ray workers
through the PYTHONPATH the launcher hands a Ray on this machine)."""

from __future__ import annotations

import asyncio

from milo_ray.benchmarks.surrogate_executor import SurrogateExecutor
from milo_ray.evaluation import EvalMethod


class SlowSurrogateExecutor(SurrogateExecutor):
    """The surrogate executor, each rollout taking ``sleep_s`` seconds of I/O wait: long
    enough that rollouts in flight together show in their stored timestamps."""

    def __init__(self, *args, sleep_s: float = 0.2, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sleep_s = float(sleep_s)

    async def aexecute(self, harness, task, rollout_idx, seed):
        await asyncio.sleep(self.sleep_s)
        return self.execute(harness, task, rollout_idx, seed)


class CrashingEval(EvalMethod):
    """Passes every check before the run, then fails with a bug once it runs."""

    def run(self, ctx):
        ctx.store.event("about_to_crash", {})
        raise RuntimeError("a bug in the sweep's crashing method")
