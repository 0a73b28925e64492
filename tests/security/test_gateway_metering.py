"""Metering the caller cannot cut: every call the gateway admits is charged -- the
provider's own usage when it arrives, the call's reserved upper bound when it cannot be
learned, never 0 -- and a rollout's calls in parallel never together pass its token cap.
Real clients against the real gateway, and real HTTP upstreams that bill usage only in a
stream's final chunk."""

from __future__ import annotations

import asyncio
import json

import pytest

from milo_ray.boundary.gateway import server as gateway_server
from milo_ray.boundary.gateway.server import ModelGateway
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, reply

BILLED = (1500, 300)  # what the slow provider bills a streamed call, in its last chunk only


async def _slow_provider(gap_s: float, seen: list):
    """A provider that streams two words ``gap_s`` apart, then the finish and, last, the
    usage chunk (as OpenAI does with ``include_usage``); returns (runner, base URL)."""
    from aiohttp import web

    async def chat(request):
        body = await request.json()
        seen.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        for word in ("one ", "two"):
            chunk = {**base, "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(gap_s)
        finish = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        usage = {**base, "choices": [], "usage": {"prompt_tokens": BILLED[0], "completion_tokens": BILLED[1],
                                                  "total_tokens": sum(BILLED)}}
        await resp.write(f"data: {json.dumps(finish)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"


def _cfg(url: str, **extra) -> dict:
    return {"solver": "openai/m", "api_base": url, "max_retries": 0, "usd_per_mtok_input": 1.0,
            "usd_per_mtok_output": 1.0, **extra}


async def _gateway(url: str, tmp_path, **cfg) -> ModelGateway:
    gw = ModelGateway(_cfg(url, **cfg), tmp_path / "gw.sock")
    gw.set_key("sk-upstream")
    await gw.start()
    return gw


async def _leave_after_first_word(socket_path: str, token: str) -> None:
    """A client that reads the stream's first word and hangs up."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as s:
        async with s.post("http://gateway/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                          json={"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                "max_tokens": 400}) as r:
            async for line in r.content:
                if b"one" in line:
                    break


async def _until(cond, timeout_s: float = 20.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)


def test_a_stream_its_caller_abandons_is_charged_the_providers_usage(tmp_path):
    async def go():
        seen: list = []
        runner, url = await _slow_provider(0.3, seen)
        gw = await _gateway(url, tmp_path)
        grant = gw.issue("h/t")
        await _leave_after_first_word(gw.socket_path, grant.token)
        await _until(lambda: grant.calls)
        await gw.close()
        await runner.cleanup()
        return grant, seen

    grant, seen = asyncio.run(go())
    (call,) = grant.calls
    assert (call["input_tokens"], call["output_tokens"]) == BILLED and call["error"] is None
    assert grant.tokens() == sum(BILLED) and not grant.failures
    # The gateway asked the provider for the usage chunk it then waited for.
    assert seen[0]["stream_options"] == {"include_usage": True}


def test_a_stream_whose_usage_never_comes_is_charged_its_reservation_never_zero(tmp_path, monkeypatch):
    """The caller left and the provider's answer did not end in time: what it will bill is
    unknown, so the call is charged its upper bound (the request's bytes + max_tokens)."""
    monkeypatch.setattr(gateway_server, "STREAM_DRAIN_S", 0.2)

    async def go():
        runner, url = await _slow_provider(2.0, [])
        gw = await _gateway(url, tmp_path)
        grant = gw.issue("h/t")
        await _leave_after_first_word(gw.socket_path, grant.token)
        await _until(lambda: grant.calls)
        await gw.close()
        await runner.cleanup()
        return grant

    grant = asyncio.run(go())
    (call,) = grant.calls
    charged = call["input_tokens"] + call["output_tokens"]
    assert call["output_tokens"] == 400 and call["input_tokens"] > 0  # max_tokens + the request's bytes
    assert charged > sum(BILLED) // 10 and "reserved upper bound" in call["error"]
    assert grant.reserved == 0 and grant.in_flight == 0


def test_a_stream_the_provider_cuts_before_its_usage_is_charged_its_reservation(tmp_path):
    import httpx
    import openai

    async def go():
        with ScriptedOpenAIServer([Reply(content="a long answer cut midway", prompt_tokens=900,
                                         completion_tokens=700, fault="stream_cut")]) as srv:
            gw = await _gateway(srv.url, tmp_path, max_output_tokens=500)
            grant = gw.issue("h/t")
            client = openai.AsyncOpenAI(api_key=grant.token, base_url="http://gateway/v1", max_retries=0,
                                        http_client=httpx.AsyncClient(
                                            transport=httpx.AsyncHTTPTransport(uds=gw.socket_path)))
            # The cut reaches the client as an early end of the stream (the provider closed it).
            async for _ in await client.chat.completions.create(
                    model="x", messages=[{"role": "user", "content": "hi"}], stream=True):
                pass
            await client.close()
            await _until(lambda: grant.calls)
            await gw.close()
            return grant, srv.requests

    grant, sent = asyncio.run(go())
    assert sent[0]["stream_options"] == {"include_usage": True}
    (call,) = grant.calls
    assert call["output_tokens"] == 500 and call["input_tokens"] > 0 and "reserved upper bound" in call["error"]


def test_calls_in_parallel_never_together_pass_the_rollouts_token_cap(tmp_path):
    cap, asked = 2500, 400

    def provider(body: dict) -> Reply:
        # A provider that honours max_tokens and bills a prompt below the request's size.
        return Reply(content="x", prompt_tokens=20, completion_tokens=int(body.get("max_tokens") or 10_000),
                     delay_s=0.4)

    async def go():
        import aiohttp

        with ScriptedOpenAIServer(provider) as srv:
            gw = await _gateway(srv.url, tmp_path)
            grant = gw.issue("h/t", token_cap=cap)

            async def one(i: int) -> int:
                async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=gw.socket_path)) as s:
                    async with s.post("http://gateway/v1/chat/completions",
                                      headers={"Authorization": f"Bearer {grant.token}"},
                                      json={"messages": [{"role": "user", "content": f"call {i}"}],
                                            "max_tokens": asked}) as r:
                        return r.status

            statuses = await asyncio.gather(*(one(i) for i in range(10)))
            await gw.close()
            return grant, statuses, [r.get("max_tokens") for r in srv.requests]

    grant, statuses, forwarded = asyncio.run(go())
    assert grant.tokens() <= cap, (grant.tokens(), forwarded)
    assert statuses.count(200) == len(forwarded) >= 4 and 429 in statuses
    # The last call admitted had its answer bounded to what the cap had left.
    assert min(forwarded) < asked and grant.stop_reason == "token_cap"


def test_a_call_still_in_flight_when_its_rollout_ends_is_charged_once(tmp_path):
    async def go():
        runner, url = await _slow_provider(0.5, [])
        gw = await _gateway(url, tmp_path)
        grant = gw.issue("h/t")
        caller = asyncio.ensure_future(_leave_after_first_word(gw.socket_path, grant.token))
        await _until(lambda: grant.in_flight)
        gw.end(grant)
        settled = await gw.settle(grant, wait_s=0.05)  # the harness ended before the answer did
        first = list(grant.calls)
        await caller
        await asyncio.sleep(1.5)  # the provider's answer, and its usage, come in late
        await gw.close()
        await runner.cleanup()
        return settled, first, grant

    settled, first, grant = asyncio.run(go())
    assert settled == 1
    (call,) = first
    assert call["output_tokens"] > 400 and "still in flight" in call["error"]  # bytes + max_tokens
    assert grant.calls == first  # charged once: the late answer adds nothing


def test_a_call_the_provider_answers_too_late_is_charged_its_reservation(tmp_path):
    """The gateway stopped waiting (its request timeout), but the provider went on and
    billed the answer: the call is charged its upper bound, and the endpoint's failure."""
    async def go():
        import aiohttp

        with ScriptedOpenAIServer([reply("late", prompt_tokens=30, completion_tokens=20)]) as srv:
            srv.script[0].delay_s = 1.5
            gw = await _gateway(srv.url, tmp_path, request_timeout_s=0.3, max_output_tokens=100)
            grant = gw.issue("h/t")
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=gw.socket_path)) as s:
                async with s.post("http://gateway/v1/chat/completions",
                                  headers={"Authorization": f"Bearer {grant.token}"},
                                  json={"messages": [{"role": "user", "content": "hi"}]}) as r:
                    status = r.status
            await gw.close()
            return grant, status

    grant, status = asyncio.run(go())
    assert status >= 400
    (call,) = grant.calls
    assert call["output_tokens"] == 100 and call["input_tokens"] > 0 and "reserved upper bound" in call["error"]
    assert [f["class"] for f in grant.failures] == ["infra"]
