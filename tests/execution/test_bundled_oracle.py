"""Oracle mode validates a task suite before money is spent: every bundled task's
reference solution, run by the real executor in the bwrap sandbox, earns reward 1."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.execution.agent_executor import AgentExecutor
from milo_ray.harness.seeds import load_seeds

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def test_oracle_solves_every_bundled_task():
    bench = HarborBenchmark()
    tasks = [t for split in bench.splits().values() for t in split]
    assert len(tasks) >= 12
    ex = AgentExecutor(sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}, agent="oracle")
    assert ex.unsupported_tasks(tasks) == []
    harness = load_seeds(["minimal"])[0]

    async def all_tasks():
        sem = asyncio.Semaphore(4)

        async def one(task):
            async with sem:
                return await ex.aexecute(harness, task, 0, 0)

        return await asyncio.gather(*(one(t) for t in tasks))

    results = asyncio.run(all_tasks())
    failed = {r.task_id: (r.score, r.error) for r in results if r.score != 1.0 or r.error_kind}
    assert not failed, failed
