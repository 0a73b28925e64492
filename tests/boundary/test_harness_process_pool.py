"""The warm pool: a spare serves one rollout only, taking one starts its replacement, ``auto``
keeps as many as rollouts in flight, and opening or closing sandboxes never blocks the
event loop. A fake sandbox runs a stand-in process that says ``ready`` and waits for its
job, so these tests need neither bwrap nor the harness stack."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from milo_ray.boundary.harness_process.pool import WarmPool, parse_size
from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.runtime_code import cleanup_runtime_code

# Says ready, then exits when its stdin closes (as a warm harness process does).
STAND_IN = "import sys; print('{\"t\": \"ready\"}', flush=True); sys.stdin.read()"
# Guards against a deadlock, not a performance bound.
GIVE_UP_S = 20


class FakeSandbox:
    def __init__(self, spec, gate: threading.Event | None) -> None:
        self.spec, self.env, self.gate, self.closed = spec, {}, gate, False

    def process_command(self, argv, binds):
        return [], [], [sys.executable, "-c", STAND_IN]

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        if self.gate is not None and not self.gate.wait(GIVE_UP_S):
            raise RuntimeError("close() was never let through: the event loop was blocked")
        self.closed = True


class FakeFactory:
    """``gate``: open() and close() wait for it (set from the event loop)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate, self.opened = gate, []

    def open(self, spec, scratch):
        if self.gate is not None and not self.gate.wait(GIVE_UP_S):
            raise RuntimeError("open() was never let through: the event loop was blocked")
        sb = FakeSandbox(spec, self.gate)
        self.opened.append(sb)
        return sb


@pytest.fixture(autouse=True, scope="module")
def _runtime_code():
    yield
    cleanup_runtime_code()


SPEC = SandboxSpec(task_id="t1")


async def _until(cond, what: str) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


async def _ready(pool: WarmPool, n: int) -> None:
    await _until(lambda: pool.spares() >= n and all(s.process.ready.is_set()
                                                   for v in pool._spares.values() for s in v), f"{n} ready spares")


def test_warm_processes_takes_auto_or_a_count():
    assert parse_size("auto") == "auto" and parse_size(3) == 3 and parse_size("0") == 0
    for bad in (-1, "many", None, True):
        with pytest.raises(ValueError, match="executor.warm_processes"):
            parse_size(bad)


def test_a_spare_serves_one_rollout_only(tmp_path):
    async def go():
        pool = WarmPool(FakeFactory(), 2, str(tmp_path))
        pool.refill(SPEC)
        await _ready(pool, 2)
        a, b = await pool.take(SPEC), await pool.take(SPEC)
        assert a is not None and b is not None and a is not b
        assert a.process.proc.pid != b.process.proc.pid and a.sandbox is not b.sandbox
        held = [s for v in pool._spares.values() for s in v]
        assert a not in held and b not in held  # handed out = gone from the pool
        await _ready(pool, 2)
        c = await pool.take(SPEC)
        assert c is not None and c.sandbox not in (a.sandbox, b.sandbox)
        for s in (a, b, c):
            await s.process.finish()
        await pool.aclose()

    asyncio.run(go())


def test_taking_a_spare_starts_its_replacement(tmp_path):
    async def go():
        factory = FakeFactory()
        pool = WarmPool(factory, 1, str(tmp_path))
        assert await pool.take(SPEC) is None  # nothing yet: it starts one
        pool.release(SPEC)
        await _ready(pool, 1)
        spare = await pool.take(SPEC)
        assert spare is not None
        await _ready(pool, 1)
        assert len(factory.opened) == 2 and pool.spares() == 1
        await spare.process.finish()
        await pool.aclose()

    asyncio.run(go())


def test_auto_keeps_as_many_spares_as_rollouts_in_flight(tmp_path):
    async def go():
        pool = WarmPool(FakeFactory(), "auto", str(tmp_path), max_starting=2)
        first = await asyncio.gather(*(pool.take(SPEC) for _ in range(3)))  # three at once
        assert pool.target(next(iter(pool._shapes))) == 3
        for s in first:
            if s is not None:
                await s.process.finish()
            pool.release(SPEC)
        await _ready(pool, 3)
        taken = [await pool.take(SPEC) for _ in range(3)]
        assert all(taken) and len({id(t) for t in taken}) == 3
        await _ready(pool, 3)  # replaced, still three
        for t in taken:
            await t.process.finish()
        await pool.aclose()

    asyncio.run(go())


def test_a_rollout_waits_for_the_spare_being_opened_instead_of_starting_its_own(tmp_path):
    async def go():
        gate = threading.Event()
        factory = FakeFactory(gate)
        pool = WarmPool(factory, 1, str(tmp_path))
        pool.refill(SPEC)  # opening, held at the gate
        taking = asyncio.ensure_future(pool.take(SPEC))
        await asyncio.sleep(0.05)
        assert not taking.done()
        gate.set()
        spare = await asyncio.wait_for(taking, GIVE_UP_S)
        assert spare is not None and spare.sandbox is factory.opened[0]
        await spare.process.finish()
        await pool.aclose()

    asyncio.run(go())


def test_refill_and_discard_never_block_the_event_loop(tmp_path):
    """open() and close() wait for an event only the event loop sets: run on the loop,
    they would never return."""

    async def go():
        gate = threading.Event()
        pool = WarmPool(FakeFactory(gate), 1, str(tmp_path))
        pool.refill(SPEC)
        await asyncio.sleep(0.05)
        gate.set()  # reached only while open() waits in its thread
        await _ready(pool, 1)
        gate.clear()
        spare = next(s for v in pool._spares.values() for s in v)
        spare.process.kill()  # a dead spare is discarded on the next take
        await _until(lambda: not spare.process.alive(), "the spare to die")
        await pool.take(SPEC)
        await asyncio.sleep(0.05)
        assert not spare.sandbox.closed
        gate.set()
        await _until(lambda: spare.sandbox.closed, "the discarded sandbox to close")
        await pool.aclose()

    asyncio.run(go())
