"""RolloutScheduler on a local Ray instance: cache, budget, retries, caps, streaming.

One scheduler serves most tests (starting workers costs time on a 2-core machine);
its SleepExecutor reads each task's behaviour from the task metadata.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import ray

from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.tasks import Task
from milo_ray.execution.budget import BudgetExceeded, BudgetLedger
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.harness.model import Harness
from milo_ray.store import MemoryRunStore

EXECUTOR = {"_target_": "milo_ray.execution.fake.SleepExecutor", "seconds": 0.05}
H_A = Harness.from_source("def build_agent(model, backend):\n    return 'a'\n")
H_B = Harness.from_source("def build_agent(model, backend):\n    return 'b'\n")
TASKS = {
    t.task_id: t
    for t in [
        Task("fast", "search", "x", 30.0, 1000, {"sleep_s": 0.0}),
        Task("mid", "search", "x", 30.0, 1000, {"sleep_s": 0.25}),
        Task("slow", "search", "x", 30.0, 1000, {"sleep_s": 0.8}),
        Task("crash", "search", "x", 30.0, 1000, {"crash_rate": 1.0}),
        Task("fail", "search", "x", 30.0, 1000, {"fail_rate": 1.0}),
        Task("hang", "search", "x", 0.2, 1000, {"sleep_s": 30.0}),
    ]
}


def _req(task_id: str, idx: int = 0, harness: Harness = H_A, **kw) -> RolloutRequest:
    return RolloutRequest(harness.harness_id, task_id, idx, seed=11, **kw)


# The module's shared scheduler holds the instance's sandbox slots while it lives; the
# tests' own schedulers run on a slot resource no node declares (a pinned worker that
# claims nothing), so they never queue behind it.
UNCLAIMED = "slot_resource_no_node_declares"


def _scheduler(store, **kw) -> RolloutScheduler:
    kw.setdefault("progress", False)
    kw.setdefault("slot_resource", UNCLAIMED)
    s = RolloutScheduler(EXECUTOR, TASKS, store, model_id="m", run_id=store.run_id, **kw)
    s.add_harness(H_A)
    s.add_harness(H_B)
    return s


def _events(store, kind: str) -> list[dict]:
    rows = store.read("events").to_pylist()
    return [json.loads(r["payload"]) for r in rows if r["kind"] == kind]


@pytest.fixture(scope="module")
def shared(ray_local):
    store = MemoryRunStore(run_id="sched-tests")
    sched = _scheduler(store, group_limits={"cap2": 2, "cap3": 3}, max_retries=2, retry_backoff_s=0.01,
                       slot_resource="sandbox_slot")
    yield sched, store
    sched.close()


def test_batch_over_the_execution_budget_is_refused_before_anything_runs():
    store = MemoryRunStore(run_id="refuse")
    sched = _scheduler(store, budget=BudgetLedger(executions=3))
    with pytest.raises(BudgetExceeded):
        sched.run([_req("fast", i) for i in range(4)])
    assert store.read("rollouts").num_rows == 0
    assert sched.worker_actors() == {}  # no worker was even started
    assert sched.budget.executions_used == 0 and sched.budget.reserved == 0
    sched.close()


def test_executions_are_exact_and_concurrent_duplicates_run_once(ray_local):
    store = MemoryRunStore(run_id="exact")
    sched = _scheduler(store, budget=BudgetLedger(executions=30))
    batches = [[_req("fast", i) for i in range(0, 12)], [_req("fast", i) for i in range(6, 20)],
               [_req("fast", i) for i in range(10, 20)] * 2]

    async def main():
        return await asyncio.gather(*(sched.arun(b) for b in batches))

    out = asyncio.run(main())
    assert [len(o) for o in out] == [len(b) for b in batches]
    keys = store.read("rollouts").column("cache_key").to_pylist()
    assert len(keys) == len(set(keys)) == 20
    assert sched.budget.executions_used == 20 and sched.budget.remaining_executions() == 10
    assert out[1][0] is out[0][6]  # the shared execution's result
    with pytest.raises(BudgetExceeded):
        sched.run([_req("fast", i) for i in range(20, 31)])
    assert store.read("rollouts").num_rows == 20
    # Work outside the run's budget (e.g. a final evaluation) is tallied apart.
    sched.run([_req("fast", i) for i in range(20, 31)], count_budget=False)
    assert sched.budget.executions_used == 20 and sched.uncounted.executions_used == 11
    sched.close()

    # Resume: a new scheduler over the same store serves everything stored without
    # executing -- its budget (charged with the 20 budgeted rollouts; the 11 run outside
    # the budget are not charged) has no execution left, and no worker starts.
    again = _scheduler(store, budget=BudgetLedger(executions=20))
    assert again.budget.executions_used == 20
    served = again.run([_req("fast", i) for i in range(20)])
    assert [r.cache_key for r in served] == [r.cache_key for r in out[0] + out[1][6:]]
    assert again.worker_actors() == {} and store.read("rollouts").num_rows == 31
    assert again.cached(_req("fast", 3)).score == 1.0 and again.cached(_req("fast", 99)) is None
    again.close()


def test_results_carry_bookkeeping_and_traces_move_to_blobs(shared):
    sched, store = shared
    (r,) = sched.run([_req("fast", 0, method="milo", round=4, stage="s1", group="g")])
    assert (r.run_id, r.method, r.round, r.stage, r.split) == ("sched-tests", "milo", 4, "s1", "search")
    assert r.node and r.finished_at >= r.started_at > 0 and r.attempts == 1
    assert r.cache_key == _req("fast", 0).key("m") and r.trace is None
    assert store.get_blob(r.trace_ref)["ctrf"]["results"]["summary"]["tests"] == 1


def test_executor_raising_is_retried_then_recorded_as_infra(shared):
    sched, store = shared
    crash, fail = sched.run([_req("crash", 0), _req("fail", 0)])
    assert crash.error_kind == "infra" and crash.attempts == 3 and crash.score == 0.0
    retries = [e for e in _events(store, "rollout_retry") if e["cache_key"] == crash.cache_key]
    assert [e["attempt"] for e in retries] == [1, 2]
    # A harness failure is a score: returned once, never retried.
    assert fail.error_kind == "harness" and fail.attempts == 1
    assert not [e for e in _events(store, "rollout_retry") if e["cache_key"] == fail.cache_key]


def test_killed_worker_rollouts_are_retried_on_a_new_worker(shared):
    sched, store = shared
    requests = [_req("slow", i) for i in range(12)]

    async def main():
        run = asyncio.ensure_future(sched.arun(requests))
        while sched.progress.running < 8:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        (actor,) = sched.worker_actors().values()
        ray.kill(actor)
        return await run

    results = asyncio.run(main())
    assert all(r.error_kind is None and r.score == 1.0 for r in results)
    retried = {r.cache_key for r in results if r.attempts == 2}
    assert len(retried) >= 1
    events = {e["cache_key"] for e in _events(store, "rollout_retry") if "worker lost" in e["error"]}
    assert retried == events & {r.cache_key for r in results}
    assert _events(store, "rollout_worker_lost")


def test_group_caps_bound_rollouts_in_flight_per_group(shared):
    sched, store = shared
    requests = [_req("mid", i, H_A, group="cap2") for i in range(6)]
    requests += [_req("mid", i, H_B, group="cap3") for i in range(6)]
    results = sched.run(requests)
    seen = {"cap2": 0, "cap3": 0}
    for req, r in zip(requests, results):
        in_flight = store.get_blob(r.trace_ref)["trajectory"]["in_flight_same_harness"]
        seen[req.group] = max(seen[req.group], in_flight)
    assert seen == {"cap2": 2, "cap3": 3}


def test_a_raised_group_limit_starts_queued_rollouts_at_once(shared):
    sched, _ = shared
    sched.set_group_limit("grow", 1)
    requests = [_req("slow", i, group="grow") for i in range(200, 204)]

    async def main():
        run = asyncio.ensure_future(sched.arun(requests))
        while sched.progress.running < 1:
            await asyncio.sleep(0.01)
        assert sched.progress.running == 1  # the limit holds the other three back
        sched.set_group_limit("grow", 4)
        return await run

    first, *rest = asyncio.run(main())
    # They started while the first was still running: the new limit did not wait for
    # a slot to free up before it took effect.
    assert all(r.started_at < first.finished_at for r in rest)
    sched.set_group_limit("grow", None)
    assert "grow" not in sched.group_limits and sched.group_limits["cap2"] == 2


def test_group_limits_change_only_through_the_setter_and_bad_values_are_named():
    sched = _scheduler(MemoryRunStore(run_id="limits"), group_limits={"a": 2}, default_group_limit=3)
    with pytest.raises(TypeError, match="set_group_limit"):
        sched.group_limits["a"] = 5
    for bad in (0, -2, 1.5, "3"):
        with pytest.raises(ValueError, match="limit of group 'a'"):
            sched.set_group_limit("a", bad)
    with pytest.raises(ValueError, match="group="):
        sched.set_group_limit(7, 2)
    sched.set_group_limit("b", 4)
    assert dict(sched.group_limits) == {"a": 2, "b": 4} and sched.default_group_limit == 3
    with pytest.raises(ValueError, match="default_group_limit"):
        _scheduler(MemoryRunStore(run_id="limits"), default_group_limit=0)
    sched.close()


def test_rollout_past_its_time_cap_is_recorded_timed_out(shared):
    sched, _ = shared
    (r,) = sched.run([_req("hang", 0)])
    assert r.timed_out and r.score == 0.0 and r.error_kind is None and r.attempts == 1


def test_astream_yields_results_in_completion_order(shared):
    sched, _ = shared

    async def main():
        return [r async for r in sched.astream([_req("slow", 100), _req("fast", 100), _req("mid", 100)])]

    order = asyncio.run(main())
    assert [r.task_id for r in order] == ["fast", "mid", "slow"]


def test_sync_run_inside_a_running_loop_is_a_clear_error():
    sched = _scheduler(MemoryRunStore(run_id="loop"))

    async def main():
        sched.run([_req("fast")])

    with pytest.raises(RuntimeError, match="await scheduler.arun"):
        asyncio.run(main())
    sched.close()


def test_unknown_harness_or_task_is_a_value_error():
    sched = _scheduler(MemoryRunStore(run_id="names"))
    with pytest.raises(ValueError, match="add_harness"):
        sched.run([RolloutRequest("nope", "fast", 0, 1)])
    with pytest.raises(ValueError, match="task 'nope'"):
        sched.run([_req("nope")])
    sched.close()


def test_token_cap_stops_new_rollouts_and_keeps_finished_ones(ray_local):
    store = MemoryRunStore(run_id="tokens")
    executor = {"_target_": "milo_ray.execution.fake.SleepExecutor", "input_tokens": 7, "output_tokens": 3}
    sched = RolloutScheduler(executor, TASKS, store, model_id="m", run_id="tokens", progress=False,
                             budget=BudgetLedger(tokens=50), default_group_limit=1, slot_resource=UNCLAIMED)
    sched.add_harness(H_A)
    with pytest.raises(BudgetExceeded) as info:
        sched.run([_req("fast", i) for i in range(9)])
    # One at a time (group limit 1): the fifth result reaches 50 tokens, nothing starts after it.
    assert sorted(info.value.partial) == [0, 1, 2, 3, 4]
    assert store.read("rollouts").num_rows == 5 and sched.budget.tokens_used == 50
    assert sched.budget.executions_used == 5 and sched.budget.reserved == 0
    with pytest.raises(BudgetExceeded):
        sched.run([_req("fast", 20)])
    assert sched.run([_req("fast", 0)])[0].score == 1.0  # cached results are still served
    sched.close()


def test_model_prices_cost_unpriced_results_and_the_usd_cap_stops_new_rollouts(ray_local):
    store = MemoryRunStore(run_id="usd")
    # 7 input + 3 output tokens at $2 / $10 per million tokens: $0.000044 per rollout.
    executor = {"_target_": "milo_ray.execution.fake.SleepExecutor", "input_tokens": 7, "output_tokens": 3}
    sched = RolloutScheduler(executor, TASKS, store, model_id="m", run_id="usd", progress=False,
                             budget=BudgetLedger(cost_usd=0.000044 * 3), default_group_limit=1,
                             usd_per_mtok=(2.0, 10.0), slot_resource=UNCLAIMED)
    sched.add_harness(H_A)
    with pytest.raises(BudgetExceeded) as info:
        sched.run([_req("fast", i) for i in range(6)])
    assert sorted(info.value.partial) == [0, 1, 2]
    costs = store.read("rollouts").column("cost_usd").to_pylist()
    assert costs == pytest.approx([0.000044] * 3)
    sched.close()
    # An executor that prices its own rollouts keeps its price.
    priced = {"_target_": "milo_ray.execution.fake.SleepExecutor", "input_tokens": 7, "output_tokens": 3,
              "cost_usd": 0.5}
    sched = RolloutScheduler(priced, TASKS, MemoryRunStore(run_id="own"), model_id="m", run_id="own", progress=False,
                             usd_per_mtok=(2.0, 10.0), slot_resource=UNCLAIMED)
    sched.add_harness(H_A)
    assert sched.run([_req("fast", 0)])[0].cost_usd == 0.5
    sched.close()
