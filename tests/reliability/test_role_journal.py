"""The search agents' call journal: an agent call that ends without an outcome (timed out,
its worker lost, its driver killed) had its model calls paid for; they are recorded once,
under the call's role, with their real usage, and charged to the run's budget once."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from milo_ray.agents.protocols import MutationRequest
from milo_ray.execution.budget import BudgetLedger
from milo_ray.boundary.gateway.call_journal import CallJournal, read_journal
from milo_ray.boundary.gateway.role_journal import (ROLE_JOURNAL_PREFIX, RoleCallTicket, RoleJournal,
                                                     role_call_records, uncovered_attempts)
from milo_ray.harness.model import Harness
from milo_ray.search.agent_calls import AgentCallLog
from milo_ray.search.mutation import ValidationOptions, run_mutation
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, Reply, ScriptedOpenAIServer, reply

HERE = Path(__file__).parent
TOKENS = 1100  # 1,000 in + 100 out per answered call
PARENT = Harness.from_source("def build_agent(model, backend):\n    return None\n")


def _row(tokens_in: int = 1000, tokens_out: int = 100, usd: float | None = 0.0012) -> dict:
    return {"model": "openai/scripted", "started_at": 1.0, "input_tokens": tokens_in, "output_tokens": tokens_out,
            "cost_usd": usd, "seconds": 0.2, "retries": 0, "error": None}


def _attempt(journal: CallJournal, call_id: str, *, finished: int, in_flight: int = 0, covered: bool = False,
             role: str = "mutator") -> RoleCallTicket:
    ticket = RoleCallTicket(journal, call_id, role)
    records = role_call_records(ticket)
    for i in range(finished):
        records.finished(records.began(100.0 + i), i, _row())
    for j in range(in_flight):
        records.began(200.0 + j)
    if covered:
        journal.write([{"op": "covered", "a": ticket.attempt, "call_id": call_id}])
    return ticket


def test_an_attempt_is_covered_only_by_its_covered_record_and_its_stored_row(tmp_path):
    journal = CallJournal(tmp_path / f"{ROLE_JOURNAL_PREFIX}-a.jsonl")
    _attempt(journal, "mutate:i0:r1", finished=3, covered=True)                 # its row holds it
    killed = _attempt(journal, "mutate:i0:r2", finished=2, in_flight=1)          # driver killed mid-call
    asked_again = _attempt(journal, "mutate:i0:r2", finished=1, covered=True)    # the resume's call
    unstored = _attempt(journal, "graft:d1:0", finished=1, covered=True, role="orchestrator")  # killed before its row
    journal.close()
    records = read_journal(tmp_path, prefix=ROLE_JOURNAL_PREFIX, ops=("begin", "end", "covered"))
    out = {c.attempt: c for c in uncovered_attempts(records, {"mutate:i0:r1", "mutate:i0:r2"})}
    assert set(out) == {killed.attempt, unstored.attempt} and asked_again.attempt not in out
    k = out[killed.attempt]
    assert (k.role, k.usage.tokens, k.in_flight, k.usage.cost_usd) == ("mutator", 2 * TOKENS, 1, pytest.approx(0.0024))
    assert "in flight" in k.usage.error and k.row_id.startswith("mutate:i0:r2:interrupted:")
    assert out[unstored.attempt].role == "orchestrator" and out[unstored.attempt].usage.error is None
    # The solver's journal files are not read as the agents', nor the other way round.
    assert read_journal(tmp_path) == []


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setenv(SCRIPTED_KEY_ENV, "sk-role-journal-test")
    with ScriptedOpenAIServer(lambda body: reply("again", prompt_tokens=1000, completion_tokens=100)) as srv:
        yield srv


def _spec(url: str, **kw) -> dict:
    llm = {"model": "openai/scripted", "api_base": url, "api_key_env": SCRIPTED_KEY_ENV, "max_retries": 0}
    return {"_target_": "milo_ray.testing.fake_agents.GatewayLoopMutator", "llm": llm, **kw}


def _request(tmp_path: Path, seed: int) -> MutationRequest:
    wd = tmp_path / f"work-{seed}"
    return MutationRequest(parent=PARENT, parent_dir=PARENT.write_to(tmp_path / f"parent-{seed}"),
                           evidence_dir=tmp_path, memory_markdown="", workdir=wd, seed=seed)


def test_a_mutation_past_its_time_cap_has_its_paid_calls_recorded_once_and_charged_once(tmp_path, scripted):
    from milo_ray.store.parquet import ParquetRunStore

    store = ParquetRunStore(tmp_path / "run", run_id="r")
    budget = BudgetLedger(tokens=10**6)
    calls = AgentCallLog(store, budget=budget, journal=RoleJournal(tmp_path / "run" / "journal"))
    off = ValidationOptions(enabled=False)

    # A hung agent: three calls answered, then past the cap; its outcome knows no usage.
    hung = calls.ticket("mutate:i0:r1", "mutator", "openai/scripted")
    out = run_mutation(_spec(scripted.url, hang_s=4.0), _request(tmp_path, 1), time_cap_s=1.5, validation=off,
                       ticket=hung)
    assert out.error.startswith("timed out") and not out.metered
    calls.record("mutator", out.usage, call_id="mutate:i0:r1", covers=hung if out.metered else None)
    # An agent that answers: its outcome carries its three calls, and covers them.
    done = calls.ticket("mutate:i0:r2", "mutator", "openai/scripted")
    out = run_mutation(_spec(scripted.url), _request(tmp_path, 2), time_cap_s=60, validation=off, ticket=done)
    assert out.ok and out.metered and out.usage.tokens == 3 * TOKENS
    calls.record("mutator", out.usage, call_id="mutate:i0:r2", covers=done)
    assert budget.tokens_used == 3 * TOKENS  # what the outcomes told the driver
    # An offline agent (no model) gets no ticket.
    assert calls.ticket("mutate:i0:r3", "mutator", None) is None
    # The hung agent goes on past the cap until its gateway token is revoked: its calls
    # were paid too. Wait until all six are journaled (the cap cut it at a time we don't know).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and [r["op"] for r in _role_records(tmp_path / "run")].count("end") < 6:
        time.sleep(0.1)

    calls.journal.finish(calls)  # the session ends
    rows = {r["call_id"]: r for r in store.read("agent_calls").to_pylist()}
    (recovered,) = [r for cid, r in rows.items() if cid.startswith("mutate:i0:r1:interrupted:")]
    assert recovered["role"] == "mutator" and recovered["input_tokens"] + recovered["output_tokens"] == 3 * TOKENS
    assert len(rows) == 3 and budget.tokens_used == 6 * TOKENS
    assert calls.spend("mutator").tokens == 6 * TOKENS  # the role's cap sees it too
    assert store.read("events").to_pylist()[-1]["kind"] == "agent_calls_recovered"

    # Again, and in a resumed run: nothing new; the stored rows charge it once.
    assert calls.journal.recover(calls) == 0
    budget2 = BudgetLedger(tokens=10**6)
    resumed = AgentCallLog(store, budget=budget2, resumed=True, journal=RoleJournal(tmp_path / "run" / "journal"))
    assert resumed.journal.recover(resumed) == 0 and budget2.tokens_used == 6 * TOKENS
    store.close()
    time.sleep(3.0)  # let the hung agent's thread end before its server closes


def _role_records(run_dir: Path) -> list[dict]:
    return read_journal(run_dir / "journal", prefix=ROLE_JOURNAL_PREFIX)


@pytest.mark.slow
def test_an_agent_call_of_a_killed_driver_is_recorded_once_with_its_usage_on_resume(tmp_path):
    """The driver's mutator (a Ray task) had 3 model calls answered and a 4th in flight when
    the driver was SIGKILLed. On resume the call is one ``interrupted`` mutator row with the
    three calls' tokens and one call in flight, charged once across two resumes."""
    from milo_ray.testing.processes import kill_driver_when

    sys.path.insert(0, str(HERE))
    import role_journal_driver as driver

    answered = 3

    def policy(body, _count=[0]):
        _count[0] += 1
        return reply("again", prompt_tokens=1000, completion_tokens=100) if _count[0] <= answered \
            else Reply(content="never", delay_s=3600)

    run_dir, ray_tmp = tmp_path / "run", Path(tempfile.mkdtemp(prefix="mrr-", dir="/tmp"))
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), SCRIPTED_KEY_ENV: "sk-role-journal-test",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    def ready() -> bool:
        ops = [r["op"] for r in _role_records(run_dir)]
        return ops.count("end") == answered and ops.count("begin") == answered + 1

    with ScriptedOpenAIServer(policy) as srv:
        kill_driver_when([sys.executable, str(HERE / "role_journal_driver.py"), str(run_dir), srv.url], env,
                         str(ray_tmp), ready, what=f"{answered} calls answered")
        assert len(srv.answered) == answered

    from milo_ray.store.parquet import ParquetRunStore

    for session in (1, 2):
        store = ParquetRunStore(run_dir, run_id="role-journal")
        budget = BudgetLedger(tokens=10**9)
        calls = AgentCallLog(store, budget=budget, resumed=True, journal=RoleJournal(run_dir / "journal"))
        assert calls.journal.recover(calls) == (1 if session == 1 else 0)
        (row,) = store.read("agent_calls").to_pylist()
        assert row["call_id"].startswith(f"{driver.CALL_ID}:interrupted:") and row["role"] == "mutator"
        assert row["input_tokens"] + row["output_tokens"] == answered * TOKENS and "1 model call(s) in flight" in row["error"]
        assert budget.tokens_used == answered * TOKENS
        store.close()
