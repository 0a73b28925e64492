"""Exact spend under concurrency, retries and kills: a property test over random caps
and fault schedules that drives the run's budget objects directly -- the driver's
:class:`BudgetLedger` (executions reserved and committed, failed attempts charged), the
gateways' shared :class:`RunSpend` counter, one :class:`Grant` and :class:`RolloutBudget`
per attempt -- from 64 concurrent rollouts in threads, the way the scheduler and the
workers' gateways use them.

Invariants, for every schedule:

* executions: reserved + used never exceed the cap, at any moment;
* no model call is admitted once the counter is exhausted, so tokens and USD exceed
  their caps only by calls that were already in flight when the cap was reached
  (each at most one call's size), never by a further call;
* the counter is exact: it holds every billed call once, whether its attempt
  succeeded, failed and was retried, or was killed; the ledger holds every call whose
  attempt reported back (a killed attempt's calls reach only the counter)."""

from __future__ import annotations

import asyncio
import random
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from milo_ray.execution.budget import BudgetExceeded, BudgetLedger
from milo_ray.boundary.gateway.ledger import Admission, Grant
from milo_ray.boundary.gateway.run_budget import RolloutBudget, RunSpend

ROLLOUTS = 64
MAX_CALL_TOKENS = 500
USD_PER_TOKEN = 1e-6


class Bill:
    """What the provider billed, and what reached whom (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tokens = self.reported_tokens = 0
        self.usd = 0.0
        self.admitted_after_exhaustion = 0
        # Calls whose charge found the counter exhausted: the one that reached a cap and
        # those admitted before it and charged after. Only they may carry spend past a cap.
        self.charged_at_exhaustion_tokens = 0
        self.charged_at_exhaustion_calls = 0


def _attempt(ledger: BudgetLedger, spend: RunSpend, bill: Bill, rng: random.Random, calls: int,
             fate: str) -> tuple[list[dict], tuple[int, float], bool]:
    """One attempt of one rollout: up to ``calls`` model calls through a grant. Returns
    its call rows, what its gateway charged to the counter, and whether the counter
    refused a call."""
    grant = Grant("rollout", call_cap=calls, run_budget=RolloutBudget(spend))
    loop = asyncio.new_event_loop()
    try:
        for _ in range(calls):
            admission = grant.admit()
            if not isinstance(admission, Admission):
                break
            was_exhausted = spend.exhausted is not None
            refused = loop.run_until_complete(grant.run_budget.admit())
            if refused is not None:
                grant.refuse_for_run_budget(refused, admission)
                return grant.calls, grant.run_budget.metered, True
            with bill.lock:
                bill.admitted_after_exhaustion += int(was_exhausted)
            tokens = rng.randint(1, MAX_CALL_TOKENS)
            with bill.lock:  # the provider bills it as it answers
                bill.tokens += tokens
                bill.usd += tokens * USD_PER_TOKEN
            if rng.random() < 0.3:
                threading.Event().wait(rng.random() * 0.0005)  # let other rollouts interleave
            grant.record({"input_tokens": tokens, "output_tokens": 0, "cost_usd": tokens * USD_PER_TOKEN,
                          "started_at": 0.0, "retries": 0, "error": None}, admission=admission)
            if spend.exhausted is not None:
                with bill.lock:
                    bill.charged_at_exhaustion_tokens += tokens
                    bill.charged_at_exhaustion_calls += 1
            if fate == "kill" and rng.random() < 0.5:
                break  # the worker dies mid-attempt: nothing of it reports back
    finally:
        loop.close()
    return grant.calls, grant.run_budget.metered, False


def _rollout(ledger: BudgetLedger, spend: RunSpend, bill: Bill, seed: int, schedule: list[str], calls: int,
             peak: list[int]) -> None:
    rng = random.Random(seed)
    try:
        ledger.reserve(1)
    except BudgetExceeded:
        return
    with bill.lock:
        s = ledger.snapshot()
        peak[0] = max(peak[0], s["executions_used"] + s["reserved"])
    for fate in schedule + ["ok"]:
        rows, metered, refused = _attempt(ledger, spend, bill, rng, calls, fate)
        tokens = sum(r["input_tokens"] for r in rows)
        usd = sum(r["cost_usd"] for r in rows)
        if fate == "kill":
            continue  # the scheduler retries a lost worker's rollout; its calls are unknown to the driver
        with bill.lock:
            bill.reported_tokens += tokens
        if fate == "fail" and not refused:
            ledger.charge(tokens=tokens, cost_usd=usd, metered=metered)  # SchedulerSpend.charge_failed_attempt
            continue
        if refused:
            ledger.mark_exhausted("refused")
        ledger.commit(tokens=tokens, cost_usd=usd, metered=metered)
        return
    ledger.commit()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(executions=st.integers(8, 80), tokens=st.one_of(st.none(), st.integers(1_000, 60_000)),
       usd=st.one_of(st.none(), st.floats(0.001, 0.06)), calls=st.integers(1, 6),
       fault_rate=st.floats(0.0, 0.5), seed=st.integers(0, 2**31))
def test_caps_hold_and_the_counter_is_exact_under_64_concurrent_rollouts(executions, tokens, usd, calls,
                                                                         fault_rate, seed):
    rng = random.Random(seed)
    ledger, spend, bill = BudgetLedger(executions=executions, tokens=tokens, cost_usd=usd), RunSpend(tokens, usd), Bill()
    ledger.share(spend)
    # A search agent's call charged by the driver (unmetered): pushed into the counter.
    agent_tokens = rng.randint(0, 800)
    ledger.charge(tokens=agent_tokens, cost_usd=agent_tokens * USD_PER_TOKEN)
    schedules = [[rng.choice(["fail", "kill"]) for _ in range(rng.randint(0, 2))] if rng.random() < fault_rate else []
                 for _ in range(ROLLOUTS)]
    peak = [0]
    threads = [threading.Thread(target=_rollout, args=(ledger, spend, bill, seed + i, schedules[i], calls, peak))
               for i in range(ROLLOUTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    snap = spend.snapshot()
    # Executions: never over the cap, at any moment.
    assert peak[0] <= executions and ledger.executions_used <= executions and ledger.reserved == 0
    # No call admitted once the counter was exhausted; the overrun is bounded by the
    # calls in flight when it was reached (the one that reached it included): at most
    # one per rollout, each at most one call's size.
    assert bill.admitted_after_exhaustion == 0
    assert bill.charged_at_exhaustion_calls <= ROLLOUTS
    bound = bill.charged_at_exhaustion_tokens
    if tokens is not None:
        assert snap["tokens"] <= tokens + bound + agent_tokens
    if usd is not None:
        assert snap["cost_usd"] <= usd + (bound + agent_tokens) * USD_PER_TOKEN + 1e-12
    # The counter holds every billed call once (and the driver's unmetered agent call).
    assert snap["tokens"] == bill.tokens + agent_tokens
    assert abs(snap["cost_usd"] - (bill.usd + agent_tokens * USD_PER_TOKEN)) < 1e-9
    # The ledger holds every call whose attempt reported back, once.
    assert ledger.tokens_used == bill.reported_tokens + agent_tokens
