"""The litellm solver against a local OpenAI-compatible server: real HTTP through
litellm and langchain, scripted answers with known usage."""

from __future__ import annotations

import pytest

from milo_ray.agents.llm import api_key, build_chat_model, check_credentials, price, usage_of
from milo_ray.config import ModelConfig
from milo_ray.testing.openai_server import ScriptedOpenAIServer, error, reply, tool_call

KEY = "OPENAI_API_KEY_FOR_TESTS"


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv(KEY, "local-secret")
    return KEY


def cfg(url: str, **kw) -> ModelConfig:
    return ModelConfig(solver="openai/scripted", api_base=url, api_key_env=KEY, **kw).check()


def test_an_answer_and_its_usage_come_back_through_litellm(key_env):
    with ScriptedOpenAIServer([reply("patched the parser", prompt_tokens=1234, completion_tokens=56)]) as srv:
        m = cfg(srv.url, temperature=0.0, max_output_tokens=300, usd_per_mtok_input=1.0, usd_per_mtok_output=4.0)
        msg = build_chat_model(m).invoke("fix the bug")
    assert msg.content == "patched the parser"
    u = usage_of(msg, m, seconds=0.5)
    assert (u.input_tokens, u.output_tokens) == (1234, 56)
    assert u.cost_usd == pytest.approx((1234 * 1.0 + 56 * 4.0) / 1e6)
    (body,) = srv.requests
    assert body["model"] == "scripted" and body["max_tokens"] == 300 and body["temperature"] == 0.0


def test_an_unpriced_model_costs_none_never_zero(key_env):
    with ScriptedOpenAIServer([reply("ok")]) as srv:
        m = cfg(srv.url)
        msg = build_chat_model(m).invoke("hi")
    assert usage_of(msg, m).cost_usd is None
    assert price(ModelConfig(solver="openai/gpt-4o-mini"), 1000, 1000) > 0  # litellm's local price map


def test_tool_calls_are_parsed(key_env):
    with ScriptedOpenAIServer([tool_call("write_file", {"file_path": "/app/a.py", "content": "x = 1\n"})]) as srv:
        from langchain_core.tools import tool

        @tool
        def write_file(file_path: str, content: str) -> str:
            """Write a file."""
            return "ok"

        msg = build_chat_model(cfg(srv.url)).bind_tools([write_file]).invoke("write it")
    assert msg.tool_calls[0]["name"] == "write_file"
    assert msg.tool_calls[0]["args"] == {"file_path": "/app/a.py", "content": "x = 1\n"}
    assert srv.requests[0]["tools"][0]["function"]["name"] == "write_file"


def test_429s_are_retried_up_to_max_retries(key_env):
    """The HTTP client under litellm retries twice on its own (3 requests); each of our
    ``max_retries`` repeats that, with backoff."""
    with ScriptedOpenAIServer([error(429)] * 4 + [reply("after the rate limit")]) as srv:
        msg = build_chat_model(cfg(srv.url), max_retries=3).invoke("hi")
    assert msg.content == "after the rate limit" and len(srv.requests) == 5
    with ScriptedOpenAIServer([error(429)] * 4 + [reply("too late")]) as srv:
        with pytest.raises(Exception, match="429"):
            build_chat_model(cfg(srv.url), max_retries=0).invoke("hi")
    assert len(srv.requests) == 3


def test_extra_body_reaches_the_server(key_env):
    with ScriptedOpenAIServer([reply("ok")]) as srv:
        build_chat_model(cfg(srv.url, extra_body={"top_k": 20})).invoke("hi")
    assert srv.requests[0]["top_k"] == 20


def test_missing_credentials_name_the_variable_and_never_the_value(monkeypatch):
    monkeypatch.delenv(KEY, raising=False)
    with pytest.raises(ValueError, match=f"model.api_key_env={KEY}: the environment variable {KEY} is not set"):
        check_credentials(ModelConfig(solver="openai/x", api_key_env=KEY))
    with pytest.raises(ValueError, match="model.api_key_env: openai/ models need an API key"):
        check_credentials(ModelConfig(solver="openai/x"))
    check_credentials(ModelConfig(solver="bedrock/anthropic.claude-3"))  # AWS credentials, not a key
    check_credentials(ModelConfig())  # offline: no solver, nothing to check
    monkeypatch.setenv(KEY, "sk-very-secret")
    assert api_key(ModelConfig(solver="openai/x", api_key_env=KEY)) == "sk-very-secret"
