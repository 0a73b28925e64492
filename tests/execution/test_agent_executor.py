"""The real executor end to end: a harness's agent, a litellm model served by a local
OpenAI-compatible server, a bubblewrap sandbox holding a Harbor task's workspace, and the
task's own verifier. Nothing in the product is replaced: litellm, langchain and deepagents
send real HTTP requests to the scripted server."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.core.rollouts import RolloutRequest
from milo_ray.agents.mutators.diagnosis import diagnose_traces
from milo_ray.execution.agent_executor import AgentExecutor
from milo_ray.harness.evidence import write_evidence_dir
from milo_ray.harness.seeds import SEED_NAMES, load_seeds
from milo_ray.store import MemoryRunStore
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, error, reply

from real_tasks import (ANSWER, DONE_TOKENS, WRITE_TOKENS, failing_for, make_task, quitting_policy,
                        slow_after_write_policy, solving_policy)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

KEY_ENV = "MILO_TEST_SOLVER_KEY"
SANDBOX = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}


def model_cfg(url: str, **extra) -> dict:
    return {"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 30,
            "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, **extra}


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "local-test-key")


@pytest.fixture
def suite(tmp_path):
    make_task(tmp_path / "tasks", "answer")
    make_task(tmp_path / "tasks", "answer-quick", agent_timeout_s=3)
    # A seed whose own checking loop would spend the whole default minute with the
    # scripted model is graded at this cap instead (its answer is written first).
    make_task(tmp_path / "tasks", "answer-15s", agent_timeout_s=15)
    make_task(tmp_path / "tasks", "answer-broken", instruction=f"BROKEN: write {ANSWER} into /app/answer.txt.\n")
    return HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})


def _run(executor: AgentExecutor, harness, task):
    return asyncio.run(executor.aexecute(harness, task, 0, 0))


def minimal():
    return load_seeds(["minimal"])[0]


def test_scripted_model_solves_the_task_through_tool_calls(suite):
    with ScriptedOpenAIServer(solving_policy) as srv:
        ex = AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX)
        res = _run(ex, minimal(), suite.task("answer"))
    assert res.error_kind is None, res.error
    assert res.score == 1.0 and not res.timed_out
    assert res.input_tokens == WRITE_TOKENS[0] + DONE_TOKENS[0]
    assert res.output_tokens == WRITE_TOKENS[1] + DONE_TOKENS[1]
    assert res.cost_usd == pytest.approx((res.input_tokens * 1.0 + res.output_tokens * 2.0) / 1e6)
    traj = res.trace["trajectory"]
    roles = [s["role"] for s in traj["steps"]]
    assert roles[:4] == ["user", "assistant", "tool", "assistant"]
    call = traj["steps"][1]["tool_calls"][0]
    assert call["name"] == "write_file" and call["args"]["file_path"] == "/app/answer.txt"
    assert len(traj["calls"]) == 2 and all(c["finished_at"] >= c["started_at"] > 0 for c in traj["calls"])
    assert traj["final"]["status"] == "completed"


def test_model_that_stops_at_once_scores_zero(suite):
    with ScriptedOpenAIServer(quitting_policy) as srv:
        res = _run(AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX), minimal(), suite.task("answer"))
    assert res.score == 0.0 and res.error_kind is None
    assert res.input_tokens == 50 and res.output_tokens == 6


# A write_file call cut off mid-argument, as a model that ran out of output tokens sends it.
MALFORMED_ARGS = '{"file_path": "/app/answer.txt", "content": "4'


def malformed_call_policy(body):
    return Reply(tool_calls=[{"id": "call_cut", "type": "function",
                              "function": {"name": "write_file", "arguments": MALFORMED_ARGS}}],
                 prompt_tokens=WRITE_TOKENS[0], completion_tokens=WRITE_TOKENS[1])


def test_a_malformed_tool_call_is_a_step_of_the_trajectory_and_counted(suite, tmp_path):
    with ScriptedOpenAIServer(malformed_call_policy) as srv:
        res = _run(AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX), minimal(), suite.task("answer"))
    # The agent cannot run the call, and an answer of only such calls ends its loop.
    assert res.score == 0.0 and res.error_kind is None
    traj = res.trace["trajectory"]
    last = traj["steps"][-1]
    assert last["role"] == "assistant" and "tool_calls" not in last
    assert last["invalid_tool_calls"] == [{"id": "call_cut", "name": "write_file", "args": MALFORMED_ARGS,
                                           "error": last["invalid_tool_calls"][0]["error"]}]
    assert last["invalid_tool_calls"][0]["error"].startswith("the arguments are not valid JSON")
    assert traj["final"]["invalid_tool_calls"] == res.invalid_tool_calls == 1
    # What a mutator reads of this rollout says so, and its diagnosis names the failure mode.
    evidence = write_evidence_dir(tmp_path / "evidence", minimal(), [res], [suite.task("answer")])
    assert "- invalid tool calls (the model's tool calls whose arguments did not parse; not run): 1 in all" \
        in (evidence / "report.md").read_text()
    assert diagnose_traces(evidence).ranked() == ["tool_misuse"]


def test_a_malformed_call_beside_a_valid_one_is_answered_and_the_agent_goes_on(suite):
    def policy(body):
        if any(m.get("role") == "tool" for m in body.get("messages", [])):
            return reply("The answer is written.", prompt_tokens=DONE_TOKENS[0], completion_tokens=DONE_TOKENS[1])
        write = {"file_path": "/app/answer.txt", "content": f"{ANSWER}\n"}
        return Reply(tool_calls=[{"id": "call_ok", "type": "function",
                                  "function": {"name": "write_file", "arguments": json.dumps(write)}},
                                 {"id": "call_cut", "type": "function",
                                  "function": {"name": "write_file", "arguments": MALFORMED_ARGS}}],
                     prompt_tokens=WRITE_TOKENS[0], completion_tokens=WRITE_TOKENS[1])

    with ScriptedOpenAIServer(policy) as srv:
        res = _run(AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX), minimal(), suite.task("answer"))
        sent = srv.requests[-1]["messages"]
    assert res.score == 1.0 and res.invalid_tool_calls == 1
    steps = res.trace["trajectory"]["steps"]
    both = next(s for s in steps if s.get("invalid_tool_calls"))
    assert [c["id"] for c in both["tool_calls"]] == ["call_ok"]
    assert [c["id"] for c in both["invalid_tool_calls"]] == ["call_cut"]
    # langchain's agent answers the malformed call with an error; the model is sent the call
    # it answers, as the model wrote it, so a provider accepts the conversation.
    assert any(s["role"] == "tool" and s.get("tool_call_id") == "call_cut" and s.get("status") == "error"
               for s in steps)
    assistant = next(m for m in sent if m.get("role") == "assistant" and m.get("tool_calls"))
    assert [(c["id"], c["function"]["arguments"]) for c in assistant["tool_calls"]][1] == ("call_cut", MALFORMED_ARGS)


def test_rate_limited_call_is_retried_and_the_rollout_succeeds(suite):
    first = {"done": False}

    def policy(body):
        if not first["done"]:
            first["done"] = True
            return error(429)
        return solving_policy(body)

    with ScriptedOpenAIServer(policy) as srv:
        res = _run(AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX), minimal(), suite.task("answer"))
        requests = len(srv.requests)
    assert res.score == 1.0 and res.error_kind is None
    assert requests == 3  # the 429, then the two answers


def test_model_slower_than_the_agent_cap_times_out_and_the_workspace_is_graded(suite):
    task = suite.task("answer-quick")  # agent timeout 3 s
    with ScriptedOpenAIServer(slow_after_write_policy(delay_s=20)) as srv:
        res = _run(AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX), minimal(), task)
    assert res.timed_out and res.trace["trajectory"]["final"]["status"] == "timeout"
    assert res.score == 1.0  # the answer was written before the cap: graded as it stands
    # The agent was stopped at the cap (its clock starts once the harness process built
    # its agent), not when the model answered 20 s later.
    assert res.latency_s < 20


def test_oracle_runs_the_reference_solution_without_a_model(suite):
    ex = AgentExecutor(model=None, sandbox=SANDBOX, agent="oracle")
    res = _run(ex, minimal(), suite.task("answer"))
    assert res.score == 1.0 and res.input_tokens == 0 and res.error_kind is None
    assert ex.model_id == "oracle"


def test_harness_that_does_not_import_is_a_harness_failure(suite):
    broken = minimal().with_source("import no_such_module_anywhere\n\ndef build_agent(model, backend):\n    pass\n")
    with ScriptedOpenAIServer(solving_policy) as srv:
        res = _run(AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX), broken, suite.task("answer"))
    assert res.error_kind == "harness" and res.score == 0.0 and "no_such_module_anywhere" in res.error


@pytest.mark.slow  # a cold harness process per seed
@pytest.mark.parametrize("seed", SEED_NAMES)
def test_every_seed_harness_runs_a_task_against_the_scripted_model(suite, seed):
    harness = load_seeds([seed])[0]
    with ScriptedOpenAIServer(solving_policy) as srv:
        res = _run(AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX), harness, suite.task("answer-15s"))
    assert res.error_kind is None, res.error
    assert res.score == 1.0
    assert res.input_tokens > 0


def test_missing_key_is_refused_naming_the_variable(monkeypatch):
    # The driver's preflight refuses it; a worker, which has no key in its environment,
    # builds the executor and is handed the key with set_secrets().
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match=KEY_ENV):
        AgentExecutor.preflight(model_cfg("http://127.0.0.1:9/v1"))
    AgentExecutor(model=model_cfg("http://127.0.0.1:9/v1"), sandbox=SANDBOX)


def test_scheduler_records_tokens_in_rollouts_and_agent_calls_and_survives_a_dead_endpoint(suite, ray_local):
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.search.agent_calls import AgentCallLog

    store = MemoryRunStore(run_id="real")
    h = minimal()
    with ScriptedOpenAIServer(failing_for("BROKEN")) as srv:
        executor = {"_target_": "milo_ray.execution.agent_executor.AgentExecutor",
                    "model": model_cfg(srv.url, max_retries=0), "sandbox": SANDBOX}
        tasks = {t.task_id: t for t in suite.tasks("test")}
        sched = RolloutScheduler(executor, tasks, store, "openai/scripted", "real", progress=False, max_retries=1,
                                 retry_backoff_s=0.01, worker_env={KEY_ENV: "local-test-key"})
        sched.agent_calls = AgentCallLog(store)
        try:
            sched.add_harness(h)
            results = sched.run([RolloutRequest(h.harness_id, "answer", 0, seed=1),
                                 RolloutRequest(h.harness_id, "answer-broken", 0, seed=1)])
        finally:
            sched.close()
        served = list(srv.answered)
    by_task = {r.task_id: r for r in results}
    assert by_task["answer"].score == 1.0, by_task["answer"].error
    assert by_task["answer-broken"].error_kind == "infra", by_task["answer-broken"].error
    rollouts = {r["task_id"]: r for r in store.read("rollouts").to_pylist()}
    calls = [c for c in store.read("agent_calls").to_pylist() if c["role"] == "solver"]
    assert rollouts["answer"]["input_tokens"] == sum(c["input_tokens"] for c in calls) == sum(r.prompt_tokens for r in served)
    assert rollouts["answer"]["output_tokens"] == sum(c["output_tokens"] for c in calls) \
        == sum(r.completion_tokens for r in served)
    assert {c["agent"] for c in calls} == {h.harness_id}
    # The broken task's two attempts (one scheduler retry) each made one failed call: no
    # stored result carries them, but they are in the ledger.
    failed = [c for c in calls if c["error"]]
    assert len(failed) == 2 and {c["call_id"].split(":")[0] for c in failed} == {by_task["answer-broken"].cache_key}


def test_a_warm_harness_process_serves_the_next_rollout(suite):
    with ScriptedOpenAIServer(solving_policy) as srv:
        ex = AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX, warm_processes=1)

        async def two():
            first = await ex.aexecute(minimal(), suite.task("answer"), 0, 0)
            while not ex.pool._spares:  # the spare started by the first rollout
                await asyncio.sleep(0.2)
            second = await ex.aexecute(minimal(), suite.task("answer-15s"), 0, 0)
            ex.pool.close()
            return first, second

        first, second = asyncio.run(two())
        served = list(srv.answered)
    assert first.trace["trajectory"]["warm_process"] is False
    assert second.trace["trajectory"]["warm_process"] is True
    assert first.score == second.score == 1.0 and second.error_kind is None
    assert first.input_tokens + second.input_tokens == sum(r.prompt_tokens for r in served)

