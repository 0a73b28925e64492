"""Every way a forwarded call can end without its answer reaching the caller is charged:
what the provider billed when the gateway can still learn it (the caller hung up: the
call completes upstream anyway, whichever route and stream mode, even where the server
cancels the handlers of lost connections), else the call's reserved upper bound, said so
in its row (a timeout, an answer lost on the way, the gateway closed, the rollout ended)
-- and nothing only when the provider cannot have billed it (never sent, or answered with
an error status). Real clients (raw sockets that close mid-call) against the real gateway
and the scripted OpenAI-compatible server, whose own count of billed tokens is the truth."""

from __future__ import annotations

import asyncio
import json

import pytest

from milo_ray.boundary.gateway.ledger import Grant
from milo_ray.boundary.gateway.server import ModelGateway
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, error

ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 50}),
}


def _cfg(url: str, **extra) -> dict:
    return {"solver": "openai/m", "api_base": url, "max_retries": 0, "usd_per_mtok_input": 1.0,
            "usd_per_mtok_output": 1.0, **extra}


async def _gateway(url: str, tmp_path, *, cancel_handlers: bool = False, **cfg) -> ModelGateway:
    gw = ModelGateway(_cfg(url, **cfg), tmp_path / "gw.sock")
    gw.set_key("sk-upstream")
    await gw.start()
    # What aiohttp before 3.9 always did, and later ones do when told: cancel the handler
    # of a request whose connection was lost.
    gw._runner.server.handler_cancellation = cancel_handlers
    return gw


async def _open(socket_path: str, token: str, route: str, body: dict):
    """A raw HTTP client: sends one request and returns its connection, unread."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    data = json.dumps(body).encode()
    writer.write(f"POST {route} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    return reader, writer


async def _until(cond, timeout_s: float = 20.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)


def _billed(srv: ScriptedOpenAIServer) -> int:
    return sum(r.prompt_tokens + r.completion_tokens for r in srv.answered)


def _hang_up_mid_call(tmp_path, route: str, stream: bool, cancel_handlers: bool):
    async def go():
        with ScriptedOpenAIServer([Reply(content="x" * 40, prompt_tokens=123, completion_tokens=45,
                                         delay_s=0.8)]) as srv:
            gw = await _gateway(srv.url, tmp_path, cancel_handlers=cancel_handlers)
            grant = gw.issue("h/t")
            path, body = ROUTES[route]
            _, writer = await _open(gw.socket_path, grant.token, path, {**body, "stream": stream})
            await _until(lambda: srv.requests)  # the call is upstream: now the caller leaves
            writer.transport.abort()
            await _until(lambda: grant.calls)
            await gw.close()
            return grant, _billed(srv)

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_call_whose_caller_hangs_up_is_charged_what_the_provider_billed(tmp_path, route, stream):
    grant, billed = _hang_up_mid_call(tmp_path, route, stream, cancel_handlers=True)
    (call,) = grant.calls
    assert billed == 168 and grant.tokens() == billed and call["error"] is None
    assert grant.in_flight == 0 and grant.reserved == 0


def test_a_plain_call_whose_caller_hangs_up_is_charged_what_the_provider_billed_by_default(tmp_path):
    grant, billed = _hang_up_mid_call(tmp_path, "chat", False, cancel_handlers=False)
    assert billed == 168 and grant.tokens() == billed


def test_callers_hanging_up_in_parallel_never_pass_the_token_cap_and_pay_what_was_billed(tmp_path):
    cap = 2500

    def provider(body: dict) -> Reply:
        return Reply(content="x", prompt_tokens=20, completion_tokens=int(body.get("max_tokens") or 10_000),
                     delay_s=0.5)

    async def go():
        with ScriptedOpenAIServer(provider) as srv:
            gw = await _gateway(srv.url, tmp_path, cancel_handlers=True)
            grant = gw.issue("h/t", token_cap=cap)
            conns = [await _open(gw.socket_path, grant.token, "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": f"call {i}"}], "max_tokens": 400,
                                  "stream": i % 2 == 1})
                     for i in range(10)]
            await _until(lambda: grant.stop_reason is not None and len(srv.requests) == grant.in_flight)
            for _, writer in conns:
                writer.transport.abort()
            await _until(lambda: grant.in_flight == 0 and grant.calls)
            await gw.close()
            return grant, _billed(srv), len(srv.requests)

    grant, billed, forwarded = asyncio.run(go())
    assert forwarded >= 4 and len(grant.calls) == forwarded
    assert grant.tokens() == billed <= cap and grant.stop_reason == "token_cap"


@pytest.mark.parametrize("fault", ["drop_mid_body", "truncated_json", "empty_body"])
def test_a_call_whose_answer_is_lost_on_the_way_is_charged_its_reservation(tmp_path, fault):
    """The provider answered (and billed) but the answer never reached the gateway whole."""
    async def go():
        with ScriptedOpenAIServer([Reply(content="lost", prompt_tokens=30, completion_tokens=20, fault=fault)]) as srv:
            gw = await _gateway(srv.url, tmp_path, max_output_tokens=100)
            grant = gw.issue("h/t")
            reader, writer = await _open(gw.socket_path, grant.token, *ROUTES["chat"])
            status = int((await reader.readline()).split()[1])
            writer.close()
            await gw.close()
            return grant, status

    grant, status = asyncio.run(go())
    (call,) = grant.calls
    assert status >= 500 and call["output_tokens"] == 50 and call["input_tokens"] > 0
    assert "reserved upper bound" in call["error"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_call_that_times_out_is_charged_its_reservation(tmp_path, stream):
    async def go():
        with ScriptedOpenAIServer([Reply(content="late", prompt_tokens=30, completion_tokens=20,
                                         delay_s=1.5)]) as srv:
            gw = await _gateway(srv.url, tmp_path, request_timeout_s=0.3)
            grant = gw.issue("h/t")
            path, body = ROUTES["chat"]
            reader, writer = await _open(gw.socket_path, grant.token, path, {**body, "stream": stream})
            status = int((await reader.readline()).split()[1])
            writer.close()
            await gw.close()
            return grant, status

    grant, status = asyncio.run(go())
    (call,) = grant.calls
    assert status >= 400 and call["output_tokens"] == 50 and "reserved upper bound" in call["error"]
    assert [f["class"] for f in grant.failures] == ["infra"]


@pytest.mark.parametrize("how", ["error_status", "never_sent"])
def test_a_call_the_provider_cannot_have_billed_is_charged_nothing(tmp_path, how):
    async def go():
        with ScriptedOpenAIServer([error(500)]) as srv:
            url = srv.url if how == "error_status" else "http://127.0.0.1:9/v1"  # the discard port: refused
            gw = await _gateway(url, tmp_path)
            grant = gw.issue("h/t")
            reader, writer = await _open(gw.socket_path, grant.token, *ROUTES["chat"])
            status = int((await reader.readline()).split()[1])
            writer.close()
            await gw.close()
            return grant, status

    grant, status = asyncio.run(go())
    (call,) = grant.calls
    assert status >= 500 and grant.tokens() == 0 and "reserved" not in call["error"]
    assert grant.in_flight == 0 and grant.reserved == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_call_in_flight_when_the_gateway_closes_is_charged_its_reservation(tmp_path, stream):
    async def go():
        with ScriptedOpenAIServer([Reply(content="late", prompt_tokens=30, completion_tokens=20,
                                         delay_s=1.5)]) as srv:
            gw = await _gateway(srv.url, tmp_path)
            grant = gw.issue("h/t")
            path, body = ROUTES["chat"]
            _, writer = await _open(gw.socket_path, grant.token, path, {**body, "stream": stream})
            await _until(lambda: srv.requests)
            await gw.close()
            writer.close()
            return grant

    grant = asyncio.run(go())
    (call,) = grant.calls
    assert call["output_tokens"] == 50 and call["input_tokens"] > 0
    assert "closed while the call was in flight" in call["error"] and "reserved upper bound" in call["error"]
    assert grant.in_flight == 0 and grant.reserved == 0


def test_a_plain_call_in_flight_when_its_rollout_ends_is_charged_its_reservation_once(tmp_path):
    async def go():
        with ScriptedOpenAIServer([Reply(content="late", prompt_tokens=30, completion_tokens=20,
                                         delay_s=1.0)]) as srv:
            gw = await _gateway(srv.url, tmp_path)
            grant = gw.issue("h/t")
            reader, writer = await _open(gw.socket_path, grant.token, *ROUTES["chat"])
            await _until(lambda: srv.requests)
            gw.end(grant)
            settled = await gw.settle(grant, wait_s=0.05)
            first = list(grant.calls)
            await reader.readline()  # the answer comes, late: it adds nothing
            writer.close()
            await gw.close()
            return settled, first, grant

    settled, first, grant = asyncio.run(go())
    assert settled == 1 and grant.calls == first
    assert first[0]["output_tokens"] >= 50 and "still in flight" in first[0]["error"]


def test_a_call_stopped_before_it_went_upstream_is_released_not_charged():
    grant = Grant("h/t", token_cap=1000)
    admission = grant.admit(100, 200)
    grant.release(admission)
    assert grant.in_flight == 0 and grant.reserved == 0 and grant.tokens() == 0 and not grant.calls
    assert grant.settle_open(lambda reserved, started: {}) == 0
