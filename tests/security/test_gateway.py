"""The model gateway on its own: streaming, refusals, and the key never echoed back --
against a small streaming OpenAI-compatible upstream served here."""

from __future__ import annotations

import asyncio
import json

import pytest

from milo_ray.execution.gateway.server import ModelGateway

KEY = "sk-gateway-test-key"


async def _upstream(port_box: list):
    from aiohttp import web

    async def chat(request):
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        if "fail" in json.dumps(body["messages"]):
            # A provider error that quotes the credentials it was given.
            return web.json_response({"error": {"message": f"bad credentials {auth}"}}, status=401)
        if not body.get("stream"):
            return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                                   "finish_reason": "stop"}],
                                      "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, word in enumerate(["one ", "two ", "three"]):
            chunk = {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}
        await resp.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port_box.append(site._server.sockets[0].getsockname()[1])
    return runner


async def _post(socket_path: str, token: str | None, body: dict) -> tuple[int, str]:
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as s:
        async with s.post("http://gateway/v1/chat/completions", headers=headers, json=body) as r:
            return r.status, await r.text()


@pytest.fixture
def outcome(tmp_path):
    async def go():
        port: list = []
        upstream = await _upstream(port)
        cfg = {"solver": "openai/m", "api_base": f"http://127.0.0.1:{port[0]}/v1", "max_retries": 0,
               "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 1.0}
        gw = ModelGateway(cfg, tmp_path / "gw.sock")
        gw.set_key(KEY)
        await gw.start()
        grant = gw.issue("t", call_cap=10)
        msgs = [{"role": "user", "content": "hello"}]
        out = {"stream": await _post(gw.socket_path, grant.token, {"messages": msgs, "stream": True}),
               "plain": await _post(gw.socket_path, grant.token, {"messages": msgs}),
               "bad": await _post(gw.socket_path, grant.token, {"messages": []}),
               "unknown": await _post(gw.socket_path, "not-a-token", {"messages": msgs}),
               "none": await _post(gw.socket_path, None, {"messages": msgs}),
               "fail": await _post(gw.socket_path, grant.token, {"messages": [{"role": "user", "content": "fail"}]})}
        out["calls"], out["upstream_error"] = list(grant.calls), grant.upstream_error
        await gw.close()
        await upstream.cleanup()
        return out

    return asyncio.run(go())


def test_a_streamed_call_is_relayed_chunk_by_chunk_and_metered(outcome):
    status, text = outcome["stream"]
    assert status == 200
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    words = "".join((json.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or "" for e in events[:-1])
    assert words == "one two three"
    assert (outcome["calls"][0]["input_tokens"], outcome["calls"][0]["output_tokens"]) == (9, 3)


def test_a_plain_call_is_metered_and_priced(outcome):
    assert outcome["plain"][0] == 200 and json.loads(outcome["plain"][1])["choices"][0]["message"]["content"] == "hi"
    call = outcome["calls"][1]
    assert (call["input_tokens"], call["output_tokens"], call["cost_usd"]) == (5, 1, pytest.approx(6e-6))


def test_bad_and_unauthorized_calls_are_refused_and_cost_nothing(outcome):
    assert outcome["bad"][0] == 400
    assert outcome["unknown"][0] == 401 and outcome["none"][0] == 401
    assert len(outcome["calls"]) == 3  # stream, plain, and the failed one: nothing for the refusals


def test_an_upstream_error_never_echoes_the_key(outcome):
    status, text = outcome["fail"]
    assert status == 401 and "bad credentials" in text
    assert KEY not in text and KEY not in (outcome["upstream_error"] or "") and outcome["upstream_error"]
    assert KEY not in json.dumps(outcome["calls"])
