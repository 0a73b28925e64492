"""The model gateway of a search agent: a :class:`~.server.ModelGateway` started inside
the process that runs the agent (the mutation's Ray task), holding the key that task was
handed, so that the agent gets a per-call token and never the key.

Two kinds of agent use it:

* a sandboxed CLI mutator (:class:`milo_ray.agents.mutators.cli.CliMutator`), through its
  gateway protocol (:class:`milo_ray.agents.mutators.cli_sandbox.ModelGateway`):
  ``base_url(api)`` is an ``http+unix://`` URL of its socket; the CLI then gives its token a
  socket of its own (:meth:`MutationGateway.bind_token`), the one the CLI's relay forwards
  to, and the token is accepted there only (as a rollout's: see :mod:`.server`);
* the in-process LLM coding agent (the deepagents mutator, which is also MILO's graft agent
  and SSR's optimizer), whose chat model gets ``local_url(api)``, an ``http://`` URL on a
  loopback port of the same gateway (litellm speaks no Unix sockets), and the token as its
  key (:func:`milo_ray.llm.role_llm.metered_chat_model`).

For both, ``issue_token`` issues a grant for one agent call, ``revoke_token`` ends it, and
:meth:`metered` / :meth:`calls` are what the calls of a token cost -- the call's tokens,
USD, retries and per-call rows, whatever the agent reports about itself. Inside
:func:`~milo_ray.boundary.gateway.role_journal.journaling` the grant also journals each
model call (see :mod:`~milo_ray.boundary.gateway.role_journal`).

The gateway runs on an event loop of its own, in a daemon thread, started on first use
and kept for the process's later calls (``close`` stops it and removes its socket).
:meth:`MutationGateway.shared` gives one per model config and process, so that the
agents of every run a long-lived worker serves share one. The key is read when a token is
issued (:func:`milo_ray.llm.client.secret` of the model's key variable: the secrets the
task was handed, else this process's environment), so a gateway reused by several calls
of one worker uses each task's key.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

API_PATHS = {"openai": "/openai/v1", "anthropic": "/anthropic"}
START_TIMEOUT_S = 120.0


_SHARED: dict[str, "MutationGateway"] = {}
_SHARED_LOCK = threading.Lock()


class MutationGateway:
    """See the module docstring. ``llm``: the model every call is sent to, a search role's
    ``llm`` block (:class:`~milo_ray.llm.role_llm.RoleLLM`: ``model``, ``api_base``,
    ``api_key_env``, prices, retries, rate limits); the agent's own choice of model is
    ignored."""

    @classmethod
    def shared(cls, llm: Any) -> "MutationGateway":
        """This process's gateway for ``llm`` (one per distinct model config, never closed:
        it lives as long as the worker that serves the agents)."""
        gw = cls(llm)
        key = json.dumps(gw.cfg, sort_keys=True, default=str)
        with _SHARED_LOCK:
            return _SHARED.setdefault(key, gw)

    def __init__(self, llm: Mapping[str, Any]) -> None:
        from milo_ray.llm.role_llm import RoleLLM

        # The same fields, defaults and checks as every search role's ``llm`` block.
        cfg = RoleLLM.of(llm, where="gateway.llm").model_config()
        self.cfg = cfg
        self._gateway: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loopback = ""  # the loopback base URL (local_url), once started
        self._lock = threading.Lock()

    # A mutator is shipped to its task before it runs: the gateway starts there.
    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cfg = state["cfg"]
        self._gateway, self._loop, self._lock = None, None, threading.Lock()
        self._loopback = ""

    # --- the protocol ---------------------------------------------------------------------
    def base_url(self, api: str) -> str:
        if api not in API_PATHS:
            raise ValueError(f"MutationGateway: api={api!r}; expected one of {sorted(API_PATHS)}")
        gw = self._started()
        return f"http+unix://{quote(gw.socket_path, safe='')}{API_PATHS[api]}"

    def local_url(self, api: str = "openai") -> str:
        """The same gateway over ``http://`` on a loopback port, for a client in this
        process (the agent's tools run in a sandbox without network: they cannot reach it)."""
        if api not in API_PATHS:
            raise ValueError(f"MutationGateway: api={api!r}; expected one of {sorted(API_PATHS)}")
        self._started()
        return f"{self._loopback}{API_PATHS[api]}"

    def issue_token(self, *, role: str, caller: str) -> str:
        from milo_ray.llm.client import gateway_credentials, key_env, secret
        from milo_ray.boundary.gateway.role_journal import current_role_call

        gw = self._started()
        name = key_env(self.cfg)
        gw.set_key(gateway_credentials(self.cfg, secret(name) if name else None))
        # Read here, in the agent's context: the grant is made on the gateway's own loop.
        grant = self._call(self._issue(gw, f"{role}:{caller}", current_role_call.get()))
        return grant.token

    def bind_token(self, token: str) -> str:
        """Give ``token`` (issued by :meth:`issue_token`) a listening socket of its own, in a
        fresh directory of this gateway's private one, and return its path: from now on the
        token is refused anywhere else (this gateway's shared socket and loopback port
        included), and any other token is refused there. :meth:`revoke_token` closes it."""
        gw = self._started()
        grant = gw.grants.find(token)
        if grant is None:
            raise ValueError("MutationGateway.bind_token: a token this gateway did not issue")
        return self._call(gw.bind(grant))

    def revoke_token(self, token: str) -> None:
        gw = self._gateway
        grant = gw.grants.find(token) if gw is not None else None
        if grant is not None:
            # On the gateway's loop: ending a bound grant closes its listener, which only
            # that loop may touch.
            asyncio.run_coroutine_threadsafe(self._end(gw, grant), gw.loop).result(START_TIMEOUT_S)

    def metered(self, token: str) -> dict[str, Any] | None:
        """The calls made with ``token``: ``input_tokens``, ``output_tokens``, ``cost_usd``
        (None when any call is unpriced, or one is still in flight: its spend is not known
        yet), ``calls``, ``retries``, ``in_flight`` and the first ``error``; None for a
        token this gateway did not issue."""
        gw = self._gateway
        grant = gw.grants.find(token) if gw is not None else None
        if grant is None:
            return None
        calls, in_flight = list(grant.calls), int(grant.in_flight)
        costs = [c.get("cost_usd") for c in calls]
        return {"input_tokens": sum(int(c["input_tokens"]) for c in calls),
                "output_tokens": sum(int(c["output_tokens"]) for c in calls),
                "cost_usd": None if in_flight or any(c is None for c in costs) else float(sum(costs)),
                "calls": len(calls), "retries": sum(int(c.get("retries") or 0) for c in calls),
                "in_flight": in_flight, "error": next((c["error"] for c in calls if c.get("error")), None)}

    def calls(self, token: str) -> list[dict[str, Any]]:
        """The calls of ``token`` as the gateway recorded them (``SolverCall.as_dict()``
        rows: model, times, tokens, USD, retries, error), in the order they finished."""
        gw = self._gateway
        grant = gw.grants.find(token) if gw is not None else None
        return [] if grant is None else [dict(c) for c in grant.calls]

    def close(self) -> None:
        with self._lock:
            gw, loop = self._gateway, self._loop
            self._gateway = self._loop = None
        if gw is not None and loop is not None:
            asyncio.run_coroutine_threadsafe(gw.close(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            shutil.rmtree(Path(gw.socket_path).parent, ignore_errors=True)

    # --- running ----------------------------------------------------------------------------
    @staticmethod
    async def _end(gw: Any, grant: Any) -> None:
        gw.end(grant)

    @staticmethod
    async def _issue(gw: Any, label: str, journal: Any) -> Any:
        return gw.issue(label, journal=journal)  # binds the grant to the gateway's loop

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(START_TIMEOUT_S)

    def _started(self) -> Any:
        with self._lock:
            if self._gateway is not None:
                return self._gateway
            from milo_ray.boundary.gateway.server import ModelGateway

            # A private directory (0700): the socket is reached through the CLI's relay only.
            # The loopback port serves this process's own agent (see local_url).
            directory = tempfile.mkdtemp(prefix="milo-mutation-gw-")
            gw = ModelGateway(self.cfg, Path(directory) / "gateway.sock")
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mutation-gateway", daemon=True).start()
            asyncio.run_coroutine_threadsafe(gw.start(), loop).result(START_TIMEOUT_S)
            self._loopback = asyncio.run_coroutine_threadsafe(gw.listen_loopback(), loop).result(START_TIMEOUT_S)
            self._gateway, self._loop = gw, loop
            return gw
