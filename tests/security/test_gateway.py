"""The model gateway on its own: streaming, refusals, and the key never echoed back --
against a small streaming OpenAI-compatible upstream served here."""

from __future__ import annotations

import asyncio
import json

import pytest

from milo_ray.boundary.gateway.server import ModelGateway

KEY = "sk-gateway-test-key"


async def _upstream(port_box: list, seen: list):
    from aiohttp import web

    async def chat(request):
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        seen.append((body, auth))
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


async def _post(socket_path: str, token: str | None, body: dict,
                path: str = "/v1/chat/completions") -> tuple[int, str]:
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as s:
        async with s.post(f"http://gateway{path}", headers=headers, json=body) as r:
            return r.status, await r.text()


@pytest.fixture
def outcome(tmp_path):
    async def go():
        port: list = []
        seen: list = []
        upstream = await _upstream(port, seen)
        cfg = {"solver": "openai/m", "api_base": f"http://127.0.0.1:{port[0]}/v1", "max_retries": 0,
               "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 1.0, "max_output_tokens": 50}
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
        out["calls"], out["failures"] = list(grant.calls), list(grant.failures)
        # The Anthropic Messages route, on a grant of its own.
        grant = gw.issue("m", call_cap=10)
        seen.clear()
        path = "/anthropic/v1/messages"
        ask = {"model": "claude-opus-chosen-by-the-client", "max_tokens": 9999, "messages": msgs}
        out["messages"] = await _post(gw.socket_path, grant.token, ask, path)
        out["messages_seen"] = list(seen)
        out["messages_stream"] = await _post(gw.socket_path, grant.token, {**ask, "stream": True}, path)
        out["messages_fail"] = await _post(gw.socket_path, grant.token,
                                           {**ask, "messages": [{"role": "user", "content": "fail"}]}, path)
        out["messages_unknown"] = await _post(gw.socket_path, "not-a-token", ask, path)
        out["messages_calls"] = list(grant.calls)
        # The Responses route, on a grant of its own (tests/security/test_gateway_responses.py has the rest).
        grant = gw.issue("r", call_cap=10)
        seen.clear()
        out["responses"] = await _post(gw.socket_path, grant.token, {"input": "fail", "model": "x"},
                                       "/openai/v1/responses")
        out["responses_seen"], out["responses_calls"] = list(seen), list(grant.calls)
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
    # The provider refused the request as sent (401): the gateway classes it the request's.
    failed = [f for f in outcome["failures"] if f["class"] != "refused"]
    assert [(f["class"], f["status"]) for f in failed] == [("request", 401)]
    assert KEY not in text and KEY not in json.dumps(outcome["failures"]) and failed[0]["error"]
    assert KEY not in json.dumps(outcome["calls"])


def test_a_messages_call_goes_to_the_configured_model_clamped_with_the_key_and_is_metered(outcome):
    status, text = outcome["messages"]
    assert status == 200, text
    answer = json.loads(text)
    assert answer["type"] == "message" and answer["content"][0]["text"] == "hi"
    ((body, auth),) = outcome["messages_seen"]
    # The client chose neither the model nor more tokens than the config allows; the key
    # went upstream, never back.
    assert body["model"] == "m" and body["max_tokens"] == 50 and auth == f"Bearer {KEY}"
    assert KEY not in text
    plain, streamed, failed = outcome["messages_calls"]
    assert (plain["input_tokens"], plain["output_tokens"], plain["cost_usd"]) == (5, 1, pytest.approx(6e-6))
    assert (streamed["input_tokens"], streamed["output_tokens"]) == (5, 1)
    assert failed["error"] and KEY not in failed["error"]


def test_a_streamed_messages_call_is_delivered_as_messages_events(outcome):
    status, text = outcome["messages_stream"]
    assert status == 200
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    kinds = [e["type"] for e in events]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert events[2]["delta"] == {"type": "text_delta", "text": "hi"}
    assert events[-2]["usage"]["output_tokens"] == 1


def test_messages_refusals(outcome):
    assert outcome["messages_fail"][0] == 401 and KEY not in outcome["messages_fail"][1]
    assert outcome["messages_unknown"][0] == 401


def test_a_responses_call_goes_upstream_with_the_key_and_its_error_never_echoes_it(outcome):
    status, text = outcome["responses"]
    ((body, auth),) = outcome["responses_seen"]
    assert body["model"] == "m" and auth == f"Bearer {KEY}"
    assert status == 401 and "bad credentials" in text and KEY not in text
    (failed,) = outcome["responses_calls"]
    assert failed["error"] and KEY not in failed["error"]


def test_an_ended_grant_admits_no_call_whatever_socket_the_call_came_on():
    # The grant itself refuses after its rollout, independently of the sockets in front of
    # it (a kept-open connection, the shared socket): the last line of that defence.
    from milo_ray.boundary.gateway.ledger import Grant, Refusal

    grant = Grant("r", token_cap=1000, call_cap=5)
    assert not isinstance(grant.admit(10, 10), Refusal)
    grant.end()
    refused = grant.admit(10, 10)
    assert isinstance(refused, Refusal) and refused.reason == "ended" and refused.status == 401
