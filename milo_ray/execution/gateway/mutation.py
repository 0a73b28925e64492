"""The model gateway of a CLI mutation: a :class:`~.server.ModelGateway` started inside
the process that runs the CLI (the mutation's Ray task), holding the key that task was
handed, so that the sandboxed CLI gets a per-call token and never the key.

It implements the CLI mutators' gateway protocol
(:class:`milo_ray.agents.mutators.cli_sandbox.ModelGateway`): ``base_url(api)`` is an
``http+unix://`` URL of its socket (the CLI's relay forwards to it), ``issue_token``
issues a grant for one agent call, ``revoke_token`` ends it, and :meth:`metered` is what
the calls of a token cost -- the mutation's tokens and USD, whatever the CLI reports.

The gateway runs on an event loop of its own, in a daemon thread, started on first use
and kept for the process's later mutations (``close`` stops it and removes its socket).
The key is read when a token is issued (:func:`milo_ray.agents.llm.secret` of the model's
key variable: the secrets the task was handed, else this process's environment), so a
gateway reused by several mutations of one worker uses each task's key.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

API_PATHS = {"openai": "/openai/v1", "anthropic": "/anthropic"}
START_TIMEOUT_S = 120.0


class MutationGateway:
    """See the module docstring. ``llm``: the model every call is sent to, a search role's
    ``llm`` block (:class:`~milo_ray.agents.role_llm.RoleLLM`: ``model``, ``api_base``,
    ``api_key_env``, prices, retries, rate limits); the CLI's own choice of model is
    ignored."""

    def __init__(self, llm: Mapping[str, Any]) -> None:
        from milo_ray.agents.role_llm import RoleLLM

        # The same fields, defaults and checks as every search role's ``llm`` block.
        cfg = RoleLLM.of(llm, where="gateway.llm").model_config()
        self.cfg = cfg
        self._gateway: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    # A mutator is shipped to its task before it runs: the gateway starts there.
    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cfg = state["cfg"]
        self._gateway, self._loop, self._lock = None, None, threading.Lock()

    # --- the protocol ---------------------------------------------------------------------
    def base_url(self, api: str) -> str:
        if api not in API_PATHS:
            raise ValueError(f"MutationGateway: api={api!r}; expected one of {sorted(API_PATHS)}")
        gw = self._started()
        return f"http+unix://{quote(gw.socket_path, safe='')}{API_PATHS[api]}"

    def issue_token(self, *, role: str, caller: str) -> str:
        from milo_ray.agents.llm import key_env, secret

        gw = self._started()
        name = key_env(self.cfg)
        gw.set_key(secret(name) if name else None)
        grant = self._call(self._issue(gw, f"{role}:{caller}"))
        return grant.token

    def revoke_token(self, token: str) -> None:
        gw = self._gateway
        grant = gw.grants.find(token) if gw is not None else None
        if grant is not None:
            gw.end(grant)

    def metered(self, token: str) -> dict[str, Any] | None:
        """The calls made with ``token``: ``input_tokens``, ``output_tokens``, ``cost_usd``
        (None when any call is unpriced), ``calls`` and the first ``error``; None for a
        token this gateway did not issue."""
        gw = self._gateway
        grant = gw.grants.find(token) if gw is not None else None
        if grant is None:
            return None
        calls = list(grant.calls)
        costs = [c.get("cost_usd") for c in calls]
        return {"input_tokens": sum(int(c["input_tokens"]) for c in calls),
                "output_tokens": sum(int(c["output_tokens"]) for c in calls),
                "cost_usd": None if any(c is None for c in costs) else float(sum(costs)),
                "calls": len(calls), "error": next((c["error"] for c in calls if c.get("error")), None)}

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
    async def _issue(gw: Any, label: str) -> Any:
        return gw.issue(label)  # binds the grant to the gateway's loop

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(START_TIMEOUT_S)

    def _started(self) -> Any:
        with self._lock:
            if self._gateway is not None:
                return self._gateway
            from milo_ray.execution.gateway.server import ModelGateway

            # A private directory (0700): the socket is reached through the CLI's relay only.
            directory = tempfile.mkdtemp(prefix="milo-mutation-gw-")
            gw = ModelGateway(self.cfg, Path(directory) / "gateway.sock")
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mutation-gateway", daemon=True).start()
            asyncio.run_coroutine_threadsafe(gw.start(), loop).result(START_TIMEOUT_S)
            self._gateway, self._loop = gw, loop
            return gw
