"""Every chat-model call of one agent run, as the rollout executor needs them for the
trajectory and the ``agent_calls`` table (role ``solver``).

:class:`SolverCallRecorder` is a LangChain callback handler: give it to the chat model
(``build_chat_model(cfg, callbacks=[rec])``) or to the agent's ``invoke`` config, run the
agent, then read :meth:`SolverCallRecorder.calls`. Each :class:`SolverCall` holds the
call's :class:`AgentUsage` (tokens from the answer's ``usage_metadata``, else the
provider's ``token_usage``; USD from :func:`milo_ray.llm.client.price`, None when
unpriced; the retries announced through ``on_retry``; the error of a failed call) and
its wall-clock start and end.

Thread- and async-safe: LangChain runs sync handlers of async calls in executor threads
and concurrent calls interleave, so every record is keyed by the call's ``run_id`` and
kept under one lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from milo_ray.llm.client import _field, price
from milo_ray.llm.usage import AgentUsage


@dataclass(frozen=True)
class SolverCall:
    """One chat-model call. ``started_at`` / ``finished_at``: epoch seconds (the
    ``agent_calls`` table's clock); ``usage.seconds`` is their difference measured on a
    monotonic clock."""

    usage: AgentUsage
    started_at: float
    finished_at: float
    model: str | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready row: the trajectory's ``calls`` entry, which
        ``AgentCallLog.record_rollout_calls`` turns into an ``agent_calls`` row."""
        u = self.usage
        return {"model": self.model, "started_at": self.started_at, "finished_at": self.finished_at,
                "input_tokens": u.input_tokens, "output_tokens": u.output_tokens, "cost_usd": u.cost_usd,
                "seconds": u.seconds, "retries": u.retries, "error": u.error}


@dataclass
class _Open:
    started_at: float
    started_mono: float
    model: str | None
    retries: int = 0


def _tokens(response: Any) -> tuple[int, int]:
    """(input, output) tokens of an LLMResult: the answer's ``usage_metadata`` (the
    ``n`` generations of one call all carry that call's usage: count it once), else the
    provider's ``token_usage`` in ``llm_output``."""
    for gens in getattr(response, "generations", None) or []:
        for gen in gens:
            meta = getattr(getattr(gen, "message", None), "usage_metadata", None)
            if meta:
                return int(meta.get("input_tokens") or 0), int(meta.get("output_tokens") or 0)
    usage = (getattr(response, "llm_output", None) or {}).get("token_usage") or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


class SolverCallRecorder(BaseCallbackHandler):
    """Records the chat-model calls of one agent run (see the module docstring).
    ``cfg``: the model config prices come from."""

    raise_error = False  # a bookkeeping failure must never fail the agent's call

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self._open: dict[UUID, _Open] = {}
        self._calls: list[SolverCall] = []
        self._lock = threading.Lock()

    def calls(self) -> list[SolverCall]:
        """The finished calls so far, in the order they finished."""
        with self._lock:
            return list(self._calls)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [c.as_dict() for c in self.calls()]

    def tokens(self) -> int:
        """Input + output tokens of the finished calls (a rollout's token cap checks it)."""
        with self._lock:
            return sum(c.usage.tokens for c in self._calls)

    def _model(self, kwargs: dict[str, Any]) -> str | None:
        params = kwargs.get("invocation_params") or {}
        meta = kwargs.get("metadata") or {}
        return params.get("model") or params.get("model_name") or meta.get("ls_model_name") or \
            _field(self.cfg, "id") or _field(self.cfg, "solver")

    def _start(self, run_id: UUID, kwargs: dict[str, Any]) -> None:
        with self._lock:
            self._open[run_id] = _Open(time.time(), time.monotonic(), self._model(kwargs))

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[Any]], *, run_id: UUID,
                            **kwargs: Any) -> None:
        self._start(run_id, kwargs)

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID, **kwargs: Any) -> None:
        self._start(run_id, kwargs)

    def on_retry(self, retry_state: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            if run_id in self._open:
                self._open[run_id].retries += 1

    def _finish(self, run_id: UUID, tokens: tuple[int, int], error: str | None) -> None:
        with self._lock:
            call = self._open.pop(run_id, None)
        if call is None:  # a call that started before this recorder was attached
            return
        tin, tout = tokens
        cost = price(self.cfg, tin, tout)
        usage = AgentUsage(tin, tout, cost, seconds=time.monotonic() - call.started_mono, retries=call.retries,
                           error=error)
        with self._lock:
            self._calls.append(SolverCall(usage, call.started_at, time.time(), call.model))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, _tokens(response), None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, (0, 0), f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500])
