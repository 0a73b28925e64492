"""Every fault of :mod:`milo_ray.testing.fault_server`, for every role that calls a
model, through real litellm, langchain and HTTP: a transport fault is retried (the call
succeeds and says it was retried), a content fault is handled by the role's policy
(re-asked, scored, or handed back to the agent loop), and either way the call is
recorded in ``agent_calls`` (or, for the solver, in the rollout's call records) and
the role finishes. One server serves the whole module; each test schedules its fault."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from milo_ray.agents.judges.llm import LLMJudge
from milo_ray.llm.client import build_chat_model
from milo_ray.agents.orchestrators.llm import LLMOrchestrator
from milo_ray.llm.solver_calls import SolverCallRecorder
from milo_ray.config.schemas import ModelConfig
from milo_ray.search.agent_calls import AgentCallLog
from milo_ray.ssr import evidence as ev
from milo_ray.store.memory import MemoryRunStore
from milo_ray.testing import scripted_agents as sa
from milo_ray.testing import scripted_roles as sr
from milo_ray.testing.fault_server import CONTENT_FAULTS, RETRY_AFTER_S, TRANSPORT_FAULTS, FaultInjectingServer
from milo_ray.testing.openai_server import reply

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "agents"))
sys.path.insert(0, str(HERE.parent / "milo"))
from test_llm_judge import item  # noqa: E402
from test_orchestrator_reask import TRIGGER, View, run  # noqa: E402

KEY = "FAULT_SERVER_KEY_FOR_TESTS"
TIMEOUT_S = 1.0  # request_timeout_s of every client: the server's slow answer comes later
SOLVER_TOKENS = (30, 7)
# Faults a plain (not streamed) request cannot meet: a stream cut is tested on streams.
PLAIN_TRANSPORT = tuple(f for f in TRANSPORT_FAULTS if f != "stream_cut")


def solver_policy(body):
    return reply("the solver's answer", prompt_tokens=SOLVER_TOKENS[0], completion_tokens=SOLVER_TOKENS[1])


def reassign_only(body):
    """The scripted orchestrator's decision without its graft (a graft is a mutation,
    tested with the coding agents)."""
    r = sr.orchestrator_policy(body)
    try:
        decision = json.loads(r.content)
    except ValueError:  # a re-ask's prompt: the stalled island of these tests' state
        decision = {"diagnosis": "dry", "kind": "dry_mutator", "reassign": [{"island": TRIGGER, "mutator": "bold"}]}
    decision.pop("recombine", None)
    return reply(json.dumps(decision), prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens)


@pytest.fixture(scope="module")
def server():
    policy = sr.by_model({"solver": solver_policy, "judge": sr.judge_policy, "orchestrator": reassign_only,
                          "mutator": sa.mutator_policy, "optimizer": sa.mutator_policy})
    with FaultInjectingServer(policy, slow_s=TIMEOUT_S + 1.0) as srv:
        yield srv


@pytest.fixture
def srv(server, monkeypatch):
    monkeypatch.setenv(KEY, "local-secret")
    server.reset()
    yield server
    assert server.pending() == 0, "a scheduled fault was never served"


def llm(srv, role: str, **kw):
    return {"model": f"openai/{role}", "api_base": srv.url, "api_key_env": KEY, "max_retries": 2,
            "retry_base_s": 0.01, "retry_max_s": 1.0, "request_timeout_s": TIMEOUT_S,
            "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, **kw}


def _retried(srv, fault: str) -> None:
    """The fault was served once, then the same request answered."""
    assert [f for _, f in srv.injected] == [fault]
    assert len(srv.requests) >= 2
    if fault == "429":
        assert srv.request_times[1] - srv.request_times[0] >= RETRY_AFTER_S  # Retry-After honoured


# --- solver: the harness's chat model ---------------------------------------------------
def solver(srv):
    cfg = ModelConfig(solver="openai/solver", api_base=srv.url, api_key_env=KEY, max_retries=2, retry_base_s=0.01,
                      retry_max_s=1.0, request_timeout_s=TIMEOUT_S).check()
    rec = SolverCallRecorder(cfg)
    return build_chat_model(cfg, rate_limiter=None, callbacks=[rec]), rec


@pytest.mark.parametrize("fault", PLAIN_TRANSPORT)
def test_solver_retries_a_transport_fault_and_records_the_retry(srv, fault):
    srv.inject(fault)
    model, rec = solver(srv)
    assert model.invoke("hi").content == "the solver's answer"
    _retried(srv, fault)
    (call,) = rec.calls()
    assert call.usage.retries == 1 and call.usage.error is None
    assert (call.usage.input_tokens, call.usage.output_tokens) == SOLVER_TOKENS


def test_solver_stream_cut_mid_message_is_a_recorded_failed_call(srv):
    """Text already delivered cannot be asked again: the harness sees the error (a
    harness failure, scored), and the call is recorded with it."""
    srv.inject("stream_cut")
    model, rec = solver(srv)
    with pytest.raises(Exception):
        list(model.stream("hi"))
    (call,) = rec.calls()
    assert call.usage.error and len(srv.requests) == 1


def test_solver_tool_call_with_malformed_arguments_reaches_the_agent_as_invalid(srv):
    srv.inject("malformed_tool_args")
    model, rec = solver(srv)
    msg = model.invoke("hi")
    assert msg.tool_calls == [] and msg.invalid_tool_calls and msg.invalid_tool_calls[0]["id"] == "call_bad"
    assert rec.calls()[0].usage.error is None  # the call worked; the agent loop reports the bad call


# --- judge ----------------------------------------------------------------------------
def judge(srv, fault: str):
    srv.inject(fault, when=lambda b: b.get("model") == "judge")
    log = AgentCallLog(MemoryRunStore(run_id="faults"))
    rec = ev.judge_one(LLMJudge(llm(srv, "judge")), item(), round=0, harness_id="h", retries=1)
    for k, usage in enumerate(rec.usage):  # as SSR's judging round records them
        log.record("judge", usage, call_id=f"judge:r0:t1:a{k}", agent="llm-judge", model="openai/judge", round=0)
    return rec, log.store.read("agent_calls").to_pylist()


@pytest.mark.parametrize("fault", PLAIN_TRANSPORT)
def test_judge_retries_a_transport_fault_and_records_the_retry(srv, fault):
    rec, rows = judge(srv, fault)
    assert rec.ok and rec.attempts == 1
    _retried(srv, fault)
    (row,) = rows
    assert row["retries"] == 1 and row["error"] is None and row["output_tokens"] == sr.JUDGE_TOKENS[1]


def test_judge_verdict_out_of_range_is_reasked_never_clipped(srv):
    rec, rows = judge(srv, "judge_out_of_range")
    assert rec.ok and rec.attempts == 2 and rec.w <= 1.0
    assert len(rows) == 2 and sum(r["input_tokens"] for r in rows) == sum(r.prompt_tokens for r in srv.answered)


def test_judge_verdict_out_of_range_twice_is_a_recorded_judge_error(srv):
    srv.inject("judge_out_of_range", times=2, when=lambda b: b.get("model") == "judge")
    log = AgentCallLog(MemoryRunStore(run_id="faults"))
    rec = ev.judge_one(LLMJudge(llm(srv, "judge")), item(), round=0, harness_id="h", retries=1)
    for k, usage in enumerate(rec.usage):
        log.record("judge", usage, call_id=f"judge:r0:t1:a{k}")
    assert not rec.ok and "w" in rec.judge_error and rec.w is None
    assert log.store.read("agent_calls").num_rows == 2


# --- orchestrator: through the MILO loop's intervention -------------------------------
def orchestrate(srv, tmp_path, fault: str):
    srv.inject(fault, when=lambda b: b.get("model") == "orchestrator")
    view = View(tmp_path, LLMOrchestrator(llm(srv, "orchestrator")))
    run(view)
    return view


@pytest.mark.parametrize("fault", PLAIN_TRANSPORT)
def test_orchestrator_retries_a_transport_fault_and_applies_the_decision(srv, tmp_path, fault):
    from milo_ray.milo.events import Decision, InterventionDone

    view = orchestrate(srv, tmp_path, fault)
    _retried(srv, fault)
    assert len(view.of(Decision)) == 1 and len(view.of(InterventionDone)) == 1
    (row,) = view.calls()
    assert row["role"] == "orchestrator" and row["retries"] == 1 and row["error"] is None


def test_orchestrator_decision_naming_nothing_real_is_reasked_then_applied(srv, tmp_path):
    from milo_ray.milo.events import Decision, DecisionInvalid

    view = orchestrate(srv, tmp_path, "orchestrator_unknown")
    assert len(srv.requests) == 2 and view.of(DecisionInvalid) == []
    (d,) = view.of(Decision)
    assert all(m["island"] != 99 for m in d.decision.get("reassign", []))
    assert view.state.assignment[TRIGGER] != "no-such-mutator"
    assert [c["call_id"].endswith(":reask") for c in view.calls()] == [False, True]


# --- mutator and optimizer: the deepagents coding agent behind its gateway -------------
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the agent's sandbox needs bwrap")


def coding_agent(role: str, srv, tmp_path):
    from test_deepagents_mutator import make_request

    from milo_ray.agents.mutators.deepagents import DeepAgentsMutator

    name = "deepagents" if role == "mutator" else "ssr-optimizer"
    ctx = None if role == "mutator" else {"records": [{"task_id": "t1"}], "scale": 1}
    req = make_request(tmp_path, context=ctx)
    return DeepAgentsMutator(llm(srv, role), name=name).mutate(req)


# Each case runs a whole coding-agent loop (seconds): two of them in the fast suite, the
# rest marked slow.
CODING_CASES = [pytest.param(role, fault, marks=() if (role, fault) in {("mutator", "500"), ("optimizer", "429")}
                             else pytest.mark.slow)
                for role in ("mutator", "optimizer") for fault in PLAIN_TRANSPORT + ("malformed_tool_args",)]


@needs_bwrap
@pytest.mark.parametrize("role,fault", CODING_CASES)
def test_coding_agent_survives_a_fault_and_its_usage_counts_every_billed_call(srv, tmp_path, role, fault):
    # The agent's first model call meets the fault (the gateway retries a transport one).
    srv.inject(fault, when=lambda b: b.get("model") == role)
    out = coding_agent(role, srv, tmp_path)
    if fault in PLAIN_TRANSPORT:
        assert out.child is not None, out.error
        assert sa.MARKER in out.child.source
    else:
        # The agent finished either way: a child, or none and a reason (a rejected
        # mutation: the search goes on).
        assert out.child is not None or out.error
    # A slow answer the gateway gave up on was still billed by the provider, and its
    # usage never reached anyone: the known limit of a timed-out call (docs/reliability.md).
    billed_in = sum(r.prompt_tokens for r in srv.answered if not r.delay_s)
    assert out.usage.input_tokens == billed_in
    if fault in PLAIN_TRANSPORT:
        _retried(srv, fault)
        assert out.usage.retries == 1 and out.usage.error is None
    else:
        # The agent loop takes an answer whose only tool call cannot be parsed as its
        # last: the mutation ends with no child and says why, its billed call counted
        # (a rejected mutation; the search goes on).
        assert out.usage.retries == 0 and len(srv.answered) >= 1
        assert out.child is not None or "no child" in out.error
