"""The model gateway: an OpenAI-compatible ``/v1/chat/completions`` endpoint (and an
Anthropic ``/v1/messages`` one, :mod:`.messages`, and an OpenAI Responses ``/v1/responses``
one, :mod:`.responses`) on a Unix socket, run by the rollout worker on its own event loop, holding the provider key.

Sandboxed harnesses reach it through their grant's own socket (relayed to a loopback port
inside, :mod:`milo_ray.boundary.inside.backend`), with the bearer token of their
rollout's :class:`~milo_ray.boundary.gateway.ledger.Grant`. For each call the gateway
checks where the call came in and the token (see "One socket per grant" below; unknown or
ended: 401), the request (malformed, or carrying a
tool the provider would run: 400, before anything goes upstream), the grant's caps with
the call's reserved upper bound and the run's budget (:mod:`.run_budget`; 429), forwards
the request through :mod:`.upstream` (streamed or not), and records on the grant what the
call cost and, when it failed, its class as the gateway sees it. Metering does not depend
on the caller: each call runs in a task of the gateway's own (:meth:`ModelGateway._owned`),
so a call whose caller hangs up completes upstream and is charged the provider's usage (a
stream is read on to it, for at most :data:`STREAM_DRAIN_S`), and a call whose usage never
arrives -- the stream cut before it, the request timed out, the answer was lost on the way,
the gateway closed or the rollout ended first (:meth:`ModelGateway.settle`) -- is charged
its reservation, never nothing; a failed call is charged nothing only when the provider
cannot have billed it (:func:`.upstream.may_be_billed`). The key never leaves this process: it is handed to the gateway as an argument
(:meth:`ModelGateway.set_key`), never read from or written to an environment variable,
and an upstream error text is scrubbed of it before it reaches the caller.

One socket per grant. A bearer token alone is worth what its secrecy is: a harness that
learnt another live rollout's token could spend it. So a grant made for a sandbox
(:meth:`ModelGateway.issue_bound`, :meth:`ModelGateway.bind`) gets a listening socket of
its own, and the sandbox is shown only that socket: a request arriving on it is served
only with the token of the grant it was made for; any other token (unknown, ended, or
another grant's) is refused 403 and noted as a refused request on *this* socket's grant --
the grant whose token was presented is charged nothing. A bound grant's token is refused
403 on every other listener too (the gateway's shared socket and loopback port, which serve
grants issued without a socket: the in-process search agents'). Which listener accepted a connection is the
kernel's answer (the accepted socket's own address), not anything the client sends. The
socket is closed and unlinked when the grant ends (:meth:`ModelGateway.end`), so an ended
token has nowhere left to go. A listener costs one ``bind``/``listen`` per rollout and a
dict look-up per call.

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
import secrets
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milo_ray.boundary.gateway import messages, responses, upstream
from milo_ray.boundary.gateway.ledger import GRANT_SOCKET, Admission, Grant, GrantBook, Refusal

log = logging.getLogger(__name__)

# Request bodies larger than this are refused (a conversation of a long rollout is a few MB).
MAX_REQUEST_BYTES = 32 * 1024 * 1024
# How long a stream whose caller left is read on for the provider's usage (its last chunk).
STREAM_DRAIN_S = 60.0
# How long a rollout's end waits for its calls in flight to be recorded before it charges
# each its reservation.
SETTLE_WAIT_S = 10.0
# The error of a call the gateway stopped (it was closed) before the provider's answer came.
CANCELLED = "the gateway closed while the call was in flight"


@dataclass(frozen=True)
class _Forwarded:
    """A call on its way upstream: when it started, its journal number, its admission
    (the reservation) and the request's size (the bound of its prompt's tokens)."""

    started: float
    mono: float
    began: int | None
    admission: Admission
    size: int


class ModelGateway:
    """See the module docstring. ``cfg``: the model config; ``socket_path``: where to
    listen (its directory should be private to this process's user)."""

    def __init__(self, cfg: Any, socket_path: str | Path) -> None:
        self.cfg = cfg
        self.socket_path = str(socket_path)
        self.grants = GrantBook()
        self._key: str | Mapping[str, str] | None = None
        self._limiter: Any = "unset"
        # Whether the provider has answered this gateway's key: until it has, a 401/403 may
        # be the key's fault (the host's), not the request's.
        self._key_works = False
        self._runner: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        # Bound grants by their listener's address (what the kernel reports as the local
        # address of every connection that listener accepted; unique, see _listen_in), and
        # each one's listener by the socket's path.
        self._bound: dict[str, Grant] = {}
        self._listeners: dict[str, tuple[Any, str, bool]] = {}  # path -> (server, address, the directory is ours)
        # Each call's work, in a task of the gateway's own (_owned), not the request handler's.
        self._calls: set[asyncio.Task[Any]] = set()

    def set_key(self, key: str | Mapping[str, str] | None) -> None:
        """The provider key, or the litellm credential arguments of a ``bedrock/`` model
        (llm/client.py:gateway_credentials), passed on every call."""
        if (key or None) != self._key:
            self._key_works = False  # a new key has not been answered yet
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
        """Stop serving. A call still in flight is cancelled and charged its reservation
        (its row says so; a call its rollout's :meth:`settle` charged already is not charged
        again)."""
        for grant in list(self._bound.values()):
            self._unbind(grant)
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        if calls:
            await asyncio.gather(*calls, return_exceptions=True)
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

    async def issue_bound(self, label: str, socket_dir: str | Path | None = None, *, token_cap: int | None = None,
                          call_cap: int | None = None, run_budget: Any = None, journal: Any = None) -> Grant:
        """A grant with a listening socket of its own (:meth:`bind`)."""
        grant = self.issue(label, token_cap=token_cap, call_cap=call_cap, run_budget=run_budget, journal=journal)
        try:
            await self.bind(grant, socket_dir)
        except BaseException:
            self.grants.end(grant)
            raise
        return grant

    async def bind(self, grant: Grant, socket_dir: str | Path | None = None) -> str:
        """Give ``grant`` a listening socket of its own (see "One socket per grant" in the
        module docstring) and return its path: ``socket_dir/``:data:`GRANT_SOCKET` --
        ``socket_dir`` a directory the host made for one sandbox, outside any tree a sandbox
        can write (None: a fresh one inside this gateway's private directory, removed when
        the grant ends). From now on the grant's token is accepted there only;
        :attr:`~Grant.socket_path` says where, and :meth:`end` closes and removes it."""
        if self._runner is None or self._runner.server is None:
            raise RuntimeError("ModelGateway.bind: start() the gateway first")
        if grant.socket_path is not None or grant.ended:
            raise RuntimeError(f"ModelGateway.bind: grant {grant.label!r} is already bound or has ended")
        own_dir = socket_dir is None
        if own_dir:
            where = Path(self.socket_path).parent / f"grant-{secrets.token_hex(8)}"
            where.mkdir(mode=0o711)  # traverse-only: the caller connects to the socket it was told
        else:
            where = Path(socket_dir)
        path = str(where / GRANT_SOCKET)
        try:
            if os.path.lexists(path):
                raise RuntimeError(f"ModelGateway.bind: {path} is already a grant's socket")
            sock, address = _listen_in(where)
            try:
                server = await asyncio.get_running_loop().create_unix_server(self._runner.server, sock=sock)
            except BaseException:
                sock.close()
                raise
        except BaseException:
            if own_dir:
                shutil.rmtree(where, ignore_errors=True)
            raise
        grant.socket_path = path
        self._bound[address] = grant
        self._listeners[path] = (server, address, own_dir)
        return path

    def end(self, grant: Grant) -> None:
        """End ``grant``: its token is refused from now on, and its own socket (if it has
        one) stops listening and is removed."""
        self.grants.end(grant)
        self._unbind(grant)

    def _unbind(self, grant: Grant) -> None:
        path = grant.socket_path
        if path is None or path not in self._listeners:
            return
        server, address, own_dir = self._listeners.pop(path)
        del self._bound[address]
        # Stops accepting; a connection already accepted keeps its address, which no
        # grant holds any more: whatever it sends next is refused (_grant).
        server.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if own_dir:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)

    async def settle(self, grant: Grant, wait_s: float = SETTLE_WAIT_S) -> int:
        """After its rollout ended: wait up to ``wait_s`` for ``grant``'s calls in flight
        to be recorded, then charge each still open its reservation (the harness must not
        escape a call's cost by ending first). Returns how many were charged so."""
        deadline = time.monotonic() + wait_s
        while grant.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        note = "still in flight when the rollout ended: charged its reserved upper bound"
        return grant.settle_open(lambda reserved, started: upstream.call_row(
            self.cfg, started_at=started or time.time(), started_mono=time.monotonic(), input_tokens=0,
            output_tokens=reserved, retries=0, error=note))

    # --- requests -------------------------------------------------------------------------
    def _limiter_for(self) -> Any:
        if self._limiter == "unset":
            from milo_ray.llm.rate_limit import rate_limiter_for

            self._limiter = rate_limiter_for(self.cfg)
        return self._limiter

    def _bound_usd(self, admission: Admission, size: int) -> float | None:
        """The USD bound of an admitted call: its reserved tokens at the model's prices, the
        prompt's part (at most the request's size) at the input price (None: unpriced)."""
        from milo_ray.llm.client import price

        prompt = min(int(size), admission.reserved)
        return price(self.cfg, prompt, admission.reserved - prompt)

    def _scrub(self, text: str) -> str:
        secrets = [v for k, v in self._key.items() if k != "aws_region_name"] if isinstance(self._key, Mapping) \
            else [self._key] if self._key else []
        for value in secrets:
            text = text.replace(value, "[key]") if value else text
        return text

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        grant = self._grant(request)
        if isinstance(grant, Refusal):
            return _error(web, grant)
        return web.json_response({"object": "list", "data": [{"id": str(self.cfg.solver), "object": "model"}]})

    def _grant(self, request: Any) -> Grant | Refusal:
        """The grant ``request`` is served under, or why none: on a bound grant's socket
        only that grant's token (any other is refused there and noted on that grant); on
        the shared listeners only a grant issued without a socket."""
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("api-key")
        grant = self.grants.find(token)
        transport = request.transport
        where = transport.get_extra_info("sockname") if transport is not None else None
        if isinstance(where, str) and where in self._bound:
            own = self._bound[where]
            if grant is not own:
                return own.refused(Refusal(403, "wrong_socket", "this socket accepts only its own rollout's gateway "
                                                                "token"))
            return grant
        if isinstance(where, str) and where != self.socket_path:
            # A connection a grant's listener accepted before its grant ended: nothing is
            # served on it any more (only the shared listeners serve unbound grants).
            return Refusal(401, "ended", "this socket's rollout has ended")
        if grant is not None and grant.socket_path is not None:
            # Never charged to, nor noted on, the grant whose token this is: it may be a thief's use.
            if grant.ended:
                return Refusal(401, "ended", "this rollout has ended; its gateway token is no longer valid")
            return Refusal(403, "wrong_socket", "this gateway token is accepted only on its rollout's own socket")
        if grant is None:
            return Refusal(401, "unknown_token", "unknown gateway token")
        return grant

    async def _responses(self, request: Any) -> Any:
        return await self._owned(self._serve(request, responses))

    async def _chat(self, request: Any) -> Any:
        return await self._owned(self._serve(request, upstream))

    async def _messages(self, request: Any) -> Any:
        return await self._owned(self._serve(request, messages))

    async def _owned(self, work: Any) -> Any:
        """Run one call's ``work`` in a task of the gateway's own and wait for it, shielded:
        if the request handler is cancelled -- its caller hung up and the server cancels
        handlers of lost connections (aiohttp before 3.9 always did; later ones can be told
        to) -- the call still completes upstream and is charged what the provider billed.
        Only :meth:`close` cancels the task itself (and the call is then charged its
        reservation)."""
        task = asyncio.ensure_future(work)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return await asyncio.shield(task)

    async def _serve(self, request: Any, api: Any) -> Any:
        """One call of ``api`` (:mod:`.upstream` for chat completions, :mod:`.messages`
        for Anthropic messages, :mod:`.responses`): token, validation, caps, forwarding,
        metering."""
        from aiohttp import web

        grant = self._grant(request)
        if isinstance(grant, Refusal):
            return _error(web, grant)
        try:
            raw = await request.read()
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise upstream.BadRequest("the body must be a JSON object")
            # Validated (and provider-run tools refused) before anything is spent.
            kwargs = api.request_kwargs(self.cfg, None, body)
        except (ValueError, TypeError, upstream.BadRequest) as exc:  # a field of the wrong type: TypeError
            return _error(web, grant.refused(Refusal(400, "bad_request", f"bad request: {exc}")))
        admission = grant.admit(len(raw), upstream.output_bound(kwargs))
        if isinstance(admission, Refusal):
            return _error(web, admission)
        if admission.output_cap is not None:  # what the token cap has left bounds the answer
            body.pop("max_completion_tokens", None)
            body[api.OUTPUT_FIELD] = admission.output_cap
        if grant.run_budget is not None:
            # The run's counter, shared by every worker's gateway: asked before each call,
            # charged after it (Grant.record), so a spent budget stops paying at once.
            try:
                # Reserved there at the call's upper bound (its grant's reservation, priced),
                # settled when it is recorded.
                spent = await grant.run_budget.admit(admission.ticket, admission.reserved,
                                                     self._bound_usd(admission, len(raw)))
            except BaseException:  # nothing went upstream: the reservation is released, not charged
                grant.release(admission)
                raise
            if spent is not None:
                return _error(web, grant.refuse_for_run_budget(spent, admission))
        started = time.time()
        call = _Forwarded(started, time.monotonic(), grant.forwarding(started, admission), admission, len(raw))
        if body.get("stream"):
            return await self._stream(request, grant, body, api, call)
        try:
            answer = await api.complete(self.cfg, self._key, body, self._limiter_for())
        except asyncio.CancelledError:
            self._record(grant, call, 0, 0, 0, CANCELLED, reported=False)
            raise
        except Exception as exc:
            return self._failed(web, grant, exc, call)
        self._key_works = True
        self._record(grant, call, answer.input_tokens, answer.output_tokens, answer.retries, None)
        if answer.raw is not None:
            return web.Response(body=answer.raw, content_type="application/json")
        return web.json_response(answer.body)

    def _record(self, grant: Grant, call: _Forwarded, tin: int, tout: int, retries: int, error: str | None, *,
                reported: bool = True, failure: str | None = None, status: int | None = None) -> None:
        """Record ``call`` on ``grant``: the provider's usage, or -- ``reported`` false: it
        never arrived -- the call's reservation, said so in its error."""
        if not reported:
            reserved = call.admission.reserved
            tin = min(call.size, reserved)
            tout = reserved - tin
            note = f"the provider's usage never arrived: charged the call's reserved upper bound ({reserved} tokens)"
            error = f"{error}; {note}" if error else note
        grant.record(upstream.call_row(self.cfg, started_at=call.started, started_mono=call.mono, input_tokens=tin,
                                       output_tokens=tout, retries=retries, error=error),
                     admission=call.admission, failure=failure, status=status, began=call.began)

    def _failed(self, web: Any, grant: Grant, exc: BaseException, call: _Forwarded) -> Any:
        text = self._scrub(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")[:500]
        failure, status = upstream.failure_class(exc)
        if status in (401, 403) and not self._key_works:
            failure = "infra"  # nothing has shown the key works: the host's, not the harness's
        # A request never sent, or answered with an error status, was billed nothing; one
        # that timed out, or whose answer was lost on the way, may have been answered, and
        # billed, all the same: it is charged its reservation (upstream.may_be_billed).
        self._record(grant, call, 0, 0, int(getattr(exc, "_gateway_retries", 0)), text,
                     reported=not upstream.may_be_billed(exc), failure=failure, status=status)
        code = status if status is not None and 400 <= status < 600 else 502
        return _error(web, Refusal(code, "upstream", f"model endpoint: {text}"))

    async def _stream(self, request: Any, grant: Grant, body: dict[str, Any], api: Any, call: _Forwarded) -> Any:
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
        except asyncio.CancelledError:
            self._record(grant, call, 0, 0, 0, CANCELLED, reported=False)
            raise
        except Exception as exc:
            return self._failed(web, grant, exc, call)
        self._key_works = True
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        error = failure = status = None
        gone, deadline = False, 0.0
        try:
            try:
                await response.prepare(request)
            except Exception:
                gone, deadline = True, time.monotonic() + STREAM_DRAIN_S
            item = first
            while item is not None:
                if not gone:
                    try:
                        await response.write(_sse(item) if framed else item)
                    except Exception:  # the caller left: the provider's answer, and its usage, go on
                        gone, deadline = True, time.monotonic() + STREAM_DRAIN_S
                try:
                    item = await (asyncio.wait_for(chunks.__anext__(), max(0.0, deadline - time.monotonic()))
                                  if gone else chunks.__anext__())
                except StopAsyncIteration:
                    item = None
                except Exception as exc:
                    if gone and isinstance(exc, TimeoutError) and time.monotonic() >= deadline:
                        error = f"the caller left and the provider's answer did not end within {STREAM_DRAIN_S:g} s"
                    else:  # the provider dropped the stream midway
                        error = self._scrub(f"{type(exc).__name__}: {exc}")[:500]
                        failure, status = upstream.failure_class(exc)
                    break
            if framed and not gone and error is None:
                await response.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            error = error or CANCELLED
            raise
        except Exception:
            pass  # the caller left at the very end: the answer was whole
        finally:
            await chunks.aclose()  # its usage is final once the stream is closed
            self._record(grant, call, usage.get("input_tokens", 0), usage.get("output_tokens", 0),
                         usage.get("retries", 0), error, reported=bool(usage.get("reported")), failure=failure,
                         status=status)
        try:
            await response.write_eof()
        except Exception:
            pass
        return response


def _listen_in(directory: Path) -> tuple[socket.socket, str]:
    """A listening Unix socket at ``directory/``:data:`GRANT_SOCKET`, and the address the
    kernel gives each connection it accepts. It is bound under a random name through the
    directory's descriptor, then renamed: the address is then unique for the gateway's
    life (a path reused by a later grant, or a descriptor number reused, never names an
    older listener's connections), and short whatever the directory's path (a socket
    address holds 107 bytes)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        name = f".{secrets.token_hex(16)}.sock"
        sock.bind(f"/proc/self/fd/{fd}/{name}")
        os.rename(name, GRANT_SOCKET, src_dir_fd=fd, dst_dir_fd=fd)
        # The sandbox's user may be another uid; the socket admits only its grant's token.
        os.chmod(GRANT_SOCKET, 0o666, dir_fd=fd)
        sock.listen(128)
        sock.setblocking(False)
        return sock, sock.getsockname()
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(fd)


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
