"""The model gateway: an OpenAI-compatible ``/v1/chat/completions`` endpoint (and an
Anthropic ``/v1/messages`` one, :mod:`.messages`, and an OpenAI Responses ``/v1/responses``
one, :mod:`.responses`) on a Unix socket, run by the rollout worker on its own event loop, holding the provider key.

Sandboxed harnesses reach it through the socket bound into their sandbox (relayed to a
loopback port inside, :mod:`milo_ray.execution.harness_process_backend`), with the bearer
token of their rollout's :class:`~milo_ray.execution.gateway.ledger.Grant`. For each call
the gateway checks the token (unknown or ended: 401), the grant's caps and the run's
budget (:mod:`.run_budget`; 429), forwards
the request through :mod:`.upstream` (streamed or not), and records what the call cost on
the grant. The key never leaves this process: it is handed to the gateway as an argument
(:meth:`ModelGateway.set_key`), never read from or written to an environment variable,
and an upstream error text is scrubbed of it before it reaches the caller.

Why a small app over litellm rather than LiteLLM's own proxy: the proxy's virtual keys
(``/key/generate``) with budgets and spend tracking need its Postgres database, and its
per-key accounting is read back over HTTP; here a grant is an object in the executor's
own process, so the rollout's tokens, USD and caps are read and enforced without a
database or a second process, and the retries, rate limits and prices are the ones the
rest of the framework uses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from milo_ray.execution.gateway import messages, responses, upstream
from milo_ray.execution.gateway.ledger import Grant, GrantBook, Refusal

log = logging.getLogger(__name__)

# Request bodies larger than this are refused (a conversation of a long rollout is a few MB).
MAX_REQUEST_BYTES = 32 * 1024 * 1024


class ModelGateway:
    """See the module docstring. ``cfg``: the model config; ``socket_path``: where to
    listen (its directory should be private to this process's user)."""

    def __init__(self, cfg: Any, socket_path: str | Path) -> None:
        self.cfg = cfg
        self.socket_path = str(socket_path)
        self.grants = GrantBook()
        self._key: str | None = None
        self._limiter: Any = "unset"
        self._runner: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def set_key(self, key: str | None) -> None:
        self._key = key or None

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        from aiohttp import web

        # litellm takes seconds to import: never on the event loop the rollouts share.
        await asyncio.to_thread(_import_litellm)
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        # OpenAI clients are given ``.../v1`` or ``.../openai/v1`` as their base URL,
        # Anthropic clients ``.../anthropic`` (they append ``/v1/messages``).
        for prefix in ("", "/openai"):
            app.router.add_post(f"{prefix}/v1/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/v1/responses", self._responses)
            app.router.add_get(f"{prefix}/v1/models", self._models)
        app.router.add_post("/chat/completions", self._chat)
        for prefix in ("", "/anthropic"):
            app.router.add_post(f"{prefix}/v1/messages", self._messages)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        Path(self.socket_path).parent.mkdir(parents=True, exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        await web.UnixSite(self._runner, self.socket_path).start()
        # The sandboxed side runs as another user; the token, not the socket's mode, is
        # the authorization (the directory stays private on the host).
        os.chmod(self.socket_path, 0o666)
        self.loop = asyncio.get_running_loop()

    async def listen_loopback(self) -> str:
        """Also serve on a loopback TCP port (after :meth:`start`), for a client in this
        process that speaks only HTTP over TCP (litellm); returns its ``http://`` base.
        Like the socket, it is open to any local process; the token is the authorization."""
        import socket

        from aiohttp import web

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        return "http://127.0.0.1:%d" % sock.getsockname()[1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def issue(self, label: str, *, token_cap: int | None = None, call_cap: int | None = None,
              run_budget: Any = None, journal: Any = None) -> Grant:
        grant = self.grants.issue(label, token_cap=token_cap, call_cap=call_cap, run_budget=run_budget,
                                  journal=journal)
        grant.bind_loop()
        self.grants.forget_ended()
        return grant

    def end(self, grant: Grant) -> None:
        self.grants.end(grant)

    # --- requests -------------------------------------------------------------------------
    def _limiter_for(self) -> Any:
        if self._limiter == "unset":
            from milo_ray.agents.rate_limit import rate_limiter_for

            self._limiter = rate_limiter_for(self.cfg)
        return self._limiter

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "[key]") if self._key else text

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        if self._grant(request) is None:
            return _error(web, Refusal(401, "unknown_token", "unknown gateway token"))
        return web.json_response({"object": "list", "data": [{"id": str(self.cfg.solver), "object": "model"}]})

    def _grant(self, request: Any) -> Grant | None:
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("api-key")
        return self.grants.find(token)

    async def _responses(self, request: Any) -> Any:
        return await self._serve(request, responses)

    async def _chat(self, request: Any) -> Any:
        return await self._serve(request, upstream)

    async def _messages(self, request: Any) -> Any:
        return await self._serve(request, messages)

    async def _serve(self, request: Any, api: Any) -> Any:
        """One call of ``api`` (:mod:`.upstream` for chat completions, :mod:`.messages`
        for Anthropic messages): token, caps, validation, forwarding, metering."""
        from aiohttp import web

        grant = self._grant(request)
        if grant is None:
            return _error(web, Refusal(401, "unknown_token", "unknown gateway token"))
        refusal = grant.admit()
        if refusal is not None:
            return _error(web, refusal)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise upstream.BadRequest("the body must be a JSON object")
            api.request_kwargs(self.cfg, None, body)  # validate before anything is spent
        except (ValueError, upstream.BadRequest) as exc:
            grant.release()
            return _error(web, Refusal(400, "bad_request", f"bad request: {exc}"))
        if grant.run_budget is not None:
            # The run's counter, shared by every worker's gateway: asked before each call,
            # charged after it (Grant.record), so a spent budget stops paying at once.
            spent = await grant.run_budget.admit()
            if spent is not None:
                return _error(web, grant.refuse_for_run_budget(spent))
        started, mono = time.time(), time.monotonic()
        began = grant.forwarding(started)
        if body.get("stream"):
            return await self._stream(request, grant, body, api, started, mono, began)
        try:
            answer = await api.complete(self.cfg, self._key, body, self._limiter_for())
        except Exception as exc:
            return self._failed(web, grant, exc, started, mono, began)
        grant.record(upstream.call_row(self.cfg, started_at=started, started_mono=mono,
                                       input_tokens=answer.input_tokens, output_tokens=answer.output_tokens,
                                       retries=answer.retries, error=None), began=began)
        return web.json_response(answer.body)

    def _failed(self, web: Any, grant: Grant, exc: BaseException, started: float, mono: float,
                began: int | None) -> Any:
        text = self._scrub(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")[:500]
        grant.record(upstream.call_row(self.cfg, started_at=started, started_mono=mono, input_tokens=0,
                                       output_tokens=0, retries=int(getattr(exc, "_gateway_retries", 0)),
                                       error=text), upstream_error=text, began=began)
        status = getattr(exc, "status_code", None)
        status = status if isinstance(status, int) and 400 <= status < 600 else 502
        return _error(web, Refusal(status, "upstream", f"model endpoint: {text}"))

    async def _stream(self, request: Any, grant: Grant, body: dict[str, Any], api: Any, started: float,
                      mono: float, began: int | None) -> Any:
        from aiohttp import web

        usage: dict[str, int] = {}
        chunks = api.stream(self.cfg, self._key, body, self._limiter_for(), usage)
        # Chat-completion chunks come as dicts (sent as SSE here, ended by [DONE]); the
        # Messages stream comes as the provider's own SSE bytes, passed through as is.
        framed = api is upstream
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = None
        except Exception as exc:
            return self._failed(web, grant, exc, started, mono, began)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        error = None
        try:
            if first is not None:
                await response.write(_sse(first) if framed else first)
                async for chunk in chunks:
                    await response.write(_sse(chunk) if framed else chunk)
            if framed:
                await response.write(b"data: [DONE]\n\n")
        except Exception as exc:  # the provider or the caller dropped the stream midway
            error = self._scrub(f"{type(exc).__name__}: {exc}")[:500]
        grant.record(upstream.call_row(self.cfg, started_at=started, started_mono=mono,
                                       input_tokens=usage.get("input_tokens", 0),
                                       output_tokens=usage.get("output_tokens", 0),
                                       retries=usage.get("retries", 0), error=error), began=began)
        try:
            await response.write_eof()
        except Exception:
            pass
        return response


def _import_litellm() -> None:
    import litellm

    # litellm prints a feedback banner on every failed request; the error is recorded.
    litellm.suppress_debug_info = True
    # Anthropic-messages calls to an OpenAI-style provider go out as chat completions, the
    # API every other call of the gateway uses (and the one every OpenAI-compatible server
    # serves), not as Responses-API calls.
    litellm.use_chat_completions_url_for_anthropic_messages = True


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, default=str).encode() + b"\n\n"


def _error(web: Any, refusal: Refusal) -> Any:
    return web.json_response({"error": {"message": refusal.message, "type": "milo_gateway", "code": refusal.reason}},
                             status=refusal.status)
