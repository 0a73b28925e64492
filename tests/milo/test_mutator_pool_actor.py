"""The mutator pool as Ray actors (milo_ray.milo.mutator_pool_actor): a run's pool actor
follows the run's assignment events, hands its seats out fairly, and is restored when
it dies; a shared account's seats are counted once for every run on the cluster.

The pool tests use specs nobody builds (no mutation runs) and a mutator name of their
own, so their accounts' detached actors never meet another test's. The slow tests run
whole MILO searches as separate drivers joined to one private Ray instance."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from milo_ray.milo.events import Init, Reassign
from milo_ray.milo.mutator_pool import account_of

RUNNER = Path(__file__).with_name("milo_seats_runner.py")


def _pool(specs: list, holder: str, max_concurrent: int = 8):
    from milo_ray.milo.mutator_pool_actor import MutatorPoolActor, PoolRef

    return PoolRef(lambda: MutatorPoolActor.remote(specs, 60.0, max_concurrent, holder))


def _account(spec: dict):
    from milo_ray.milo.mutator_pool_actor import account_seats

    label, key = account_of(spec)
    return account_seats(key, label)


async def _until(check, tries: int = 3000) -> None:
    """Ask until ``check()`` (awaitable) is true; a bound only so that a broken pool
    fails the test instead of hanging it."""
    for _ in range(tries):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the pool never reached the state the test waits for")


def test_a_pool_actor_answers_after_every_assignment_event_sent_before(ray_local):
    specs = [{"_target_": "x.M", "name": "order-a"}, {"_target_": "x.M", "name": "order-b"}]

    async def go():
        pool = _pool(specs, "order-run")
        pool.apply(Init([], [], [], [0, 1, 2], {0: "order-a", 1: "order-a", 2: "order-a"}))
        # Requests sent at once: an async actor may start them in any order.
        leases = await asyncio.gather(*(pool.acquire(j, f"m{j}") for j in range(3)))
        pool.apply(Reassign(1, "order-b", "d1"))
        again = await asyncio.gather(*(pool.acquire(j, f"n{j}") for j in range(3)))
        pool.kill()
        return [l.mutator for l in leases], [l.mutator for l in again]

    first, second = asyncio.run(go())
    assert first == ["order-a"] * 3
    assert second == ["order-a", "order-b", "order-a"]


def test_two_runs_sharing_an_account_never_hold_more_than_its_seats_and_take_turns(ray_local):
    # Two specs of one CLI binary: one account, whose two seats both runs share.
    specs = [{"_target_": "x.M", "name": "cli-one", "command": ["shared-cli", "{prompt}"], "seats": 2},
             {"_target_": "x.M", "name": "cli-two", "command": ["/opt/shared-cli"], "seats": 2}]
    assign = {0: "cli-one", 1: "cli-one", 2: "cli-two"}

    async def go():
        a, b = _pool(specs, "run-a"), _pool(specs, "run-b")
        for p in (a, b):
            p.apply(Init([], [], [], [0, 1, 2], assign))
        account = _account(specs[0])
        la = [await a.acquire(0, "a0"), await a.acquire(1, "a1")]
        more_a = asyncio.ensure_future(a.acquire(2, "a2"))  # run a asks first for a third seat ...
        await _until(lambda: _waits(account, "run-a/a2"))
        wait_b = asyncio.ensure_future(b.acquire(0, "b0"))  # ... then run b
        await _until(lambda: _waits(account, "run-b/b0"))
        assert sorted(await account.held.remote()) == ["run-a/a0", "run-a/a1"]
        assert not more_a.done() and not wait_b.done()
        await a.release(la[0])
        lb = await wait_b  # run b holds no seat: it goes before run a's third
        assert sorted(await account.held.remote()) == ["run-a/a1", "run-b/b0"] and not more_a.done()
        await b.release(lb)
        la.append(await more_a)
        for lease in la[1:]:
            await a.release(lease)
        assert await account.held.remote() == {}
        a.kill()
        b.kill()

    asyncio.run(go())


async def _waits(account, lease_id: str) -> bool:
    return lease_id in await account.waiting.remote()


def test_a_killed_pool_actor_is_restored_with_the_seats_its_driver_holds(ray_local):
    import ray

    spec = {"_target_": "x.M", "name": "killed-one", "seats": 1}

    async def go():
        pool = _pool([spec], "run-killed")
        pool.apply(Init([], [], [], [0, 1], {0: "killed-one", 1: "killed-one"}))
        first = await pool.acquire(0, "m0")
        ray.kill(pool.actor, no_restart=True)
        second = asyncio.ensure_future(pool.acquire(1, "m1"))  # meets the dead actor: a new one is started
        await _until(lambda: _pool_waits(pool, "m1"))
        assert pool.restores == 1 and not second.done()  # the restored actor counts m0's seat
        account = _account(spec)
        assert await account.held.remote() == {"run-killed/m0": "run-killed"}
        await pool.release(first)
        lease = await second
        assert await account.held.remote() == {"run-killed/m1": "run-killed"}
        await pool.release(lease)
        pool.kill()

    asyncio.run(go())


async def _pool_waits(pool, lease_id: str) -> bool:
    try:
        seats = await pool.actor.seats.remote()
    except Exception:  # the new actor may still be starting
        return False
    return any(lease_id in waiting for _, waiting in seats.values())


# --------------------------------------------------------------------------- whole runs (slow)
def _intervals(run_dir: Path) -> list[tuple[float, float, str, str]]:
    """(start, end, run, call id) of every mutator call the run's ``agent_calls`` hold."""
    import pyarrow.dataset as ds

    rows = ds.dataset(str(run_dir / "agent_calls"), format="parquet").to_table().to_pylist()
    return [(r["time"] - r["latency_s"], r["time"], r["run_id"], r["call_id"]) for r in rows if r["role"] == "mutator"]


def _peak(intervals: list[tuple[float, float, str, str]]) -> int:
    """The most intervals open at one instant (an end before a start at the same time)."""
    points = sorted([(s, 1) for s, *_ in intervals] + [(e, -1) for _, e, *_ in intervals], key=lambda p: (p[0], p[1]))
    peak = now = 0
    for _, d in points:
        now += d
        peak = max(peak, now)
    return peak


def _events(run_dir: Path) -> list[dict]:
    import pyarrow.dataset as ds

    return ds.dataset(str(run_dir / "events"), format="parquet").to_table().to_pylist()


def _mutations(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "mutations.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory):
    from milo_resume_checks import RayInstance

    ray = RayInstance(tmp_path_factory.mktemp("ray") / "ray.err")
    yield ray
    ray.close()


def _start(ray, run_dir: Path, run_id: str, *extra: str) -> subprocess.Popen:
    from milo_resume_checks import _env

    run_dir.mkdir(parents=True)
    return subprocess.Popen([sys.executable, str(RUNNER), str(run_dir), str(run_dir / "out.json"), "--ray-address",
                             ray.address, "--run-id", run_id, *extra], env=_env(ray.env()),
                            stdout=open(run_dir / "driver.log", "wb"), stderr=subprocess.STDOUT)


def _finished(proc: subprocess.Popen, run_dir: Path) -> dict:
    assert proc.wait(timeout=900) == 0, (run_dir / "driver.log").read_text()[-4000:]
    return json.loads((run_dir / "out.json").read_text())


@pytest.mark.slow
def test_two_runs_with_a_two_seat_mutator_never_run_more_than_two_mutations_at_once(tmp_path, ray_instance):
    dirs, barrier = [tmp_path / "run-a", tmp_path / "run-b"], tmp_path / "barrier"
    barrier.mkdir()
    # Both runs start their rounds together; a mutation lasts longer than an evaluation.
    procs = [_start(ray_instance, d, d.name, "--seats", "2", "--sleep", "5", "--barrier", str(barrier), "--parties", "2")
             for d in dirs]
    outs = [_finished(p, d) for p, d in zip(procs, dirs)]
    for out in outs:  # neither run starved: each ran every island's rounds
        assert out["stop"] == "finished" and set(out["rounds"].values()) == {3}, out
    intervals = [iv for d in dirs for iv in _intervals(d)]
    assert len(intervals) == 18
    peak = _peak(intervals)
    print(f"peak concurrent mutations of the 2-seat mutator over two runs: {peak} (of {len(intervals)} mutations, "
          "from agent_calls [time - latency_s, time])")
    assert peak == 2
    # The runs took turns: each started mutations while the other still had some to run.
    starts = sorted((s, run) for s, _, run, _ in intervals)
    first_half = {run for _, run in starts[: len(starts) // 2]}
    assert first_half == {"run-a", "run-b"}


@pytest.mark.slow
def test_a_killed_pool_actor_is_rebuilt_without_repeating_a_mutation(tmp_path, ray_instance):
    run_dir = tmp_path / "run"
    out = _finished(_start(ray_instance, run_dir, "killed-pool", "--seats", "2", "--sleep", "1.0",
                           "--kill-pool-after", "2"), run_dir)
    assert out["restores"] == 1
    assert out["stop"] == "finished" and set(out["rounds"].values()) == {3}, out
    assert out["assignment"] == {"0": "sleepy", "1": "sleepy", "2": "sleepy"}
    starts = [m["work"] for m in _mutations(run_dir) if m["at"] == "start"]
    assert len(starts) == len(set(starts)) == 9  # every mutation called once
    calls = [c for *_, c in _intervals(run_dir)]
    assert len(calls) == len(set(calls)) == 9
    nodes = [e for e in _events(run_dir) if e["kind"] == "milo.node"]
    node_ids = [json.loads(e["payload"])["node"]["node_id"] for e in nodes]
    assert len(node_ids) == len(set(node_ids))
    assert _peak(_intervals(run_dir)) <= 2
