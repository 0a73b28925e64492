"""The run's USD budget holds inside running rollouts: one counter shared by every worker's
gateway, asked before each model call and charged after it with the gateway's own metered
cost. Against a scripted model that bills a known cost per call and a real local Ray."""

from __future__ import annotations

import asyncio
import shutil
import uuid

import pytest

from milo_ray.execution.budget import BudgetExceeded, BudgetLedger
from milo_ray.boundary.gateway.run_budget import RolloutBudget, RunSpend, start_run_spend
from milo_ray.boundary.gateway.server import ModelGateway
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

KEY_ENV = "MILO_RUN_BUDGET_TEST_KEY"
KEY = "sk-budget-" + uuid.uuid4().hex
# Every call bills 1,000 input and 100 output tokens at $1 / $2 per million: $0.0012.
CALL_USD = (1000 * 1.0 + 100 * 2.0) / 1e6


def _policy(body):
    return reply("again", prompt_tokens=1000, completion_tokens=100)


def model_cfg(url: str) -> dict:
    return {"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 30,
            "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, "max_retries": 0}


# --- the decision object --------------------------------------------------------------


def test_the_counter_refuses_once_a_cap_is_reached_and_stays_refusing():
    spend = RunSpend(cost_usd=3 * CALL_USD)
    for _ in range(3):
        assert spend.admit() is None
        spend.charge(1100, CALL_USD)
    assert "run.budget.cost_usd" in spend.admit()
    # Latched: spend only grows, so the run never pays again.
    spend.add(0, 0.0)
    assert spend.admit() is not None and spend.snapshot()["refused"] == 2


def test_the_token_cap_stops_calls_too_and_bad_caps_name_the_field():
    spend = RunSpend(tokens=2000)
    spend.charge(1100, None)  # an unpriced call still counts its tokens
    assert spend.admit() is None
    spend.charge(1100, None)
    assert "run.budget.tokens" in spend.admit()
    with pytest.raises(ValueError, match="run.budget.cost_usd"):
        RunSpend(cost_usd=-1)


def test_the_ledger_pushes_only_the_spend_the_gateways_did_not_meter():
    counter = RunSpend(cost_usd=1.0)
    ledger = BudgetLedger(executions=10, cost_usd=1.0)
    ledger.restore(executions=1, tokens=100, cost_usd=0.25)  # stored before this session
    ledger.share(counter)
    assert counter.cost_usd == pytest.approx(0.25)
    ledger.charge(tokens=10, cost_usd=0.05)  # a search agent's call: no gateway saw it
    ledger.reserve(2)
    ledger.commit(tokens=1100, cost_usd=0.3, metered=(1100, 0.3))  # charged call by call already
    ledger.commit(tokens=50, cost_usd=0.1)  # an executor without a gateway
    assert counter.cost_usd == pytest.approx(0.25 + 0.05 + 0.1)
    assert ledger.cost_used_usd == pytest.approx(0.25 + 0.05 + 0.3 + 0.1)
    assert not ledger.spend_exhausted()
    ledger.mark_exhausted("the run's USD budget is spent")
    assert ledger.spend_exhausted() and not ledger.can_afford(1)


# --- two gateways, one counter, a real Ray actor --------------------------------------


async def _loop_calls(socket_path: str, token: str, statuses: list[int], most: int = 100) -> None:
    """A harness loop that calls the model until the gateway refuses it (or, should the
    gateway never refuse, ``most`` times: far past the budget, so the test fails fast)."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as s:
        for _ in range(most):
            async with s.post("http://gateway/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                              json={"messages": [{"role": "user", "content": "again"}]}) as r:
                statuses.append(r.status)
                await r.read()
                if r.status != 200:
                    return


def test_two_gateways_share_the_run_budget_and_stop_paying_within_the_bound(tmp_path, ray_local):
    cap = 10 * CALL_USD + CALL_USD / 2
    counter = start_run_spend(None, cap)

    async def go(srv):
        gateways, grants = [], []
        for i in range(2):
            gw = ModelGateway(model_cfg(srv.url), tmp_path / f"gw{i}.sock")
            gw.set_key(KEY)
            await gw.start()
            gateways.append(gw)
            grants.append(gw.issue(f"rollout-{i}", call_cap=10_000, run_budget=RolloutBudget(counter)))
        statuses: list[list[int]] = [[], []]
        await asyncio.wait_for(asyncio.gather(*(_loop_calls(gw.socket_path, g.token, st)
                                                for gw, g, st in zip(gateways, grants, statuses))), 60)
        for gw in gateways:
            await gw.close()
        return grants, statuses

    with ScriptedOpenAIServer(_policy) as srv:
        grants, statuses = asyncio.run(go(srv))
        billed = len(srv.answered)
    snap = counter.snapshot.remote()
    import ray

    snap = ray.get(snap)
    # Both loops were stopped by the run's budget, not by a cap of their own.
    assert [g.stop_reason for g in grants] == ["run_budget", "run_budget"]
    assert [st[-1] for st in statuses] == [429, 429]
    # The bound: the counter reached the cap, and beyond it only the calls already in
    # flight were paid (one per loop: each calls the model one call at a time).
    assert billed * CALL_USD >= cap
    assert billed * CALL_USD <= cap + 2 * CALL_USD
    # The gateways' own metering is what was charged, and what the provider billed.
    assert snap["calls"] == billed == sum(len(g.calls) for g in grants)
    assert snap["cost_usd"] == pytest.approx(billed * CALL_USD)
    assert snap["exhausted"] is not None


# --- the worker: which rollouts carry the run's budget ---------------------------------


class _SeesBudget:
    """An executor that reports the run budget its rollout was given."""

    async def aexecute(self, harness, task, rollout_idx, seed):
        from milo_ray.boundary.gateway.run_budget import current_rollout_budget
        from milo_ray.core.rollouts import RolloutResult

        budget = current_rollout_budget.get()
        if budget is not None:
            budget.charge(1100, CALL_USD)  # what a gateway does for each call
        return RolloutResult(harness.harness_id, task.task_id, rollout_idx, score=float(budget is not None))


def test_only_budgeted_rollouts_carry_the_run_budget_and_their_metered_spend_comes_back():
    from milo_ray.core.tasks import Task
    from milo_ray.execution.workers import WorkerCore
    from milo_ray.harness.model import Harness

    harness = Harness.from_source("def build_agent(model, backend):\n    return None\n")
    task = Task("t", "search", "do it", 30.0, 1000, {})
    core = WorkerCore(_SeesBudget(), slots=2, time_cap_grace=1.25)
    core.run_budget = counter = RunSpend(cost_usd=1.0)

    async def go():
        items = [(0, harness.harness_id, "t", 0, 1), (1, harness.harness_id, "t", 1, 1)]
        await core.submit(items, {harness.harness_id: harness}, {"t": task}, unbudgeted=[1])
        out = []
        while len(out) < 2:
            out += await core.poll(5.0)
        return {o.item_id: o for o in out}

    by_id = asyncio.run(go())
    assert by_id[0].result.score == 1.0 and by_id[0].metered == (1100, pytest.approx(CALL_USD))
    # A final evaluation (unbudgeted) is never refused nor charged to the run.
    assert by_id[1].result.score == 0.0 and by_id[1].metered == (0, 0.0)
    assert counter.calls == 1


# --- the scheduler, two workers, one counter; resume ----------------------------------


def _loop_scheduler(srv, store, cap, tasks, slots_per_worker=1):
    from milo_ray.execution.scheduler import RolloutScheduler

    executor = {"_target_": "milo_ray.testing.gateway_loop.GatewayLoopExecutor", "model": model_cfg(srv.url),
                "most_calls": 40}
    # One slot per worker: the two rollouts run on two workers (two processes, two gateways).
    return RolloutScheduler(executor, tasks, store, "openai/scripted", "budget", budget=BudgetLedger(cost_usd=cap),
                            progress=False, slots_per_worker=slots_per_worker, max_retries=0,
                            worker_env={KEY_ENV: KEY})


def _stopped_batch(sched, requests):
    with pytest.raises(BudgetExceeded) as stopped:
        sched.run(requests)
    return [stopped.value.partial[i] for i in range(len(requests))]


def test_running_rollouts_stop_at_the_run_budget_and_a_resumed_run_starts_from_the_stored_spend(ray_local):
    from milo_ray.core.rollouts import RolloutRequest
    from milo_ray.core.tasks import Task
    from milo_ray.harness.model import Harness
    from milo_ray.store import MemoryRunStore

    h = Harness.from_source("def build_agent(model, backend):\n    return None\n")
    # The time cap only bounds a hang: the budget must be what stops the looping rollouts, also on
    # a machine so loaded that 60 s would end them first.
    tasks = {t: Task(t, "search", "loop", 600.0, 10**9, {}) for t in ("a", "b")}
    store = MemoryRunStore(run_id="budget")
    cap = 8 * CALL_USD + CALL_USD / 2
    with ScriptedOpenAIServer(_policy) as srv:
        sched = _loop_scheduler(srv, store, cap, tasks)
        try:
            sched.add_harness(h)
            # Both rollouts are running when the budget runs out: the batch is cut short
            # (BudgetExceeded), and each result is recorded as a score.
            first = _stopped_batch(sched, [RolloutRequest(h.harness_id, t, 0, seed=1) for t in tasks])
            paid_first = len(srv.answered)
            with pytest.raises(BudgetExceeded):  # nothing new starts
                sched.run([RolloutRequest(h.harness_id, "a", 1, seed=1)])
            # A final evaluation runs outside the budget: never refused, never charged.
            final = sched.run([RolloutRequest(h.harness_id, "a", 9, seed=1)], count_budget=False)
            exhausted_by = sched.budget.exhausted_by
        finally:
            sched.close()

        # Resume with a larger cap: the counter starts from the stored spend, so only the
        # new headroom (about three calls) is paid for, not the whole new cap.
        cap2 = cap + 3 * CALL_USD
        resumed = _loop_scheduler(srv, store, cap2, tasks, slots_per_worker=2)  # one worker: starts faster
        try:
            resumed.add_harness(h)
            again = _stopped_batch(resumed, [RolloutRequest(h.harness_id, t, 2, seed=1) for t in tasks])
        finally:
            resumed.close()
        paid_total = len(srv.answered) - 40  # less the final evaluation's 40 calls

    for res in first + again:
        assert res.trace is None and res.error_kind is None and res.score == 0.0  # a score, not a crash
        assert store.get_blob(res.trace_ref)["trajectory"]["final"]["status"] == "run_budget"
    assert store.get_blob(final[0].trace_ref)["trajectory"]["final"]["status"] == "call_cap"
    assert exhausted_by is not None and "run.budget.cost_usd" in exhausted_by
    assert [e for e in store.read("events").to_pylist() if e["kind"] == "run_budget_exhausted"]
    # Within the bound: the cap, plus one call in flight per looping rollout.
    assert cap <= paid_first * CALL_USD <= cap + 2 * CALL_USD
    assert cap2 <= paid_total * CALL_USD <= cap2 + 2 * CALL_USD
    # What the budgeted rollouts recorded is what the provider billed for them.
    stored = [r for r in store.read("rollouts").to_pylist() if r["budgeted"]]
    assert sum(r["cost_usd"] for r in stored) == pytest.approx(paid_total * CALL_USD)


# --- whole rollouts: harness processes in bwrap -----------------------------------------


SANDBOX = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}


def _scheduler(srv, suite, store, cap):
    from milo_ray.execution.scheduler import RolloutScheduler

    executor = {"_target_": "milo_ray.execution.agent_executor.AgentExecutor", "model": model_cfg(srv.url),
                "sandbox": SANDBOX, "max_model_calls": 10_000}
    # One slot per worker: the two rollouts run on two workers (two processes, two gateways).
    return RolloutScheduler(executor, {t.task_id: t for t in suite.tasks("test")}, store, "openai/scripted", "budget",
                            budget=BudgetLedger(cost_usd=cap), progress=False, slots_per_worker=1, max_retries=0,
                            worker_env={KEY_ENV: KEY})


@pytest.mark.slow  # two cold harness processes on two Ray workers (about a minute on 2 cores)
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_sandboxed_harness_loops_stop_at_the_run_budget(tmp_path, ray_local):
    from hostile import CALL_LOOP, make_secret_task

    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.core.rollouts import RolloutRequest
    from milo_ray.store import MemoryRunStore

    make_secret_task(tmp_path / "tasks", "a")
    make_secret_task(tmp_path / "tasks", "b")
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    store = MemoryRunStore(run_id="budget")
    cap = 8 * CALL_USD + CALL_USD / 2
    with ScriptedOpenAIServer(_policy) as srv:
        sched = _scheduler(srv, suite, store, cap)
        try:
            sched.add_harness(CALL_LOOP)
            results = _stopped_batch(sched, [RolloutRequest(CALL_LOOP.harness_id, t, 0, seed=1) for t in ("a", "b")])
        finally:
            sched.close()
        paid = len(srv.answered)
    for res in results:
        trace = store.get_blob(res.trace_ref)
        assert trace["trajectory"]["final"]["status"] == "run_budget", res.error
        assert res.error_kind is None and res.score == 0.0
    assert cap <= paid * CALL_USD <= cap + 2 * CALL_USD
    assert sum(r.cost_usd for r in results) == pytest.approx(paid * CALL_USD)


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


# --- a method whose wave the budget cut short stops cleanly ------------------------------


class _BudgetStopsSecondWave:
    """Stands in for the rollout scheduler: answers the first wave, then the run's budget
    stops the second midway (as the gateway's counter does)."""

    def __init__(self) -> None:
        self.waves = 0

    def add_harness(self, h) -> None:
        pass

    def run(self, requests):
        from milo_ray.core.rollouts import RolloutResult

        self.waves += 1
        results = {i: RolloutResult(r.harness_id, r.task_id, r.rollout_idx, score=1.0) for i, r in enumerate(requests)}
        if self.waves == 2:
            raise BudgetExceeded("the run's token/USD budget stopped rollouts midway", partial=results)
        return list(results.values())


def test_eval_stops_with_its_budget_status_when_the_budget_cuts_a_wave_short(tmp_path):
    import time

    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.evaluation import EvalMethod
    from milo_ray.store import MemoryRunStore

    sched = _BudgetStopsSecondWave()
    ctx = RunContext(run_id="t", run_dir=tmp_path, seed=0, store=MemoryRunStore(run_id="t"),
                     benchmark=SurrogateBenchmark(preset="surrogate_deepswe", seed=0), scheduler=sched, model_id="m",
                     deadline=time.monotonic() + 3600)
    summary = EvalMethod(k=3, split="test", names=["minimal"]).run(ctx)
    assert sched.waves == 2
    assert (summary["k"], summary["k_requested"], summary["stop_reason"]) == (1, 3, "budget")
    assert summary["harnesses"][0]["k"] == 1
