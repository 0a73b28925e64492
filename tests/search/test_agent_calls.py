"""The agent ledger: every call stored once, the run budget charged, per-role caps."""

from __future__ import annotations

import pytest

from milo_ray.core.rollouts import RolloutResult
from milo_ray.llm.usage import AgentReply, AgentUsage, reply_parts
from milo_ray.execution.budget import BudgetLedger
from milo_ray.search.agent_calls import AgentCallLog, RoleCap, role_caps
from milo_ray.store.memory import MemoryRunStore


def usage(i: int, o: int, usd: float | None = 0.0, s: float = 0.5) -> AgentUsage:
    return AgentUsage(input_tokens=i, output_tokens=o, cost_usd=usd, seconds=s)


def test_totals_in_the_table_equal_the_usage_the_agents_reported():
    store = MemoryRunStore(run_id="r")
    log = AgentCallLog(store)
    log.record("judge", usage(100, 20, 0.01), call_id="judge:a", agent="j", round=0)
    log.record("judge", usage(50, 5, 0.02), call_id="judge:b", agent="j", round=0)
    log.record("mutator", usage(1000, 300, None), call_id="mutate:i0:r1", agent="bold", island=0, round=1)
    rows = store.read("agent_calls").to_pylist()
    assert len(rows) == 3
    judge = [r for r in rows if r["role"] == "judge"]
    assert sum(r["input_tokens"] for r in judge) == 150 and sum(r["output_tokens"] for r in judge) == 25
    assert sum(r["cost_usd"] for r in judge) == pytest.approx(0.03)
    (mut,) = [r for r in rows if r["role"] == "mutator"]
    assert mut["cost_usd"] is None and mut["island"] == 0  # unpriced is null, never 0
    spend = log.by_role()
    assert spend["judge"]["calls"] == 2 and spend["judge"]["cost_usd"] == pytest.approx(0.03)
    assert spend["mutator"]["unpriced_calls"] == 1 and spend["mutator"]["input_tokens"] == 1000


def test_a_call_id_is_stored_and_charged_once():
    store, budget = MemoryRunStore(run_id="r"), BudgetLedger(tokens=10_000)
    log = AgentCallLog(store, budget=budget)
    for _ in range(3):
        log.record("optimizer", usage(100, 10), call_id="optimize:r0:c1", candidate=1)
    assert store.read("agent_calls").num_rows == 1
    assert budget.tokens_used == 110
    assert log.recorded("optimize:r0:c1") and not log.recorded("optimize:r0:c2")


def test_agent_calls_use_up_the_run_token_and_usd_caps():
    budget = BudgetLedger(tokens=1_000, cost_usd=1.0)
    log = AgentCallLog(MemoryRunStore(run_id="r"), budget=budget)
    log.record("mutator", usage(600, 300, 0.5), call_id="a")
    assert log.allows("mutator") and budget.can_afford(1)
    log.record("mutator", usage(100, 0, 0.1), call_id="b")
    assert not log.allows("judge")  # the run's token cap holds for every role
    assert not budget.can_afford(1)  # and for rollouts
    assert log.exhausted_reason("judge") == "the run's token/USD budget is spent"


def test_a_role_cap_stops_only_that_role():
    log = AgentCallLog(MemoryRunStore(run_id="r"), caps={"judge": RoleCap(tokens=100)})
    log.record("judge", usage(60, 30), call_id="a")
    assert log.allows("judge")
    log.record("judge", usage(5, 5), call_id="b")
    assert not log.allows("judge") and log.allows("optimizer")
    assert "run.budget.roles.judge" in log.exhausted_reason("judge")
    usd = AgentCallLog(MemoryRunStore(run_id="r"), caps={"optimizer": RoleCap(cost_usd=0.5)})
    usd.record("optimizer", usage(1, 1, 0.5), call_id="a")
    assert not usd.allows("optimizer")


def test_resume_restores_spend_and_charges_the_new_ledger():
    store = MemoryRunStore(run_id="r")
    first = AgentCallLog(store, caps={"judge": RoleCap(tokens=100)})
    first.record("judge", usage(80, 20), call_id="a")
    budget = BudgetLedger(tokens=500)
    again = AgentCallLog(store, budget=budget, caps={"judge": RoleCap(tokens=100)}, resumed=True)
    assert budget.tokens_used == 100
    assert not again.allows("judge") and again.recorded("a")
    again.record("judge", usage(80, 20), call_id="a")  # a replayed step
    assert store.read("agent_calls").num_rows == 1


def test_bad_role_caps_name_the_field():
    with pytest.raises(ValueError, match=r"run.budget.roles.jduge: unknown role"):
        role_caps({"jduge": {"tokens": 1}})
    with pytest.raises(ValueError, match=r"run.budget.roles.judge.tokens=-1"):
        role_caps({"judge": {"tokens": -1}})
    assert role_caps({"judge": {"tokens": None, "cost_usd": None}}) == {}
    with pytest.raises(ValueError, match="role"):
        AgentCallLog(MemoryRunStore(run_id="r")).record("coder", usage(1, 1), call_id="x")


def test_reply_parts_accepts_bare_outputs_as_unpriced():
    out, u = reply_parts({"w": 1})
    assert out == {"w": 1} and u.cost_usd is None
    out, u = reply_parts(AgentReply({"w": 1}, usage(3, 4)))
    assert u.tokens == 7
    with pytest.raises(ValueError, match="cost_usd"):
        AgentUsage(cost_usd=-1.0)


def test_a_failed_write_is_neither_marked_nor_charged():
    class FullDisk(MemoryRunStore):
        fail = True

        def append(self, table, rows):
            if self.fail:
                raise OSError("No space left on device")
            super().append(table, rows)

    store, budget = FullDisk(run_id="r"), BudgetLedger(tokens=1_000)
    log = AgentCallLog(store, budget=budget)
    with pytest.raises(OSError):
        log.record("judge", usage(100, 0), call_id="a")
    assert budget.tokens_used == 0 and not log.recorded("a") and log.by_role() == {}
    store.fail = False
    log.record("judge", usage(100, 0), call_id="a")
    assert budget.tokens_used == 100 and store.read("agent_calls").num_rows == 1


def test_solver_calls_are_ledgered_but_not_charged_twice():
    """Solver spend reaches the budget through the rollouts that contain it."""
    budget = BudgetLedger(tokens=1_000)
    log = AgentCallLog(MemoryRunStore(run_id="r"), budget=budget)
    log.record("solver", usage(400, 100), call_id="solve:h:t:0")
    assert budget.tokens_used == 0 and log.by_role()["solver"]["input_tokens"] == 400


def _solver_calls(n: int, started: float, tokens: int = 100) -> list[dict]:
    return [{"input_tokens": tokens, "output_tokens": 0, "cost_usd": 0.001, "started_at": started + i, "seconds": 0.1,
             "model": "m"} for i in range(n)]


def test_a_resume_charges_the_failed_attempts_solver_calls_once_and_the_stored_results_not_again():
    """Each paid solver call is counted once across a resume: a stored rollout row carries
    its final attempt (the scheduler restores it), a counted failed attempt's calls live
    only in agent_calls and are charged from there, an uncounted one's are not, and a
    final attempt stored without its row (killed between the two writes) is charged."""
    store = MemoryRunStore(run_id="r")
    log = AgentCallLog(store, budget=BudgetLedger(tokens=1_000_000))
    log.record_solver_calls(_solver_calls(2, 100.0), cache_key="k1", harness_id="h", failed_attempt="counted")
    log.record_solver_calls(_solver_calls(3, 200.0), cache_key="k1", harness_id="h")  # the stored result
    log.record_solver_calls(_solver_calls(1, 300.0), cache_key="k2", harness_id="h", failed_attempt="uncounted")
    log.record_solver_calls(_solver_calls(4, 400.0), cache_key="k3", harness_id="h")  # its row never stored
    # k4: the first session's final attempt (row lost), rerun and stored in a later session.
    log.record_solver_calls(_solver_calls(1, 500.0), cache_key="k4", harness_id="h")
    log.record_solver_calls(_solver_calls(1, 600.0), cache_key="k4", harness_id="h")
    rows = []
    for key, start in (("k1", 199.5), ("k4", 599.5)):
        row = RolloutResult("h", "t", 0, 1.0, cache_key=key, run_id="r", budgeted=True)
        row.started_at = start
        rows.append(row)
    store.append_rollouts(rows)
    budget = BudgetLedger(tokens=1_000_000)
    AgentCallLog(store, budget=budget, resumed=True)
    # k1's failed attempt (2 calls) + k3's unstored result (4) + k4's first session (1).
    assert budget.tokens_used == (2 + 4 + 1) * 100


def test_a_failed_attempt_tag_must_be_known():
    with pytest.raises(ValueError, match="failed_attempt"):
        AgentCallLog(MemoryRunStore(run_id="r")).record_solver_calls([], cache_key="k", harness_id="h",
                                                                      failed_attempt="yes")
