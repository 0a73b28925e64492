"""The solver-call recorder with a real ChatLiteLLM against the scripted server: one
SolverCall per chat-model call, tokens as the server reported them, USD from the
config's prices, retries and errors of failed calls."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from milo_ray.llm.client import build_chat_model
from milo_ray.llm.solver_calls import SolverCallRecorder
from milo_ray.config.schemas import ModelConfig
from milo_ray.testing.openai_server import ScriptedOpenAIServer, error, reply, scripted_model, tool_call

pytestmark = pytest.mark.usefixtures("key_env")


def cfg(url: str, **kw) -> ModelConfig:
    return scripted_model(url, retry_base_s=0.01, retry_max_s=0.02, **kw)


def test_a_three_call_conversation_gives_three_records_with_the_servers_usage():
    script = [tool_call("ls", {"path": "/app"}, prompt_tokens=120, completion_tokens=7),
              tool_call("read", {"path": "/app/a.py"}, prompt_tokens=180, completion_tokens=9, call_id="call_2"),
              reply("done", prompt_tokens=260, completion_tokens=31)]
    with ScriptedOpenAIServer(script) as srv:
        m = cfg(srv.url, usd_per_mtok_input=2.0, usd_per_mtok_output=8.0)
        rec = SolverCallRecorder(m)
        model = build_chat_model(m, callbacks=[rec])
        history: list = [HumanMessage("list then read")]
        for _ in range(3):
            answer = model.invoke(history)
            history.append(answer)
            for call in answer.tool_calls:
                history.append(ToolMessage("ok", tool_call_id=call["id"]))
    calls = rec.calls()
    assert [(c.usage.input_tokens, c.usage.output_tokens) for c in calls] == [
        (r.prompt_tokens, r.completion_tokens) for r in script]
    assert rec.tokens() == sum(r.prompt_tokens + r.completion_tokens for r in script)
    rows = json.loads(json.dumps(rec.as_dicts()))  # the trajectory stores them as JSON
    assert [(r["input_tokens"], r["output_tokens"], r["retries"], r["error"]) for r in rows] == [
        (r.prompt_tokens, r.completion_tokens, 0, None) for r in script]
    assert all(r["model"] == "openai/scripted" and r["started_at"] <= r["finished_at"] for r in rows)
    assert [c.usage.cost_usd for c in calls] == pytest.approx(
        [(r.prompt_tokens * 2.0 + r.completion_tokens * 8.0) / 1e6 for r in script])
    assert all(c.usage.retries == 0 and c.usage.error is None and c.model == "openai/scripted" for c in calls)
    assert all(c.started_at <= c.finished_at and c.usage.seconds > 0 for c in calls)
    assert [c.finished_at for c in calls] == sorted(c.finished_at for c in calls)


def test_a_call_that_fails_forever_is_recorded_with_its_error_and_retries():
    with ScriptedOpenAIServer([error(500)]) as srv:
        m = cfg(srv.url, max_retries=2)
        rec = SolverCallRecorder(m)
        with pytest.raises(Exception, match="500"):
            build_chat_model(m, callbacks=[rec]).invoke("hi")
    (call,) = rec.calls()
    assert call.usage.error.startswith("InternalServerError") and "500" in call.usage.error
    assert call.usage.retries == 2 == len(srv.requests) - 1
    assert (call.usage.input_tokens, call.usage.output_tokens) == (0, 0)
    assert call.usage.cost_usd is None  # unpriced model: unknown, never free


def test_concurrent_async_calls_are_each_recorded_once():
    script = [reply(f"a{i}", prompt_tokens=10 + i, completion_tokens=i + 1) for i in range(5)]
    with ScriptedOpenAIServer(script) as srv:
        m = cfg(srv.url)
        rec = SolverCallRecorder(m)
        model = build_chat_model(m, callbacks=[rec])

        async def burst():
            return await asyncio.gather(*(model.ainvoke(f"q{i}") for i in range(5)))

        answers = asyncio.run(burst())
    calls = rec.calls()
    assert len(calls) == 5
    # Which request got which scripted reply depends on arrival order; the pairs must match.
    got = sorted((c.usage.input_tokens, c.usage.output_tokens) for c in calls)
    assert got == sorted((a.usage_metadata["input_tokens"], a.usage_metadata["output_tokens"]) for a in answers)
    assert got == [(10 + i, i + 1) for i in range(5)]


def test_a_recorder_passed_in_the_invoke_config_records_too():
    """Agents get callbacks through their run config, not the model's constructor."""
    with ScriptedOpenAIServer([reply("ok", prompt_tokens=3, completion_tokens=2)]) as srv:
        m = cfg(srv.url)
        rec = SolverCallRecorder(m)
        build_chat_model(m).invoke("hi", config={"callbacks": [rec]})
    ((tin, tout),) = [(c.usage.input_tokens, c.usage.output_tokens) for c in rec.calls()]
    assert (tin, tout) == (3, 2)
