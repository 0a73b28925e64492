"""The litellm solver against a local OpenAI-compatible server: real HTTP through
litellm and langchain, scripted answers with known usage."""

from __future__ import annotations

import asyncio
import time

import pytest

from milo_ray.llm.client import api_key, build_chat_model, check_credentials, price, usage_of
from milo_ray.config.schemas import ModelConfig
from milo_ray.llm.solver_calls import SolverCallRecorder
from milo_ray.testing.openai_server import (SCRIPTED_KEY_ENV, Reply, ScriptedOpenAIServer, error, reply,
                                           scripted_model, tool_call)

KEY = SCRIPTED_KEY_ENV


def test_an_answer_and_its_usage_come_back_through_litellm(key_env):
    with ScriptedOpenAIServer([reply("patched the parser", prompt_tokens=1234, completion_tokens=56)]) as srv:
        m = scripted_model(srv.url, temperature=0.0, max_output_tokens=300, usd_per_mtok_input=1.0, usd_per_mtok_output=4.0)
        msg = build_chat_model(m).invoke("fix the bug")
    assert msg.content == "patched the parser"
    u = usage_of(msg, m, seconds=0.5)
    assert (u.input_tokens, u.output_tokens) == (1234, 56)
    assert u.cost_usd == pytest.approx((1234 * 1.0 + 56 * 4.0) / 1e6)
    (body,) = srv.requests
    assert body["model"] == "scripted" and body["max_tokens"] == 300 and body["temperature"] == 0.0


def test_an_unpriced_model_costs_none_never_zero(key_env):
    with ScriptedOpenAIServer([reply("ok")]) as srv:
        m = scripted_model(srv.url)
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

        msg = build_chat_model(scripted_model(srv.url)).bind_tools([write_file]).invoke("write it")
    assert msg.tool_calls[0]["name"] == "write_file"
    assert msg.tool_calls[0]["args"] == {"file_path": "/app/a.py", "content": "x = 1\n"}
    assert srv.requests[0]["tools"][0]["function"]["name"] == "write_file"


FAST = {"retry_base_s": 0.01, "retry_max_s": 0.05}


def test_a_429_is_retried_once_and_the_call_succeeds(key_env):
    """One retry is one more HTTP request: the HTTP client's own retries are off."""
    rec = SolverCallRecorder(scripted_model("http://x"))
    with ScriptedOpenAIServer([error(429), reply("after the rate limit")]) as srv:
        msg = build_chat_model(scripted_model(srv.url, **FAST), callbacks=[rec]).invoke("hi")
    assert msg.content == "after the rate limit" and len(srv.requests) == 2
    (call,) = rec.calls()
    assert call.usage.retries == 1 and call.usage.error is None


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_forever_fails_after_exactly_max_retries_plus_one_requests(key_env, status):
    rec = SolverCallRecorder(scripted_model("http://x"))
    with ScriptedOpenAIServer([error(status)]) as srv:
        with pytest.raises(Exception, match=str(status)) as info:
            build_chat_model(scripted_model(srv.url, max_retries=2, **FAST), callbacks=[rec]).invoke("hi")
    assert len(srv.requests) == 3
    assert "failed after 3 request(s)" in "".join(getattr(info.value, "__notes__", []))
    (call,) = rec.calls()
    assert call.usage.retries == 2 and str(status) in call.usage.error


@pytest.mark.parametrize("status", [400, 401, 404])
def test_other_4xx_are_never_retried(key_env, status):
    with ScriptedOpenAIServer([error(status), reply("never reached")]) as srv:
        with pytest.raises(Exception):
            build_chat_model(scripted_model(srv.url, max_retries=3, **FAST)).invoke("hi")
    assert len(srv.requests) == 1


def test_max_retries_zero_sends_one_request(key_env):
    with ScriptedOpenAIServer([error(429), reply("too late")]) as srv:
        with pytest.raises(Exception, match="429"):
            build_chat_model(scripted_model(srv.url, max_retries=0)).invoke("hi")
    assert len(srv.requests) == 1


def test_backoff_sleeps_within_the_full_jitter_envelope(key_env):
    """Retry i sleeps in [0, min(retry_max_s, retry_base_s * 2**(i-1))]: with base 0.4 and
    cap 0.5 three retries sleep at most 0.4 + 0.5 + 0.5 s, and jitter makes sleeping the
    whole envelope every time unlikely."""
    gaps = []
    for _ in range(2):
        with ScriptedOpenAIServer([error(503)] * 3 + [reply("ok")]) as srv:
            build_chat_model(scripted_model(srv.url, max_retries=3, retry_base_s=0.4, retry_max_s=0.5)).invoke("hi")
        assert len(srv.requests) == 4
        times = srv.request_times
        gaps += [b - a for a, b in zip(times, times[1:])]
    envelope = [0.4, 0.5, 0.5] * 2
    assert all(g <= e + 0.3 for g, e in zip(gaps, envelope)), gaps
    assert sum(gaps) < sum(envelope), gaps  # full jitter, not a fixed wait


def test_a_hung_request_times_out_within_request_timeout(key_env):
    with ScriptedOpenAIServer([Reply(content="too late", delay_s=3.0)]) as srv:
        model = build_chat_model(scripted_model(srv.url, max_retries=1, request_timeout_s=0.5, **FAST))
        t0 = time.monotonic()
        with pytest.raises(Exception, match="(?i)time"):
            model.invoke("hi")
        elapsed = time.monotonic() - t0
    assert len(srv.requests) == 2  # a timeout is retried like a dropped connection
    assert elapsed < 2 * 0.5 + 1.0, elapsed


def test_async_calls_retry_the_same_way(key_env):
    rec = SolverCallRecorder(scripted_model("http://x"))
    with ScriptedOpenAIServer([error(500), error(429), reply("ok")]) as srv:
        msg = asyncio.run(build_chat_model(scripted_model(srv.url, **FAST), callbacks=[rec]).ainvoke("hi"))
    assert msg.content == "ok" and len(srv.requests) == 3
    assert rec.calls()[0].usage.retries == 2


def test_a_dropped_connection_is_retried(key_env):
    """Nothing listens on the port: every attempt is refused, and each is one attempt."""
    with ScriptedOpenAIServer([reply("x")]) as srv:
        url = srv.url
    rec = SolverCallRecorder(scripted_model("http://x"))
    with pytest.raises(Exception, match="(?i)connect"):
        build_chat_model(scripted_model(url, max_retries=2, **FAST), callbacks=[rec]).invoke("hi")
    assert rec.calls()[0].usage.retries == 2


def test_extra_body_reaches_the_server(key_env):
    with ScriptedOpenAIServer([reply("ok")]) as srv:
        build_chat_model(scripted_model(srv.url, extra_body={"top_k": 20})).invoke("hi")
    assert srv.requests[0]["top_k"] == 20


def test_missing_credentials_name_the_variable_and_never_the_value(monkeypatch):
    monkeypatch.delenv(KEY, raising=False)
    with pytest.raises(ValueError, match=f"model.api_key_env={KEY}: the environment variable {KEY} is not set"):
        check_credentials(ModelConfig(solver="openai/x", api_key_env=KEY))
    # No api_key_env: the provider's own variable, named in the error.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"model.api_key_env \(unset: openai/ models read OPENAI_API_KEY\)"):
        check_credentials(ModelConfig(solver="openai/x"))
    monkeypatch.setenv("OPENAI_API_KEY", "from-the-provider-variable")
    assert api_key(ModelConfig(solver="openai/x")) == "from-the-provider-variable"
    check_credentials(ModelConfig(solver="bedrock/anthropic.claude-3"))  # AWS credentials, not a key
    check_credentials(ModelConfig())  # offline: no solver, nothing to check
    monkeypatch.setenv(KEY, "sk-very-secret")
    assert api_key(ModelConfig(solver="openai/x", api_key_env=KEY)) == "sk-very-secret"


def test_the_litellm_yaml_carries_every_knob_to_the_chat_model(key_env):
    """conf/model/litellm.yaml against the ModelConfig schema (merged as Hydra would,
    without composing the other groups), with command-line style overrides."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from milo_ray.config.schemas import model_config
    from milo_ray.run import CONF_DIR

    yaml = OmegaConf.load(Path(CONF_DIR) / "model" / "litellm.yaml")
    yaml.pop("defaults")
    overrides = OmegaConf.from_dotlist([
        "solver=openai/scripted", f"api_key_env={KEY}", "max_retries=5", "retry_base_s=0.5", "retry_max_s=8",
        "rpm=100", "tpm=20000"])
    m = model_config(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml, overrides))
    assert (m.max_retries, m.retry_base_s, m.retry_max_s, m.rpm, m.tpm, m.request_timeout_s) == (5, 0.5, 8.0, 100, 20000,
                                                                                              600.0)
    defaults = model_config(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml, {"solver": "openai/x"}))
    assert (defaults.max_retries, defaults.rpm, defaults.tpm) == (3, None, None)
    model = build_chat_model(m)
    assert (model.max_retries, model.retry_base_s, model.retry_max_s, model.request_timeout) == (5, 0.5, 8.0, 600.0)
    limiter = model.request_limiter  # the limits are the provider account's (llm/accounts.py)
    assert (limiter.account, limiter.rpm, limiter.tpm) == (f"openai|{KEY}|-", 100, 20000)


@pytest.mark.parametrize("kw,field", [({"max_retries": -1}, "max_retries"), ({"retry_base_s": -1.0}, "retry_base_s"),
                                      ({"retry_base_s": 5.0, "retry_max_s": 1.0}, "retry_max_s"),
                                      ({"request_timeout_s": 0}, "request_timeout_s")])
def test_bad_retry_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"model.{field}="):
        ModelConfig(solver="openai/x", **kw).check()
