"""WorkerCore (the logic inside each node's async actor), tested on a plain event loop."""

from __future__ import annotations

import asyncio

from milo_ray.core.tasks import Task
from milo_ray.execution.fake import BlockingSleepExecutor, SleepExecutor
from milo_ray.execution.workers import WorkerCore
from milo_ray.harness.model import Harness

HARNESS = Harness.from_source("def build_agent(model, backend):\n    return None\n")


def _task(name: str, cap: float = 30.0, **metadata) -> Task:
    return Task(name, "search", "do it", cap, 1000, metadata)


async def _run_all(core: WorkerCore, tasks: list[Task]) -> list:
    items = [(i, HARNESS.harness_id, t.task_id, 0, 7) for i, t in enumerate(tasks)]
    await core.submit(items, {HARNESS.harness_id: HARNESS}, {t.task_id: t for t in tasks})
    outcomes = []
    while len(outcomes) < len(items):
        outcomes += await core.poll(5.0)
    return outcomes


def test_rollout_past_the_time_cap_is_cancelled_and_marked_capped():
    core = WorkerCore(SleepExecutor(), slots=2, time_cap_grace=1.25)
    tasks = [_task("hang", cap=0.1, sleep_s=30.0), _task("quick", sleep_s=0.0)]
    by_id = {o.item_id: o for o in asyncio.run(_run_all(core, tasks))}
    assert by_id[0].capped and by_id[0].result is None and by_id[0].infra_error is None
    assert not by_id[1].capped and by_id[1].result.score == 1.0


def test_blocking_executor_does_not_stall_other_rollouts():
    # Four blocking rollouts on four slots: if execute() ran on the event loop they
    # would run one after another and never see each other in flight.
    core = WorkerCore(BlockingSleepExecutor(seconds=0.3), slots=4, time_cap_grace=1.25)
    outcomes = asyncio.run(_run_all(core, [_task(f"t{i}") for i in range(4)]))
    seen = [o.result.trace["trajectory"]["in_flight_total"] for o in outcomes]
    assert max(seen) == 4


def test_blocking_executor_past_the_time_cap_is_capped_without_blocking_the_poll():
    core = WorkerCore(BlockingSleepExecutor(), slots=2, time_cap_grace=1.0)
    tasks = [_task("slow", cap=0.05, sleep_s=0.5), _task("quick", sleep_s=0.0)]
    by_id = {o.item_id: o for o in asyncio.run(_run_all(core, tasks))}
    assert by_id[0].capped and by_id[1].result is not None


def test_executor_raising_is_reported_as_an_infra_error_not_a_result():
    core = WorkerCore(SleepExecutor(crash_rate=1.0), slots=1, time_cap_grace=1.25)
    (o,) = asyncio.run(_run_all(core, [_task("t")]))
    assert o.result is None and "SimulatedInfraError" in o.infra_error


def test_harness_failure_is_a_returned_result():
    core = WorkerCore(SleepExecutor(fail_rate=1.0), slots=1, time_cap_grace=1.25)
    (o,) = asyncio.run(_run_all(core, [_task("t")]))
    assert o.infra_error is None and o.result.error_kind == "harness" and o.result.score == 0.0


def test_outcomes_arrive_in_completion_order():
    core = WorkerCore(SleepExecutor(), slots=3, time_cap_grace=1.25)
    tasks = [_task("slow", sleep_s=0.4), _task("fast", sleep_s=0.0), _task("mid", sleep_s=0.2)]
    outcomes = asyncio.run(_run_all(core, tasks))
    assert [o.item_id for o in outcomes] == [1, 2, 0]


def test_slots_bound_concurrency():
    core = WorkerCore(SleepExecutor(seconds=0.05), slots=3, time_cap_grace=1.25)
    outcomes = asyncio.run(_run_all(core, [_task(f"t{i}") for i in range(9)]))
    assert max(o.result.trace["trajectory"]["in_flight_total"] for o in outcomes) == 3


def test_executor_is_built_from_a_target_config_or_dictconfig():
    from omegaconf import OmegaConf

    from milo_ray.execution.workers import build_executor

    cfg = {"_target_": "milo_ray.execution.fake.SleepExecutor", "seconds": 0.5, "fail_rate": 0.25}
    for c in (cfg, OmegaConf.create(cfg)):
        ex = build_executor(c)
        assert isinstance(ex, SleepExecutor) and ex.seconds == 0.5 and ex.fail_rate == 0.25


def test_a_config_that_builds_no_executor_is_a_clear_error():
    import pytest

    from milo_ray.execution.workers import build_executor

    with pytest.raises(TypeError, match="neither execute"):
        build_executor({"_target_": "builtins.dict"})
