"""Per-rollout grants of the model gateway: who may call, how much, and what they spent.

A :class:`Grant` is issued for one rollout with a random bearer token (worthless outside
the gateway that issued it, and after the rollout ended) and the rollout's caps: its
task's token cap and the executor's cap on model calls. The gateway asks
:meth:`Grant.admit` before forwarding a call and tells :meth:`Grant.record` what the
call cost; the calls recorded here are the rollout's tokens and USD, whatever the harness
says about itself. A budgeted rollout's grant also carries its share of the run's budget
(:class:`~milo_ray.execution.gateway.run_budget.RolloutBudget`): every recorded call is
charged to the run's counter, and the gateway asks that counter before it forwards a call.
A grant given the attempt's journal (:mod:`.call_journal`) also writes each call there as
it is forwarded (:meth:`Grant.forwarding`) and as it returns, so a call the rollout never
reports is still known to the driver.
When a cap is reached the grant stops (``stop_reason``: ``token_cap``, ``call_cap`` or
``run_budget``) and wakes whoever waits on :attr:`Grant.stopped` -- the executor, which
then ends the rollout.

Decisions only: nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refusal:
    """Why a call is not forwarded: an HTTP status and a message for the caller."""

    status: int
    reason: str  # "unknown_token" | "ended" | "token_cap" | "call_cap" | "run_budget"
    message: str


class Grant:
    """One rollout's right to call the model (see the module docstring).

    ``token_cap``: input + output tokens after which the rollout stops (None: none);
    ``call_cap``: model calls it may make (None: none); ``run_budget``: the rollout's
    :class:`~milo_ray.execution.gateway.run_budget.RolloutBudget` (None: the rollout is
    not counted against the run's budget); ``journal``: the attempt's
    :class:`~milo_ray.execution.gateway.call_journal.AttemptJournal` (None: none kept)."""

    def __init__(self, label: str, *, token_cap: int | None = None, call_cap: int | None = None,
                 run_budget: Any = None, journal: Any = None) -> None:
        if token_cap is not None and token_cap < 1:
            raise ValueError(f"Grant: token_cap={token_cap} must be >= 1 or None")
        if call_cap is not None and call_cap < 1:
            raise ValueError(f"Grant: call_cap={call_cap} must be >= 1 or None")
        self.token = secrets.token_urlsafe(32)
        self.label = label
        self.token_cap, self.call_cap = token_cap, call_cap
        self.run_budget = run_budget
        self.journal = journal
        self.calls: list[dict[str, Any]] = []
        self.in_flight = 0
        self.ended = False
        self.stop_reason: str | None = None
        # Set when a forwarded call failed past the gateway's retries: the endpoint, not
        # the harness, is what failed (the executor reports it as an infrastructure failure).
        self.upstream_error: str | None = None
        self._lock = threading.Lock()
        self._stopped: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self) -> None:
        """Create :attr:`stopped` on the running loop (the executor's)."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()

    @property
    def stopped(self) -> asyncio.Event:
        assert self._stopped is not None, "Grant.bind_loop() first"
        return self._stopped

    def tokens(self) -> int:
        with self._lock:
            return sum(int(c["input_tokens"]) + int(c["output_tokens"]) for c in self.calls)

    def admit(self) -> Refusal | None:
        """None to forward the call (it is then counted in flight until :meth:`record`),
        else why not."""
        with self._lock:
            if self.ended:
                return Refusal(401, "ended", "this rollout has ended; its gateway token is no longer valid")
            if self.stop_reason == "run_budget":
                return Refusal(429, "run_budget", "the run's token/USD budget is spent; no further model calls are "
                                                  "paid for")
            if self.stop_reason is not None:
                return Refusal(429, self.stop_reason, f"this rollout reached its {self._cap_text(self.stop_reason)}")
            if self.call_cap is not None and len(self.calls) + self.in_flight >= self.call_cap:
                self._stop_locked("call_cap")
                return Refusal(429, "call_cap", f"this rollout reached its {self._cap_text('call_cap')}")
            self.in_flight += 1
            return None

    def forwarding(self, started_at: float) -> int | None:
        """An admitted call is being forwarded now: journaled, when the grant keeps a
        journal, before the provider sees it. Returns the number :meth:`record` takes."""
        return None if self.journal is None else self.journal.began(started_at)

    def record(self, call: dict[str, Any], *, upstream_error: str | None = None, began: int | None = None) -> None:
        """A forwarded call finished (``call``: a ``SolverCall.as_dict()`` row; ``began``:
        what :meth:`forwarding` returned for it)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            self.calls.append(call)
            if self.journal is not None and began is not None:
                self.journal.finished(began, len(self.calls) - 1, call)
            if self.run_budget is not None:
                self.run_budget.charge(int(call["input_tokens"]) + int(call["output_tokens"]), call.get("cost_usd"))
            if upstream_error is not None:
                self.upstream_error = upstream_error
            used = sum(int(c["input_tokens"]) + int(c["output_tokens"]) for c in self.calls)
            if self.token_cap is not None and used >= self.token_cap and self.stop_reason is None:
                self._stop_locked("token_cap")

    def release(self) -> None:
        """A call admitted but never forwarded (the request was malformed)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)

    def refuse_for_run_budget(self, reason: str) -> Refusal:
        """The run's budget refused a call admitted by :meth:`admit`: it is not forwarded,
        and the rollout stops (``run_budget``)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            if self.stop_reason is None:
                self._stop_locked("run_budget")
        return Refusal(429, "run_budget", f"{reason}; no further model calls are paid for")

    def end(self) -> None:
        """The rollout is over: refuse the token from now on."""
        with self._lock:
            self.ended = True

    def _cap_text(self, reason: str) -> str:
        if reason == "token_cap":
            return f"token cap ({self.token_cap} tokens)"
        if reason == "call_cap":
            return f"cap on model calls ({self.call_cap} calls)"
        return reason

    def _stop_locked(self, reason: str) -> None:
        self.stop_reason = reason
        if self._loop is not None and self._stopped is not None:
            try:
                self._loop.call_soon_threadsafe(self._stopped.set)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


class GrantBook:
    """Token -> grant, for one gateway."""

    def __init__(self) -> None:
        self._grants: dict[str, Grant] = {}
        self._lock = threading.Lock()

    def issue(self, label: str, *, token_cap: int | None = None, call_cap: int | None = None,
              run_budget: Any = None, journal: Any = None) -> Grant:
        grant = Grant(label, token_cap=token_cap, call_cap=call_cap, run_budget=run_budget, journal=journal)
        with self._lock:
            self._grants[grant.token] = grant
        return grant

    def find(self, token: str | None) -> Grant | None:
        if not token:
            return None
        with self._lock:
            return self._grants.get(token)

    def end(self, grant: Grant) -> None:
        """End ``grant``; its token stays known (so a late call reads "ended", not
        "unknown") until :meth:`forget` drops it."""
        grant.end()

    def forget_ended(self, keep: int = 10_000) -> None:
        """Drop the oldest ended grants beyond ``keep`` (a long run issues many)."""
        with self._lock:
            ended = [t for t, g in self._grants.items() if g.ended]
            for t in ended[: max(0, len(ended) - keep)]:
                del self._grants[t]
