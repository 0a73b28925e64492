"""Per-rollout grants of the model gateway: who may call, how much, and what they spent.

A :class:`Grant` is issued for one rollout with a random bearer token (worthless outside
the gateway that issued it, and after the rollout ended; a sandbox's grant also has a
socket of its own, :attr:`Grant.socket_path`, and its token is worthless on any other) and
the rollout's caps: its
task's token cap and the executor's cap on model calls. The gateway asks
:meth:`Grant.admit` before forwarding a call and tells :meth:`Grant.record` what the
call cost; the calls recorded here are the rollout's tokens and USD, whatever the harness
says about itself. Admission reserves an upper bound of the call's tokens against the
token cap (the prompt's size plus its output bound, at most what the cap has left, the
other calls in flight's reservations counted), so parallel calls never together pass the
cap; :meth:`Grant.record` settles the reservation to what the call was charged. A call
that failed is recorded with its class as the gateway decided it (:attr:`Grant.failures`):
``infra`` (the endpoint failed past the gateway's retries: 429, 5xx, timeouts, dropped
connections) or ``request`` (the provider refused the request as sent: another 4xx), and a
request refused before it went upstream with ``refused``; only the first makes the
rollout an infrastructure failure (:meth:`Grant.endpoint_failure`).
A budgeted rollout's grant also carries its share of the run's budget
(:class:`~milo_ray.boundary.gateway.run_budget.RolloutBudget`): every recorded call is
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
    reason: str  # "unknown_token" | "ended" | "wrong_socket" | "token_cap" | "call_cap" | "run_budget" | "bad_request"
    message: str


@dataclass(frozen=True)
class Admission:
    """An admitted call: the tokens reserved for it against the token cap (what the call
    is charged when the provider never reports its usage), and the output bound it must be
    forwarded with when the cap's remainder is below its own (None: its own stands)."""

    reserved: int
    ticket: int = 0
    output_cap: int | None = None


# The name of a bound grant's socket in the directory the host made for its sandbox (the
# sandbox sees that directory, read-only, at a fixed path of its own).
GRANT_SOCKET = "gateway.sock"
# The failure classes the gateway records (see the module docstring).
FAILURE_CLASSES = ("infra", "request", "refused")
# Refused requests cost the provider nothing and a harness can send any number of them:
# the first ones are kept with their reasons, the rest only counted.
KEPT_REFUSALS = 100


class Grant:
    """One rollout's right to call the model (see the module docstring).

    ``token_cap``: input + output tokens after which the rollout stops (None: none);
    ``call_cap``: model calls it may make (None: none); ``run_budget``: the rollout's
    :class:`~milo_ray.boundary.gateway.run_budget.RolloutBudget` (None: the rollout is
    not counted against the run's budget); ``journal``: the attempt's
    :class:`~milo_ray.boundary.gateway.call_journal.AttemptJournal` (None: none kept)."""

    def __init__(self, label: str, *, token_cap: int | None = None, call_cap: int | None = None,
                 run_budget: Any = None, journal: Any = None) -> None:
        if token_cap is not None and token_cap < 1:
            raise ValueError(f"Grant: token_cap={token_cap} must be >= 1 or None")
        if call_cap is not None and call_cap < 1:
            raise ValueError(f"Grant: call_cap={call_cap} must be >= 1 or None")
        self.token = secrets.token_urlsafe(32)
        self.label = label
        # The grant's own listening socket, when the gateway made it one
        # (ModelGateway.issue_bound): its token is then accepted there and nowhere else.
        self.socket_path: str | None = None
        self.token_cap, self.call_cap = token_cap, call_cap
        self.run_budget = run_budget
        self.journal = journal
        self.calls: list[dict[str, Any]] = []
        # The failed and refused calls, each {"call": index in calls or None, "class",
        # "status", "error"}: the class is the gateway's decision, never the harness's.
        self.failures: list[dict[str, Any]] = []
        self.refusals = 0  # requests refused before they went upstream (the first KEPT_REFUSALS in failures)
        self._endpoint_failed: str | None = None  # the error of the last request when it failed as infra
        self.in_flight = 0
        self.reserved = 0  # tokens reserved by the calls in flight
        self._used = 0  # tokens of the recorded calls (kept, not summed per call)
        self._open: dict[int, int] = {}  # ticket -> reservation of each call in flight
        self._began: dict[int, tuple[float, int | None]] = {}  # ticket -> (start, journal number)
        self._tickets = 0
        self.ended = False
        self.stop_reason: str | None = None
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
            return self._used_locked()

    def admit(self, prompt_bound: int = 0, output_bound: int = 0) -> Refusal | Admission:
        """An :class:`Admission` to forward the call (it is then counted in flight, its
        reservation held, until :meth:`record`), else why not. ``prompt_bound`` and
        ``output_bound``: upper bounds of the call's prompt and output tokens. Under a token
        cap the reservation is at most what the cap has left beside the calls in flight;
        the output is then bounded to fit, so calls in parallel never together pass it."""
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
            prompt_bound, output_bound = max(0, int(prompt_bound)), max(1, int(output_bound))
            reserved, output_cap = prompt_bound + output_bound, None
            if self.token_cap is not None:
                room = self.token_cap - self._used_locked() - self.reserved
                if room < prompt_bound + 1:
                    # Spent, or promised to the calls in flight: a further call could pass the cap.
                    self._stop_locked("token_cap")
                    return Refusal(429, "token_cap", f"this rollout reached its {self._cap_text('token_cap')} "
                                                     "(counting its calls in flight)")
                if reserved > room:
                    reserved, output_cap = room, room - prompt_bound
            self.in_flight += 1
            self.reserved += reserved
            self._tickets += 1
            self._open[self._tickets] = reserved
            return Admission(reserved, self._tickets, output_cap)

    def forwarding(self, started_at: float, admission: Admission | None = None) -> int | None:
        """An admitted call is being forwarded now: journaled, when the grant keeps a
        journal, before the provider sees it. Returns the number :meth:`record` takes."""
        began = None if self.journal is None else self.journal.began(started_at)
        if admission is not None:
            with self._lock:
                self._began[admission.ticket] = (started_at, began)
        return began

    def record(self, call: dict[str, Any], *, admission: Admission | None = None, failure: str | None = None,
               status: int | None = None, began: int | None = None) -> None:
        """A forwarded call finished (``call``: a ``SolverCall.as_dict()`` row; ``admission``:
        what :meth:`admit` gave it; ``failure``: its class when it failed, ``status`` the
        provider's HTTP status then; ``began``: what :meth:`forwarding` returned for it).
        A call :meth:`settle_open` already charged is not recorded again."""
        if failure is not None and failure not in FAILURE_CLASSES:
            raise ValueError(f"Grant.record: failure={failure!r}: expected one of {FAILURE_CLASSES}")
        with self._lock:
            if admission is not None:
                self._began.pop(admission.ticket, None)
                if self._open.pop(admission.ticket, None) is None:
                    return  # charged its reservation when its rollout ended
            self._record_locked(call, 0 if admission is None else admission.reserved, failure, status, began,
                                None if admission is None else admission.ticket)

    def settle_open(self, row_for: Any) -> int:
        """Charge every call still in flight its reservation (``row_for(reserved, started_at)``
        makes its row): its rollout is over and the provider's usage did not come in time.
        Returns how many there were."""
        with self._lock:
            open_calls, self._open = list(self._open.items()), {}
            for ticket, reserved in open_calls:
                started_at, began = self._began.pop(ticket, (None, None))
                self._record_locked(row_for(reserved, started_at), reserved, None, None, began, ticket)
            return len(open_calls)

    def _record_locked(self, call: dict[str, Any], reserved: int, failure: str | None, status: int | None,
                       began: int | None, ticket: int | None = None) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        self.reserved = max(0, self.reserved - int(reserved))
        self.calls.append(call)
        self._used += int(call["input_tokens"]) + int(call["output_tokens"])
        self._endpoint_failed = (call.get("error") or "the model endpoint failed") if failure == "infra" else None
        if failure is not None:
            self.failures.append({"call": len(self.calls) - 1, "class": failure, "status": status,
                                  "error": call.get("error")})
        if self.journal is not None and began is not None:
            self.journal.finished(began, len(self.calls) - 1, call)
        if self.run_budget is not None:
            # Settles what the run's budget reserved for this call (its ticket) at admission.
            self.run_budget.charge(int(call["input_tokens"]) + int(call["output_tokens"]), call.get("cost_usd"),
                                   key=ticket)
        if self.token_cap is not None and self._used_locked() >= self.token_cap and self.stop_reason is None:
            self._stop_locked("token_cap")

    def refused(self, refusal: Refusal) -> Refusal:
        """A request refused before it was admitted or forwarded (malformed, or asking the
        provider to act outside the sandbox): noted in :attr:`failures`, nothing charged."""
        with self._lock:
            self.refusals += 1
            self._endpoint_failed = None
            if self.refusals <= KEPT_REFUSALS:
                self.failures.append({"call": None, "class": "refused", "status": refusal.status,
                                      "error": refusal.message[:500]})
        return refusal

    def endpoint_failure(self) -> str | None:
        """The error of the rollout's last request when it was a call that failed as
        ``infra`` (the endpoint, past the gateway's retries), else None (a later call or
        refused request clears it): the only ground on which the rollout is an
        infrastructure failure. Whatever the harness says about itself is not asked."""
        with self._lock:
            return self._endpoint_failed

    def refuse_for_run_budget(self, reason: str, admission: Admission) -> Refusal:
        """The run's budget refused a call admitted by :meth:`admit`: it is not forwarded,
        and the rollout stops (``run_budget``)."""
        with self._lock:
            if self._open.pop(admission.ticket, None) is not None:
                self.in_flight = max(0, self.in_flight - 1)
                self.reserved = max(0, self.reserved - admission.reserved)
            if self.stop_reason is None:
                self._stop_locked("run_budget")
        return Refusal(429, "run_budget", f"{reason}; no further model calls are paid for")

    def release(self, admission: Admission) -> None:
        """A call admitted by :meth:`admit` was stopped before it was forwarded: the
        provider never saw it, so its reservation is released and nothing is charged."""
        with self._lock:
            self._began.pop(admission.ticket, None)
            if self._open.pop(admission.ticket, None) is not None:
                self.in_flight = max(0, self.in_flight - 1)
                self.reserved = max(0, self.reserved - admission.reserved)

    def end(self) -> None:
        """The rollout is over: refuse the token from now on."""
        with self._lock:
            self.ended = True

    def _used_locked(self) -> int:
        return self._used

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
