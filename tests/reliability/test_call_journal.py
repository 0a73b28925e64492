"""The gateways' journal of model calls: a call an attempt never reported (its driver was
killed, its worker lost) is recorded once on resume, with its real usage when the
provider answered it, and charged to the run's budget once."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from milo_ray.core.rollouts import RolloutResult
from milo_ray.execution.budget import BudgetLedger
from milo_ray.boundary.gateway.call_journal import (AttemptJournal, CallJournal, SessionJournal, read_journal,
                                                     unrecorded_calls)
from milo_ray.search.agent_calls import IN_FLIGHT_ERROR, AgentCallLog
from milo_ray.store.memory import MemoryRunStore
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, reply

HERE = Path(__file__).parent
MODEL_ID = "openai/scripted"
ITEM = ("h1", "t", 0, 1)
TOKENS = 1100  # 1,000 in + 100 out per answered call


def _row(started_at: float, tokens_in: int = 1000, tokens_out: int = 100, usd: float | None = 0.0012) -> dict:
    return {"model": MODEL_ID, "started_at": started_at, "input_tokens": tokens_in, "output_tokens": tokens_out,
            "cost_usd": usd, "seconds": 0.2, "retries": 0, "error": None}


def _attempt(journal: CallJournal, *, counted: bool = True, finished: int = 2, in_flight: int = 1,
             item=ITEM, t0: float = 1000.0) -> list[dict]:
    """An attempt that made ``finished`` calls and has ``in_flight`` more outstanding."""
    attempt = AttemptJournal.for_rollout(journal, item, counted=counted)
    rows = []
    for i in range(finished):
        n = attempt.began(t0 + i)
        rows.append(_row(t0 + i))
        attempt.finished(n, i, rows[-1])
    for j in range(in_flight):
        attempt.began(t0 + finished + j)
    return rows


def test_journaled_calls_no_stored_row_names_are_recorded_once_and_charged_once(tmp_path):
    from milo_ray.store.parquet import ParquetRunStore

    store = ParquetRunStore(tmp_path, run_id="r")
    # The run keeps a journal: its store has a directory, its executor's calls a gateway.
    sessions = SessionJournal(store, {"_target_": "milo_ray.testing.gateway_loop.GatewayLoopExecutor"})
    assert sessions.directory == tmp_path / "journal"
    journal = CallJournal(tmp_path / "journal" / "calls-a.jsonl")
    reported = _attempt(journal, finished=2, in_flight=0, item=("h1", "t", 1, 1), t0=500.0)
    _attempt(journal, finished=2, in_flight=1)  # killed: two answered calls and one in flight
    _attempt(journal, counted=False, finished=1, in_flight=0, item=("h1", "t", 2, 1), t0=2000.0)  # a final test's
    journal.close()
    with open(tmp_path / "journal" / "calls-a.jsonl", "a") as f:
        f.write('{"op": "end", "a": "torn')  # what a killed writer leaves

    budget = BudgetLedger(tokens=10**6)
    log = AgentCallLog(store, budget=budget)
    from milo_ray.core.rollouts import cache_key

    # The first attempt reported: its calls are stored with its rollout.
    log.record_solver_calls(reported, cache_key=cache_key("h1", "t", 1, MODEL_ID, 1), harness_id="h1")
    assert sessions.recover(log, MODEL_ID) == 4
    rows = {r["call_id"]: r for r in store.read("agent_calls").to_pylist()}
    interrupted = [r for cid, r in rows.items() if ":interrupted:" in cid]
    assert sorted(r["input_tokens"] + r["output_tokens"] for r in interrupted) == [0, TOKENS, TOKENS]
    (unknown,) = [r for r in interrupted if r["error"]]
    assert unknown["error"] == IN_FLIGHT_ERROR and unknown["cost_usd"] is None
    assert len([cid for cid in rows if ":interrupted-uncounted:" in cid]) == 1
    # Charged once: the killed attempt's two answered calls, never the final test's.
    assert budget.tokens_used == 2 * TOKENS
    assert store.read("events").to_pylist()[-1]["kind"] == "model_calls_recovered"

    # Again (the session's own close, a second resume): nothing new, nothing charged.
    assert sessions.recover(log, MODEL_ID) == 0
    assert budget.tokens_used == 2 * TOKENS and store.read("agent_calls").num_rows == len(rows)
    # A resumed run charges the recorded calls once from the stored rows, and adds nothing
    # (the reported attempt's two calls are charged too: no stored rollout row carries them here).
    budget2 = BudgetLedger(tokens=10**6)
    log2 = AgentCallLog(store, budget=budget2, resumed=True)
    assert sessions.recover(log2, MODEL_ID) == 0 and budget2.tokens_used == 4 * TOKENS
    store.close()
    # A run whose calls no gateway meters keeps no journal.
    assert SessionJournal(MemoryRunStore(run_id="m"), {"_target_": "milo_ray.testing.gateway_loop.GatewayLoopExecutor"}
                          ).directory is None


def test_a_finished_call_is_matched_by_key_start_and_index_and_a_torn_file_reads():
    records = [{"op": "begin", "a": "x", "n": 0, "item": list(ITEM), "counted": True, "t": 5.0},
               {"op": "end", "a": "x", "n": 0, "i": 3, "call": _row(5.0)}]
    from milo_ray.core.rollouts import cache_key

    key = cache_key(*ITEM[:3], MODEL_ID, ITEM[3])
    assert unrecorded_calls(records, {f"{key}:5.000000:3"}, MODEL_ID) == []
    assert unrecorded_calls(records, {f"{key}:failed:5.000000:3"}, MODEL_ID) == []
    # Another index, or another model's key, is another call.
    assert len(unrecorded_calls(records, {f"{key}:5.000000:2"}, MODEL_ID)) == 1
    assert len(unrecorded_calls(records, {f"{key}:5.000000:3"}, "openai/other")) == 1


# --- the gateway and the worker write it ------------------------------------------------

KEY_ENV = "MILO_JOURNAL_TEST_KEY"


def _model(url: str) -> dict:
    return {"solver": MODEL_ID, "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 30,
            "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, "max_retries": 0}


def test_every_forwarded_call_is_journaled_before_and_after_and_matches_the_rollouts_trace(tmp_path, monkeypatch):
    from milo_ray.core.tasks import Task
    from milo_ray.execution.workers import WorkerCore
    from milo_ray.harness.model import Harness
    from milo_ray.testing.gateway_loop import GatewayLoopExecutor

    monkeypatch.setenv(KEY_ENV, "sk-journal")
    harness = Harness.from_source("def build_agent(model, backend):\n    return None\n")
    task = Task("t", "search", "loop", 30.0, 10**9, {})
    with ScriptedOpenAIServer(lambda body: reply("again", prompt_tokens=1000, completion_tokens=100)) as srv:
        core = WorkerCore(GatewayLoopExecutor(_model(srv.url), most_calls=3), slots=2, time_cap_grace=1.25)
        core.call_journal = CallJournal(tmp_path / "calls-w.jsonl")

        async def go():
            items = [(0, harness.harness_id, "t", 0, 1), (1, harness.harness_id, "t", 1, 1)]
            await core.submit(items, {harness.harness_id: harness}, {"t": task}, unbudgeted=[1])
            out = []
            while len(out) < 2:
                out += await core.poll(10.0)
            return {o.item_id: o for o in out}

        outcomes = asyncio.run(go())
        answered = len(srv.answered)
    records = read_journal(tmp_path)
    assert answered == 6
    assert [r["op"] for r in records].count("begin") == 6 and [r["op"] for r in records].count("end") == 6
    counted = {tuple(r["item"][:3]): r["counted"] for r in records if r["op"] == "begin"}
    assert counted == {(harness.harness_id, "t", 0): True, (harness.harness_id, "t", 1): False}
    # Each end row is the call the rollout's trace carries, at its index.
    for o in outcomes.values():
        calls = o.result.trace["trajectory"]["calls"]
        ends = [r for r in records if r["op"] == "end" and r["call"]["started_at"] in {c["started_at"] for c in calls}]
        assert sorted((r["i"], r["call"]["started_at"]) for r in ends) == [(i, c["started_at"]) for i, c in enumerate(calls)]
    # Once the rollouts' calls are stored, the journal holds nothing unrecorded.
    store = MemoryRunStore(run_id="r")
    log = AgentCallLog(store)
    for o in outcomes.values():
        log.record_rollout_calls(_keyed(o.result))
    assert unrecorded_calls(records, log.call_ids(), MODEL_ID) == []


def _keyed(result: RolloutResult) -> RolloutResult:
    from milo_ray.core.rollouts import cache_key

    result.cache_key = cache_key(result.harness_id, result.task_id, result.rollout_idx, MODEL_ID, 1)
    return result


def test_a_call_is_journaled_before_the_provider_answers(tmp_path, monkeypatch):
    from milo_ray.boundary.gateway.server import ModelGateway

    monkeypatch.setenv(KEY_ENV, "sk-journal")
    answer = threading.Event()

    def slow(body):
        answer.wait(30)
        return reply("late", prompt_tokens=1000, completion_tokens=100)

    async def go(srv):
        import aiohttp

        gw = ModelGateway(_model(srv.url), tmp_path / "gw.sock")
        gw.set_key("sk-journal")
        await gw.start()
        journal = CallJournal(tmp_path / "calls-g.jsonl")
        grant = gw.issue("r", journal=AttemptJournal.for_rollout(journal, ITEM, counted=True))
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=gw.socket_path)) as s:
            call = asyncio.ensure_future(s.post("http://gateway/v1/chat/completions",
                                                headers={"Authorization": f"Bearer {grant.token}"},
                                                json={"messages": [{"role": "user", "content": "hi"}]}))
            for _ in range(300):
                if read_journal(tmp_path):
                    break
                await asyncio.sleep(0.05)
            before = read_journal(tmp_path)
            answer.set()
            (await call).release()
        await gw.close()
        return before, read_journal(tmp_path), grant

    with ScriptedOpenAIServer(slow) as srv:
        before, after, grant = asyncio.run(go(srv))
    assert [r["op"] for r in before] == ["begin"]
    assert [r["op"] for r in after] == ["begin", "end"] and after[1]["call"] == grant.calls[0]


# --- a killed driver ----------------------------------------------------------------------

ANSWERED = 5


@pytest.mark.slow
def test_calls_of_a_killed_driver_are_recorded_once_with_their_usage_on_resume(tmp_path):
    """The driver's one rollout had 5 calls answered (paid) and a 6th in flight when it was
    SIGKILLed; nothing of the rollout was stored. On resume all six are recorded once, the
    five with their real tokens, and the budget is charged for the five once."""
    from milo_ray.testing.processes import kill_driver_when

    sys.path.insert(0, str(HERE))
    import journal_driver

    def policy(body, _count=[0]):
        _count[0] += 1
        return reply("again", prompt_tokens=1000, completion_tokens=100) if _count[0] <= ANSWERED \
            else Reply(content="never", delay_s=3600)

    # Ray's socket paths must stay under 108 bytes: a short private RAY_TMPDIR.
    run_dir, ray_tmp = tmp_path / "run", Path(tempfile.mkdtemp(prefix="mrj-", dir="/tmp"))
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), journal_driver.KEY_ENV: "sk-journal-test",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    def ready() -> bool:
        ops = [r["op"] for r in read_journal(run_dir / "journal")]
        return ops.count("end") == ANSWERED and ops.count("begin") == ANSWERED + 1

    with ScriptedOpenAIServer(policy) as srv:
        kill_driver_when([sys.executable, str(HERE / "journal_driver.py"), str(run_dir), srv.url], env, str(ray_tmp),
                         ready, what=f"{ANSWERED} calls answered")
        paid = len(srv.answered)
    assert paid == ANSWERED

    for session in (1, 2):
        sched = journal_driver.scheduler(str(run_dir), srv.url, resumed=True)
        try:
            added = sched.recover_calls()
            rows = sched.store.read("agent_calls").to_pylist()
            assert added == (ANSWERED + 1 if session == 1 else 0)
            assert len(rows) == ANSWERED + 1 and len({r["call_id"] for r in rows}) == ANSWERED + 1
            assert sorted(r["input_tokens"] + r["output_tokens"] for r in rows) == [0] + [TOKENS] * ANSWERED
            assert sched.budget.tokens_used == ANSWERED * TOKENS
        finally:
            sched.close()
            sched.store.close()
    shutil.rmtree(ray_tmp, ignore_errors=True)
