"""A 429's ``Retry-After`` sets the wait before the retry, and streamed answers count
toward ``tpm`` -- against the local OpenAI-compatible server, through litellm."""

from __future__ import annotations

import asyncio
import types

from milo_ray.llm.client import RetryWait, build_chat_model, retry_after_s
from milo_ray.llm.rate_limit import SharedRateLimiter
from milo_ray.testing.openai_server import ScriptedOpenAIServer, error, reply, scripted_model


class _Headers(dict):
    def get(self, k, d=None):
        return super().get(k.lower(), d)


def _state(exc):
    outcome = types.SimpleNamespace(failed=True, exception=lambda: exc)
    return types.SimpleNamespace(outcome=outcome, attempt_number=1)


def test_retry_after_is_the_wait_capped_at_retry_max_s():
    exc = Exception("429")
    exc.response = types.SimpleNamespace(headers=_Headers({"retry-after": "7"}))
    assert retry_after_s(exc) == 7.0
    assert RetryWait(0.001, 30.0)(_state(exc)) == 7.0
    assert RetryWait(0.001, 5.0)(_state(exc)) == 5.0  # the config's longest wait wins
    exc.litellm_response_headers = _Headers({"retry-after-ms": "1500"})
    assert RetryWait(0.001, 30.0)(_state(exc)) == 1.5
    # Without the header: the jittered backoff, never above base * 2 on the first retry.
    assert RetryWait(0.001, 30.0)(_state(Exception("500"))) <= 0.002


def test_a_429_with_retry_after_is_retried_no_sooner_than_it_asks(key_env):
    with ScriptedOpenAIServer([error(429, retry_after=0.4), reply("after the wait")]) as srv:
        m = scripted_model(srv.url, retry_base_s=0.001, retry_max_s=5.0, max_retries=2)
        msg = build_chat_model(m, rate_limiter=None).invoke("hi")
    assert msg.content == "after the wait"
    first, second = srv.request_times
    assert second - first >= 0.4  # jittered backoff alone would wait at most ~2 ms


def test_the_gateway_honours_retry_after_too(key_env):
    from milo_ray.boundary.gateway import upstream

    async def go(url):
        return await upstream.complete(scripted_model(url, retry_base_s=0.001, retry_max_s=5.0, max_retries=2), "k",
                                       {"messages": [{"role": "user", "content": "hi"}]}, None)

    with ScriptedOpenAIServer([error(429, retry_after=0.4), reply("ok", prompt_tokens=3, completion_tokens=2)]) as srv:
        answer = asyncio.run(go(srv.url))
    assert answer.retries == 1 and srv.request_times[1] - srv.request_times[0] >= 0.4


class _CountingLimiter(SharedRateLimiter):
    """The shared limiter, keeping what was reported to it: the budget itself lives in a Ray
    actor when a test before this one left Ray running, so the test reads its own tally."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reported = 0

    def report_tokens(self, tokens: int) -> None:
        self.reported += int(tokens)
        super().report_tokens(tokens)

    def spent(self) -> int:
        return self.reported


def _limiter(name: str) -> _CountingLimiter:
    return _CountingLimiter(name, None, 10_000, window_s=600.0)


def test_a_streamed_answer_counts_toward_tpm(key_env):
    lim = _limiter("stream-tpm-sync")
    with ScriptedOpenAIServer([reply("a streamed answer of some length", prompt_tokens=120, completion_tokens=30)]) as srv:
        text = "".join(c.content for c in build_chat_model(scripted_model(srv.url), rate_limiter=lim).stream("hi"))
    assert text == "a streamed answer of some length"
    assert lim.spent() == 150


def test_an_async_streamed_answer_counts_toward_tpm(key_env):
    lim = _limiter("stream-tpm-async")

    async def go(url):
        return [c async for c in build_chat_model(scripted_model(url), rate_limiter=lim).astream("hi")]

    with ScriptedOpenAIServer([reply("streamed", prompt_tokens=40, completion_tokens=9)]) as srv:
        asyncio.run(go(srv.url))
    assert lim.spent() == 49


def test_a_stream_the_caller_stops_reading_still_counts_what_it_reported(key_env):
    lim = _limiter("stream-tpm-stopped")
    with ScriptedOpenAIServer([reply("x" * 200, prompt_tokens=50, completion_tokens=70)]) as srv:
        model = build_chat_model(scripted_model(srv.url), rate_limiter=lim)
        chunks = list(model.stream("hi"))
    assert chunks and lim.spent() == 120
