"""WorkerCore under concurrency: shipping races, busy executor threads, harnesses that exit."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.execution.fake import SleepExecutor
from milo_ray.execution.workers import WorkerCore
from milo_ray.harness.model import Harness

H1 = Harness.from_source("def build_agent(model, backend):\n    return 1\n")
H2 = Harness.from_source("def build_agent(model, backend):\n    return 2\n")


def _task(name: str, cap: float = 30.0, **metadata) -> Task:
    return Task(name, "search", "do it", cap, 1000, metadata)


async def _collect(core: WorkerCore, n: int) -> list:
    out: list = []
    while len(out) < n:
        out += await core.poll(5.0)
    return out


def _run(coro):
    """asyncio.run, but an exception that escapes the event loop fails the test instead
    of ending the test session (KeyboardInterrupt) or being mistaken for an exit."""
    try:
        return asyncio.run(coro)
    except (SystemExit, KeyboardInterrupt) as exc:
        pytest.fail(f"the worker's event loop died with {type(exc).__name__}")


def _gated_ref(ray, value):
    """An ObjectRef that resolves to ``value`` only once the returned gate is opened."""

    @ray.remote
    class Gate:
        def __init__(self) -> None:
            self.opened = asyncio.Event()

        async def open(self) -> None:
            self.opened.set()

        async def value_when_open(self, v):
            await self.opened.wait()
            return v

    gate = Gate.remote()
    return gate, gate.value_when_open.remote(value)


# --- 1. a harness or task still being fetched -----------------------------------------


def test_concurrent_submit_waits_for_a_harness_still_being_fetched(ray_local):
    ray = ray_local
    t = _task("t")

    async def main():
        core = WorkerCore(SleepExecutor(), slots=4, time_cap_grace=1.25)
        gate, ref = _gated_ref(ray, H2)
        # The driver ships H2 with the first submit and marks it shipped, so the second
        # submit names H2 without a ref while the worker is still fetching it.
        first = asyncio.ensure_future(core.submit([(0, H2.harness_id, "t", 0, 1)], {H2.harness_id: ref}, {"t": t}))
        await asyncio.sleep(0)
        await core.submit([(1, H2.harness_id, "t", 1, 1)], {}, {})
        await asyncio.sleep(0.05)  # let the second submit's rollout look for H2
        await gate.open.remote()
        await first
        return await _collect(core, 2)

    outcomes = _run(main())
    assert [o.infra_error for o in outcomes] == [None, None]
    assert {o.result.harness_id for o in outcomes} == {H2.harness_id}
    assert all(o.result.score == 1.0 for o in outcomes)


def test_concurrent_submit_finds_a_task_shipped_with_a_harness_still_being_fetched(ray_local):
    ray = ray_local
    t1, t2 = _task("t1"), _task("t2")

    async def main():
        core = WorkerCore(SleepExecutor(), slots=4, time_cap_grace=1.25)
        await core.submit([(0, H1.harness_id, "t1", 0, 1)], {H1.harness_id: H1}, {"t1": t1})
        gate, ref = _gated_ref(ray, H2)
        # t2 travels with a submit that is fetching H2; a concurrent submit for the
        # already-known H1 names t2 as shipped.
        first = asyncio.ensure_future(core.submit([(1, H2.harness_id, "t2", 0, 1)], {H2.harness_id: ref}, {"t2": t2}))
        await asyncio.sleep(0)
        await core.submit([(2, H1.harness_id, "t2", 0, 1)], {}, {})
        await asyncio.sleep(0.05)
        await gate.open.remote()
        await first
        return await _collect(core, 3)

    by_id = {o.item_id: o for o in _run(main())}
    assert [by_id[i].infra_error for i in range(3)] == [None, None, None]
    assert (by_id[1].result.harness_id, by_id[1].result.task_id) == (H2.harness_id, "t2")
    assert (by_id[2].result.harness_id, by_id[2].result.task_id) == (H1.harness_id, "t2")


# --- 2. the time cap and executor threads held by hung calls ---------------------------


class _GatedExecutor:
    """Blocking execute(): tasks with metadata ``hang`` block until ``release`` is set."""

    aexecute = None

    def __init__(self) -> None:
        self.release = threading.Event()
        self.ran: list[str] = []
        self.started_at: dict[str, float] = {}

    def execute(self, harness, task, rollout_idx, seed):
        self.ran.append(task.task_id)
        self.started_at[task.task_id] = time.time()
        if task.metadata.get("hang"):
            self.release.wait(30.0)
        return RolloutResult(harness.harness_id, task.task_id, rollout_idx, 1.0)


def _hung_then(ex: _GatedExecutor, last: Task):
    """One slot (two threads): two hung rollouts overrun a tiny cap and keep both
    threads, then ``last`` is queued behind them."""
    tasks = [_task("hang1", cap=0.02, hang=True), _task("hang2", cap=0.02, hang=True), last]
    core = WorkerCore(ex, slots=1, time_cap_grace=1.0)
    items = [(i, H1.harness_id, t.task_id, 0, 1) for i, t in enumerate(tasks)]
    return core, items, {t.task_id: t for t in tasks}


def test_rollout_that_never_got_a_thread_is_not_recorded_as_timed_out():
    ex = _GatedExecutor()
    core, items, tasks = _hung_then(ex, _task("quick", cap=0.05))

    async def main():
        await core.submit(items, {H1.harness_id: H1}, tasks)
        return await _collect(core, 3)

    try:
        by_id = {o.item_id: o for o in _run(main())}
    finally:
        ex.release.set()
    assert by_id[0].capped and by_id[1].capped
    assert "quick" not in ex.ran  # both threads were held the whole time
    quick = by_id[2]
    assert not quick.capped and quick.result is None
    assert quick.infra_error is not None and "thread" in quick.infra_error


def test_time_cap_starts_when_the_executor_call_gets_a_thread():
    ex = _GatedExecutor()
    core, items, tasks = _hung_then(ex, _task("quick", cap=30.0))

    async def main():
        await core.submit(items, {H1.harness_id: H1}, tasks)
        first = await _collect(core, 2)  # both hung rollouts capped, threads still held
        released_at = time.time()
        ex.release.set()
        return first + await _collect(core, 1), released_at

    try:
        outcomes, released_at = _run(main())
    finally:
        ex.release.set()
    by_id = {o.item_id: o for o in outcomes}
    assert by_id[0].capped and by_id[1].capped
    quick = by_id[2]
    assert quick.infra_error is None and not quick.capped and quick.result.score == 1.0
    # The rollout's clock (and its time cap) started when it ran, not when it queued.
    assert ex.started_at["quick"] >= released_at and quick.started_at >= released_at


# --- 3. a harness that exits the interpreter ------------------------------------------


_RAISE = {"SystemExit": lambda: SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt}


class _ExitingExecutor:
    """Tasks with metadata ``raise`` (an exception name in _RAISE) raise it from the executor."""

    def __init__(self, blocking: bool) -> None:
        if blocking:
            self.aexecute = None
        self.blocking = blocking

    def _go(self, harness, task, rollout_idx):
        name = task.metadata.get("raise")
        if name is not None:
            raise _RAISE[name]()
        return RolloutResult(harness.harness_id, task.task_id, rollout_idx, 1.0)

    def execute(self, harness, task, rollout_idx, seed):
        return self._go(harness, task, rollout_idx)

    async def aexecute(self, harness, task, rollout_idx, seed):
        await asyncio.sleep(0)
        return self._go(harness, task, rollout_idx)


def _exit_outcomes(executor, exc_name: str) -> dict:
    tasks = {"bad": _task("bad", **{"raise": exc_name}), "ok": _task("ok")}
    core = WorkerCore(executor, slots=2, time_cap_grace=1.25)

    async def main():
        await core.submit(
            [(0, H1.harness_id, "bad", 0, 1), (1, H1.harness_id, "ok", 0, 1)], {H1.harness_id: H1}, tasks
        )
        outcomes = await _collect(core, 2)
        # The worker still serves rollouts after the exit.
        await core.submit([(2, H1.harness_id, "ok", 1, 1)], {}, {})
        return outcomes + await _collect(core, 1)

    return {o.item_id: o for o in _run(main())}


@pytest.mark.parametrize("blocking", [True, False], ids=["execute", "aexecute"])
def test_system_exit_from_the_executor_is_a_harness_failure(blocking):
    by_id = _exit_outcomes(_ExitingExecutor(blocking), "SystemExit")
    bad = by_id[0]
    assert bad.infra_error is None and not bad.capped
    assert bad.result.error_kind == "harness" and bad.result.score == 0.0
    assert "SystemExit" in bad.result.error
    assert by_id[1].result.score == 1.0 and by_id[2].result.score == 1.0


def test_keyboard_interrupt_raised_on_an_executor_thread_is_a_harness_failure():
    by_id = _exit_outcomes(_ExitingExecutor(blocking=True), "KeyboardInterrupt")
    bad = by_id[0]
    assert bad.infra_error is None and bad.result.error_kind == "harness" and bad.result.score == 0.0
    assert by_id[1].result.score == 1.0 and by_id[2].result.score == 1.0
