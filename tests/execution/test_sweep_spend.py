"""Spend shared beyond one call: the run's counter reserves each call's upper bound (tokens
and USD) on admission and settles it to what the call was charged, so parallel calls never
together pass a cap; a capped sweep's ledger is one more such counter that every job's
gateways reserve on and charge, so at the sweep's cap every job stops.

The decision objects are tested alone; the gateways' end-to-end tests send real HTTP
through litellm to a scripted model that bills a known cost per call."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from milo_ray.boundary.gateway import run_budget
from milo_ray.boundary.gateway.run_budget import RolloutBudget, RunSpend
from milo_ray.boundary.gateway.server import ModelGateway
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

KEY_ENV = "MILO_SWEEP_SPEND_TEST_KEY"
KEY = "sk-sweep-" + uuid.uuid4().hex
# Every call bills 1,000 input and 100 output tokens at $1 / $2 per million: $0.0012.
CALL_USD = (1000 * 1.0 + 100 * 2.0) / 1e6
# A prompt of more bytes than the 1,000 tokens billed, so the gateway's bound (the request's
# bytes plus its max_tokens) is an upper bound of what the provider bills, as it is for real.
PROMPT = "again " * 200


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# --- the reservation rule --------------------------------------------------------------


def test_parallel_calls_wait_rather_than_together_pass_the_usd_cap():
    spend = RunSpend(cost_usd=1.0)
    tickets = [spend.reserve(0, 0.3) for _ in range(3)]
    assert [v for v, _ in tickets] == ["admit"] * 3
    # A fourth bound would pass the cap beside the three in flight: it waits, not admitted.
    assert spend.reserve(0, 0.3) == ("wait", None)
    spend.settle(tickets[0][1], 100, 0.05)  # settled far under its bound
    verdict, fourth = spend.reserve(0, 0.3)
    assert verdict == "admit"
    for _, ticket in (*tickets[1:], ("admit", fourth)):
        spend.settle(ticket, 100, 0.3)  # each charged its whole bound
    assert spend.cost_usd == pytest.approx(0.95) and spend.cost_usd <= spend.cost_cap
    assert spend.snapshot()["in_flight"] == 0 and spend.reserved_usd == pytest.approx(0.0)


def test_the_token_cap_reserves_too():
    spend = RunSpend(tokens=1000)
    first = spend.reserve(600, None)  # an unpriced call holds its tokens only
    assert first[0] == "admit" and spend.reserve(600, None) == ("wait", None)
    spend.release(first[1])  # never went upstream: nothing charged
    assert spend.tokens == 0 and spend.reserve(600, None)[0] == "admit"


def test_a_call_alone_that_does_not_fit_passes_the_cap_by_at_most_its_own_excess():
    spend = RunSpend(cost_usd=1.0)
    spend.add(0, 0.9)
    verdict, ticket = spend.reserve(0, 0.3)  # nothing in flight: admitted alone
    assert verdict == "admit"
    spend.settle(ticket, 10, 0.25)
    assert spend.cost_usd - spend.cost_cap == pytest.approx(0.15)  # what it cost beyond the $0.1 left
    verdict, reason = spend.reserve(0, 0.01)
    assert verdict == "refuse" and "run.budget.cost_usd" in reason


def test_a_reservation_nobody_settles_is_charged_its_bound_when_its_lease_ends():
    clock = Clock()
    spend = RunSpend(cost_usd=1.0, clock=clock)
    _, lost = spend.reserve(0, 0.6)  # its worker dies with the call in flight
    assert spend.reserve(0, 0.6) == ("wait", None)
    clock.t += run_budget.RESERVATION_LEASE_S + 1
    verdict, ticket = spend.reserve(0, 0.3)
    assert verdict == "admit" and spend.cost_usd == pytest.approx(0.6)
    spend.settle(lost, 10, 0.2)  # it was answered after all: corrected to what it cost
    assert spend.cost_usd == pytest.approx(0.2)


def test_a_sweep_refusal_releases_the_run_reservation_and_names_the_sweep_cap():
    run, sweep = RunSpend(cost_usd=10.0), RunSpend(cost_usd=1.0, scope="sweep")
    sweep.add(0, 1.0)  # the sweep's other jobs spent it
    budget = RolloutBudget([run, sweep])
    reason = asyncio.run(budget.admit(1, 100, 0.01))
    assert "hydra.launcher.max_usd" in reason and "sweep" in reason and budget.refused == reason
    assert run.snapshot()["in_flight"] == 0  # the run's reservation was given back


def test_a_call_is_settled_on_every_counter_it_reserved_on():
    run, sweep = RunSpend(cost_usd=10.0), RunSpend(cost_usd=5.0, scope="sweep")
    budget = RolloutBudget([run, sweep])
    assert asyncio.run(budget.admit(7, 1100, 0.5)) is None
    assert run.reserved_usd == sweep.reserved_usd == pytest.approx(0.5)
    budget.charge(1100, CALL_USD, key=7)
    for counter in (run, sweep):
        assert counter.cost_usd == pytest.approx(CALL_USD) and counter.snapshot()["in_flight"] == 0
        assert counter.calls == 1
    assert budget.metered == (1100, pytest.approx(CALL_USD))


def test_bad_sweep_settings_name_the_field():
    from omegaconf import OmegaConf

    from milo_ray.config.schemas import Config
    from milo_ray.config.validate import settings_problems

    cfg = OmegaConf.structured(Config)
    cfg.run.budget.sweep.ledger = "sweep-x"
    assert any("run.budget.sweep.ledger / run.budget.sweep.cost_usd" in p.key for p in settings_problems(cfg))
    cfg.run.budget.sweep.cost_usd = -1.0
    assert any(p.key == "run.budget.sweep.cost_usd=-1.0" for p in settings_problems(cfg))


# --- two jobs' gateways, one sweep ledger ------------------------------------------------


def model_cfg(url: str) -> dict:
    return {"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 30,
            "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, "max_retries": 0}


async def _caller(socket_path: str, token: str, statuses: list[int], most: int = 200) -> None:
    """One harness thread calling the model until the gateway refuses it (or, should it
    never refuse, ``most`` times: far past the budget, so the test fails fast)."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as s:
        for _ in range(most):
            async with s.post("http://gateway/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                              json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 100}) as r:
                statuses.append(r.status)
                await r.read()
                if r.status != 200:
                    return


def _two_jobs(tmp_path, url: str, sweep: object, callers: int = 6):
    """Two jobs (each its own gateway and run counter, uncapped), ``callers`` parallel harness
    threads each, every gateway reserving on and charging the one ``sweep`` ledger."""

    async def go():
        gateways, grants, statuses, loops = [], [], [], []
        for job in range(2):
            gw = ModelGateway(model_cfg(url), tmp_path / f"job{job}.sock")
            gw.set_key(KEY)
            await gw.start()
            own = RunSpend()  # the job's own run counter (no cap of its own)
            grant = gw.issue(f"job-{job}", call_cap=10_000, run_budget=RolloutBudget([own, sweep]))
            gateways.append(gw)
            grants.append(grant)
            for _ in range(callers):
                statuses.append([])
                loops.append(_caller(gw.socket_path, grant.token, statuses[-1]))
        await asyncio.wait_for(asyncio.gather(*loops), 120)
        for gw in gateways:
            await gw.close()
        return grants, statuses

    return asyncio.run(go())


def _policy(body):
    return reply("again", prompt_tokens=1000, completion_tokens=100)


def test_a_sweep_cap_stops_both_jobs_within_one_call_of_it(tmp_path):
    """12 parallel callers over two jobs: without reservations the calls in flight at the
    cap (up to 12) would all be paid; with them the sweep passes its cap by at most one
    call's cost."""
    cap = 20 * CALL_USD + CALL_USD / 2
    sweep = RunSpend(cost_usd=cap, scope="sweep")
    with ScriptedOpenAIServer(_policy) as srv:
        grants, statuses = _two_jobs(tmp_path, srv.url, sweep)
        billed = len(srv.answered)
    assert [g.stop_reason for g in grants] == ["run_budget", "run_budget"]
    assert all(st[-1] == 429 for st in statuses)
    assert billed * CALL_USD >= cap  # it was reached, not stopped short
    overshoot = billed * CALL_USD - cap
    print(f"\nsweep cap ${cap:.6f}: billed ${billed * CALL_USD:.6f} in {billed} calls; overshoot ${overshoot:.6f} "
          f"(one call ${CALL_USD:.6f})")
    assert overshoot <= CALL_USD + 1e-12
    assert sweep.calls == billed and sweep.cost_usd == pytest.approx(billed * CALL_USD)
    assert "hydra.launcher.max_usd" in sweep.exhausted


@pytest.mark.slow  # a detached actor in a local Ray cluster
def test_the_sweep_ledger_is_one_detached_actor_every_job_finds_and_a_raised_cap_pays_again(tmp_path, ray_local,
                                                                                              caplog):
    ray = ray_local
    from milo_ray.llm.rate_limit import CLUSTER_NAMESPACE

    name = f"sweep-{uuid.uuid4().hex[:8]}"
    cap = 12 * CALL_USD + CALL_USD / 2
    first = run_budget.sweep_spend(name, cap)
    found = ray.get_actor(run_budget.SWEEP_LEDGER_PREFIX + name, namespace=CLUSTER_NAMESPACE)
    with ScriptedOpenAIServer(_policy) as srv:
        grants, _ = _two_jobs(tmp_path, srv.url, first, callers=3)
        billed = len(srv.answered)
        snap = ray.get(found.snapshot.remote())
        assert [g.stop_reason for g in grants] == ["run_budget", "run_budget"]
        assert snap["calls"] == billed and snap["cost_usd"] == pytest.approx(billed * CALL_USD)
        assert cap <= billed * CALL_USD <= cap + CALL_USD + 1e-12
        # The sweep launched again (or a job resumed) with a higher cap: the same ledger,
        # found by name, pays up to the new cap -- and no further.
        raised = cap + 5 * CALL_USD
        with caplog.at_level("WARNING", logger="milo_ray.boundary.gateway.run_budget"):
            again = run_budget.sweep_spend(name, raised)
        assert any("capped at" in r.getMessage() for r in caplog.records)
        grants, _ = _two_jobs(tmp_path, srv.url, again, callers=3)
        total = len(srv.answered)
    assert total > billed and raised <= total * CALL_USD <= raised + CALL_USD + 1e-12
    ray.kill(found)  # detached: it would outlive this test's driver


@pytest.mark.slow  # two jobs' schedulers and rollout workers on a local Ray cluster
def test_two_jobs_stop_at_the_sweep_cap_with_the_sweeps_reason(ray_local):
    """Two jobs (two schedulers, two stores, no run cap of their own) of one capped sweep,
    each running two looping rollouts at once: both are stopped by the sweep's ledger, each
    batch ends in BudgetExceeded naming the sweep's cap (the run then stops as at its own
    budget, resumable), and together they pay the cap plus at most one call."""
    import threading

    from milo_ray.core.rollouts import RolloutRequest
    from milo_ray.core.tasks import Task
    from milo_ray.execution.budget import BudgetExceeded, BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.harness.model import Harness
    from milo_ray.store import MemoryRunStore

    ray = ray_local
    h = Harness.from_source("def build_agent(model, backend):\n    return None\n")
    tasks = {t: Task(t, "search", "loop", 60.0, 10**9, {}) for t in ("a", "b")}
    name = f"sweep-{uuid.uuid4().hex[:8]}"
    cap = 12 * CALL_USD + CALL_USD / 2
    stores = [MemoryRunStore(run_id=f"job{i}") for i in range(2)]
    errors: list[BaseException | None] = [None, None]
    with ScriptedOpenAIServer(_policy) as srv:
        executor = {"_target_": "milo_ray.testing.gateway_loop.GatewayLoopExecutor", "model": model_cfg(srv.url),
                    "most_calls": 200}
        scheds = [RolloutScheduler(executor, tasks, store, "openai/scripted", store.run_id, budget=BudgetLedger(),
                                   progress=False, slots_per_worker=1, max_retries=0, worker_env={KEY_ENV: KEY},
                                   sweep_budget=(name, cap)) for store in stores]

        def job(i: int) -> None:
            try:
                scheds[i].add_harness(h)
                scheds[i].run([RolloutRequest(h.harness_id, t, 0, seed=i) for t in tasks])
            except BaseException as exc:  # what the job's method sees
                errors[i] = exc

        try:
            threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
        finally:
            for s in scheds:
                s.close()
        billed = len(srv.answered)
    from milo_ray.llm.rate_limit import CLUSTER_NAMESPACE

    ledger = ray.get_actor(run_budget.SWEEP_LEDGER_PREFIX + name, namespace=CLUSTER_NAMESPACE)
    snap = ray.get(ledger.snapshot.remote())
    ray.kill(ledger)
    for err, store in zip(errors, stores):
        assert isinstance(err, BudgetExceeded) and "hydra.launcher.max_usd" in str(err), err
        exhausted = [e for e in store.read("events").to_pylist() if e["kind"] == "run_budget_exhausted"]
        import json

        assert exhausted and json.loads(exhausted[0]["payload"])["scope"] == "sweep"
    print(f"\ntwo jobs, sweep cap ${cap:.6f}: billed ${billed * CALL_USD:.6f} ({billed} calls); overshoot "
          f"${billed * CALL_USD - cap:.6f} (one call ${CALL_USD:.6f})")
    assert cap <= billed * CALL_USD <= cap + CALL_USD + 1e-12
    assert snap["calls"] == billed
