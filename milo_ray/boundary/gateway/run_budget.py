"""The run's token and USD budget, enforced at the model gateway of every worker.

The driver's :class:`~milo_ray.execution.budget.BudgetLedger` learns a rollout's spend
when the rollout ends, so on its own it can only stop *new* rollouts once the run's
``run.budget.tokens`` / ``run.budget.cost_usd`` is spent; a rollout already running may
go on calling the model (a harness loop makes thousands of calls). This module makes the
gateway stop paying within the rollout too:

* :class:`RunSpend`: the plain decision object -- the run's caps, what was spent, and
  whether the run is exhausted. A call is admitted while nothing has reached a cap;
  every call's metered tokens and USD are charged after it; once a cap is reached the
  run is *exhausted* for good (latched: spend only grows) and every further call is
  refused;
* :class:`RunSpendActor`: a thin Ray actor around one :class:`RunSpend`, created by the
  driver for one run (:func:`start_run_spend`) and handed to each rollout worker as an
  argument of an actor call, so every worker's gateway, on any node, checks and charges
  the same counter. A synchronous actor: calls from one caller run in the order they were
  sent, so a worker's fire-and-forget charge is counted before its next admission;
* :class:`RolloutBudget`: one rollout's view of that counter, made by the worker for each
  budgeted rollout and given to the executor through :data:`current_rollout_budget`
  (a context variable, so the Executor protocol is unchanged). It tallies what its
  rollout charged, which the driver subtracts when it commits the rollout, so nothing is
  counted twice.

Why one actor rather than allowances leased to the workers: a lease must be sized (too
small and every call waits for a top-up; too large and budget sits unused on one worker
while another is refused, and a dead worker's lease is lost), whereas one counter is exact
and its cost -- one actor round trip before a call that itself takes hundreds of
milliseconds -- is small. The driver's ledger stays the run's record: it pushes the spend
the gateways did not meter (the search agents' calls, executors without a gateway, the
spend restored on resume) into the counter, and reads the counter's verdict back from the
rollouts it ends (:attr:`RolloutBudget.refused`).

Reservations. A gateway admits a call with an upper bound of what it may cost -- its
prompt's size plus its output bound in tokens, and those tokens at the model's prices in
USD -- and the counter holds that bound until the call is settled with what it was
charged (:meth:`RunSpend.reserve`, :meth:`RunSpend.settle`; the same rule as a rollout's
own token cap, :meth:`~milo_ray.boundary.gateway.ledger.Grant.admit`). A call is admitted
when its bound fits beside the spend and the other calls' reservations; when it does not
fit but calls are in flight, it waits for them to settle (they are usually charged far
less than their bounds); when it does not fit and nothing is in flight, it is admitted
alone. So parallel calls never together pass a cap: the overrun is at most what that one
call, admitted alone, was charged beyond what the cap had left. A reservation nobody
settles within :data:`RESERVATION_LEASE_S` (its worker died) is charged its bound.

The sweep's ledger. A sweep with ``hydra.launcher.max_usd`` hands each job the name of
one more counter (``run.budget.sweep``): a :class:`RunSpend` with the sweep's USD cap in a
detached actor named by the sweep (:func:`sweep_spend`) in the cluster-wide namespace, so
every job's gateways reserve on and charge it beside their own run's counter, and at the
cap every job's next call is refused (the rollout stops ``run_budget``, the run stops with
the sweep's reason as its stop reason, and resumes like any run stopped by its budget).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import math
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

# How long a reservation is held at most: a call is bounded by its request timeout and
# retries, and a reservation older than this belongs to a worker that died with the call
# in flight (it is then charged its bound, as the gateway charges a call it lost).
RESERVATION_LEASE_S = 900.0
# How often a call that waits for the calls in flight to settle asks again.
_WAIT_POLL_S = (0.02, 0.5)

# The rollout budget of the rollout running in this context (None: the rollout is not
# budgeted -- a final evaluation, or an executor run without a scheduler).
current_rollout_budget: contextvars.ContextVar["RolloutBudget | None"] = contextvars.ContextVar(
    "current_rollout_budget", default=None)


def _cap(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or math.isnan(value):
        raise ValueError(f"run.budget.{name}={value!r}: must be a non-negative number or null (unlimited)")
    return float(value)


class RunSpend:
    """The token and USD caps (None: unlimited) of a run -- or of a sweep (``scope``) -- and
    what was spent and is reserved against them.

    ``admit()`` is None while calls may be made, else the reason not; :meth:`reserve` /
    :meth:`settle` admit a call with its upper bound and charge what it cost (see the
    module docstring); ``charge()`` counts one metered call admitted without a bound;
    ``add()`` counts spend known elsewhere (the driver's ledger). Thread-safe.
    ``clock``: monotonic seconds (tests pass their own)."""

    _CAP_FIELDS = {"run": ("the run's", "run.budget.tokens", "run.budget.cost_usd"),
                   "sweep": ("the sweep's", "the sweep's token cap", "hydra.launcher.max_usd")}

    def __init__(self, tokens: int | None = None, cost_usd: float | None = None, *, scope: str = "run",
                 clock: Any = time.monotonic) -> None:
        if scope not in self._CAP_FIELDS:
            raise ValueError(f"RunSpend: scope={scope!r}: expected one of {sorted(self._CAP_FIELDS)}")
        self.scope = scope
        self.tokens_cap = _cap("tokens", tokens)
        self.cost_cap = _cap("cost_usd", cost_usd)
        self.tokens = 0
        self.cost_usd = 0.0
        self.calls = 0  # calls charged through the gateways
        self.refused = 0  # calls refused once exhausted
        self.exhausted: str | None = None
        self.reserved_tokens = 0
        self.reserved_usd = 0.0
        self._open: dict[int, tuple[int, float, float]] = {}  # ticket -> (tokens, USD, reserved at)
        self._lapsed: dict[int, tuple[int, float]] = {}  # tickets charged their bound when their lease ran out
        self._tickets = itertools.count(1)
        self._clock = clock
        self._lock = threading.Lock()

    def admit(self) -> str | None:
        with self._lock:
            self._check_locked()
            if self.exhausted is not None:
                self.refused += 1
            return self.exhausted

    def reserve(self, tokens: int = 0, cost_usd: float | None = 0.0) -> tuple[str, Any]:
        """Admit a call whose cost is at most ``tokens`` and ``cost_usd`` (None: unpriced,
        so only its tokens are held): ``("admit", ticket)`` -- the bound is held until
        :meth:`settle` -- or ``("wait", None)`` -- it does not fit beside the calls in
        flight; ask again once they settle -- or ``("refuse", reason)``: a cap is reached."""
        tokens, usd = max(0, int(tokens)), max(0.0, float(cost_usd or 0.0))
        with self._lock:
            self._lapse_locked()
            self._check_locked()
            if self.exhausted is not None:
                self.refused += 1
                return "refuse", self.exhausted
            fits = ((self.tokens_cap is None or self.tokens + self.reserved_tokens + tokens <= self.tokens_cap)
                    and (self.cost_cap is None or self.cost_usd + self.reserved_usd + usd <= self.cost_cap))
            if not fits and self._open:
                return "wait", None
            # Fits, or nothing is in flight: admitted alone, it can pass the cap by no more
            # than what it is charged beyond what the cap has left.
            ticket = next(self._tickets)
            self._open[ticket] = (tokens, usd, self._clock())
            self.reserved_tokens += tokens
            self.reserved_usd += usd
            return "admit", ticket

    def settle(self, ticket: int, tokens: int, cost_usd: float | None) -> None:
        """The call admitted as ``ticket`` was charged ``tokens`` and ``cost_usd``: its
        reservation is released and the charge counted (once: a ticket whose lease ran out
        was charged its bound, which is corrected to this)."""
        with self._lock:
            held = self._open.pop(ticket, None)
            if held is not None:
                self.reserved_tokens = max(0, self.reserved_tokens - held[0])
                self.reserved_usd = max(0.0, self.reserved_usd - held[1])
                self.calls += 1
                self._add_locked(tokens, cost_usd)
                return
            lapsed = self._lapsed.pop(ticket, None)
            if lapsed is not None:  # charged its bound already: count the difference
                self.tokens = max(0, self.tokens + max(0, int(tokens)) - lapsed[0])
                self.cost_usd = max(0.0, self.cost_usd + max(0.0, float(cost_usd or 0.0)) - lapsed[1])
                self._check_locked()

    def release(self, ticket: int) -> None:
        """The call admitted as ``ticket`` never went to the provider: nothing is charged."""
        with self._lock:
            held = self._open.pop(ticket, None)
            if held is not None:
                self.reserved_tokens = max(0, self.reserved_tokens - held[0])
                self.reserved_usd = max(0.0, self.reserved_usd - held[1])

    def charge(self, tokens: int, cost_usd: float | None) -> None:
        with self._lock:
            self.calls += 1
            self._add_locked(tokens, cost_usd)

    def add(self, tokens: int, cost_usd: float | None) -> None:
        with self._lock:
            self._add_locked(tokens, cost_usd)

    def exhaust(self, reason: str) -> None:
        """Stop every further call (the driver's own ledger found the budget spent)."""
        with self._lock:
            if self.exhausted is None:
                self.exhausted = reason

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"tokens": self.tokens, "cost_usd": self.cost_usd, "tokens_cap": self.tokens_cap,
                    "cost_usd_cap": self.cost_cap, "calls": self.calls, "refused": self.refused,
                    "exhausted": self.exhausted, "reserved_tokens": self.reserved_tokens,
                    "reserved_usd": self.reserved_usd, "in_flight": len(self._open)}

    def _lapse_locked(self) -> None:
        now = self._clock()
        for ticket, (tokens, usd, at) in list(self._open.items()):
            if now - at > RESERVATION_LEASE_S:
                del self._open[ticket]
                self.reserved_tokens = max(0, self.reserved_tokens - tokens)
                self.reserved_usd = max(0.0, self.reserved_usd - usd)
                self._lapsed[ticket] = (tokens, usd)
                self.calls += 1
                self._add_locked(tokens, usd)

    def _add_locked(self, tokens: int, cost_usd: float | None) -> None:
        self.tokens += max(0, int(tokens))
        self.cost_usd += max(0.0, float(cost_usd or 0.0))
        self._check_locked()

    def _check_locked(self) -> None:
        if self.exhausted is not None:
            return
        whose, tokens_field, usd_field = self._CAP_FIELDS[self.scope]
        if self.cost_cap is not None and self.cost_usd >= self.cost_cap:
            self.exhausted = f"{whose} USD budget is spent (${self.cost_usd:.6f} of {usd_field}=${self.cost_cap:g})"
        elif self.tokens_cap is not None and self.tokens >= self.tokens_cap:
            self.exhausted = f"{whose} token budget is spent ({self.tokens} of {tokens_field}={self.tokens_cap:g})"


class RunSpendActor:
    """Ray actor shell around :class:`RunSpend` (a synchronous actor: see the module
    docstring for why the order of one caller's calls matters)."""

    def __init__(self, tokens: int | None, cost_usd: float | None, scope: str = "run") -> None:
        self.spend = RunSpend(tokens, cost_usd, scope=scope)

    def admit(self) -> str | None:
        return self.spend.admit()

    def reserve(self, tokens: int, cost_usd: float | None) -> tuple[str, Any]:
        return self.spend.reserve(tokens, cost_usd)

    def settle(self, ticket: int, tokens: int, cost_usd: float | None) -> None:
        self.spend.settle(ticket, tokens, cost_usd)

    def release(self, ticket: int) -> None:
        self.spend.release(ticket)

    def charge(self, tokens: int, cost_usd: float | None) -> None:
        self.spend.charge(tokens, cost_usd)

    def add(self, tokens: int, cost_usd: float | None) -> None:
        self.spend.add(tokens, cost_usd)

    def exhaust(self, reason: str) -> None:
        self.spend.exhaust(reason)

    def set_cap(self, cost_usd: float) -> float | None:
        """The sweep's cap as its launcher gave it to the job asking (the jobs of one launch
        all give the same; a sweep launched again into its directory with another
        ``hydra.launcher.max_usd`` -- or a job resumed with another
        ``run.budget.sweep.cost_usd`` -- moves it, so a sweep stopped by its cap goes on
        once it is raised). Returns the cap held before."""
        spend = self.spend
        with spend._lock:
            before = spend.cost_cap
            spend.cost_cap = float(cost_usd)
            if spend.exhausted is not None and spend.cost_usd < spend.cost_cap:
                spend.exhausted = None  # raised above what was spent: calls are paid again
            spend._check_locked()
            return before

    def snapshot(self) -> dict[str, Any]:
        return self.spend.snapshot()


def start_run_spend(tokens: int | None, cost_usd: float | None) -> Any:
    """The run's counter as a Ray actor, owned by the caller (the driver): it lives as long
    as the driver's handle and dies with the run. Ray must be initialized."""
    import ray

    RunSpend(tokens, cost_usd)  # bad caps fail here, in the driver, naming the field
    # num_cpus=0: it does microseconds of work per call and must never wait for a CPU that
    # rollouts hold; max_restarts=0: a restarted counter would start from zero.
    return ray.remote(num_cpus=0, max_restarts=0)(RunSpendActor).remote(tokens, cost_usd)


SWEEP_LEDGER_PREFIX = "milo_ray.sweep_spend:"


def is_sweep_reason(reason: str | None) -> bool:
    """Whether a refusal's reason is the sweep's ledger's (its cap), not the run's own."""
    return bool(reason) and str(reason).startswith(RunSpend._CAP_FIELDS["sweep"][0])


def sweep_spend(ledger: str, cost_usd: float) -> Any:
    """The sweep's shared ledger (``run.budget.sweep.ledger``, capped at ``cost_usd``): a
    detached actor in the cluster-wide namespace, created by the first job that asks and
    found by name by every other (``get_if_exists``), so it outlives any one job and keeps
    counting across them. A job giving another cap moves it (with a warning: see
    :meth:`RunSpendActor.set_cap`); it is never restarted (a restarted ledger would start
    from zero). Ray must be initialized."""
    import ray

    from milo_ray.llm.rate_limit import CLUSTER_NAMESPACE

    if not isinstance(ledger, str) or not ledger.strip():
        raise ValueError(f"run.budget.sweep.ledger={ledger!r}: must name the sweep's ledger (the launcher sets it)")
    cap = _cap("sweep.cost_usd", cost_usd)
    if cap is None:
        raise ValueError("run.budget.sweep.cost_usd: missing; the sweep's ledger needs its cap "
                         "(hydra.launcher.max_usd sets both)")
    remote = ray.remote(num_cpus=0, max_restarts=0)(RunSpendActor)
    handle = remote.options(name=SWEEP_LEDGER_PREFIX + ledger, namespace=CLUSTER_NAMESPACE, lifetime="detached",
                            get_if_exists=True, resources={"node:__internal_head__": 0.001}).remote(None, cap, "sweep")
    before = ray.get(handle.set_cap.remote(cap))
    if before is not None and before != cap:
        log.warning("run.budget.sweep.cost_usd=%g: the sweep's ledger %s was capped at $%g; it is capped at $%g "
                    "for every job of the sweep from now on", cap, ledger, before, cap)
    return handle


def stop_run_spend(counter: Any) -> None:
    """Kill the run's counter (the scheduler closes); harmless once Ray is shut down."""
    try:
        import ray

        ray.kill(counter)
    except Exception:  # Ray already shut down: the actor went with it
        pass


def meters_model_calls(executor_config: Any) -> bool:
    """Whether the executor's model calls go through a gateway that charges the run's
    counter: its class says so with ``meters_model_calls`` (``executor_config``: a
    ``_target_`` mapping or a built executor)."""
    from collections.abc import Mapping

    if isinstance(executor_config, Mapping) or type(executor_config).__name__ == "DictConfig":
        target = executor_config.get("_target_")
        if not isinstance(target, str):
            return False
        from hydra.utils import get_class

        try:
            cls: Any = get_class(target)
        except Exception:  # a bad target is reported when the worker builds the executor
            return False
    else:
        cls = type(executor_config)
    return bool(getattr(cls, "meters_model_calls", False))


class RolloutBudget:
    """One budgeted rollout's access to the run's counter, and the sweep's when the run is
    part of a capped sweep (see the module docstring).

    ``counter``: the :class:`RunSpendActor` handle, or a :class:`RunSpend` (one process,
    no Ray), or a list of them (the run's, then the sweep's). :meth:`admit` asks before a
    call -- with ``key`` (the grant's ticket of the call) and the call's bounds it reserves
    them on every counter, waiting while they do not fit beside the calls in flight;
    :meth:`charge` counts a finished call (settling its reservations; not awaited: the
    actor runs one caller's calls in order, so this worker's next admission sees it).
    ``refused`` is the reason a counter refused a call of this rollout."""

    def __init__(self, counter: Any) -> None:
        self.counters = list(counter) if isinstance(counter, (list, tuple)) else [counter]
        self.counter = self.counters[0]
        self.tokens = 0
        self.cost_usd = 0.0
        self.refused: str | None = None
        self._open: dict[Any, list[tuple[Any, int]]] = {}  # the grant's ticket -> (counter, its ticket)

    @staticmethod
    def _remote(counter: Any) -> bool:
        return hasattr(getattr(counter, "admit", None), "remote")

    @classmethod
    async def _ask(cls, counter: Any, method: str, *args: Any) -> Any:
        fn = getattr(counter, method)
        return await fn.remote(*args) if cls._remote(counter) else fn(*args)

    @classmethod
    def _tell(cls, counter: Any, method: str, *args: Any) -> None:
        fn = getattr(counter, method)
        try:
            fn.remote(*args) if cls._remote(counter) else fn(*args)  # runs even with its ref dropped
        except Exception:  # the counter is gone: the next admission refuses (fail closed)
            pass

    async def admit(self, key: Any = None, tokens: int = 0, cost_usd: float | None = 0.0) -> str | None:
        """None when the call may go upstream, else why not. Without ``key`` nothing is
        reserved (the call is only charged after it)."""
        held: list[tuple[Any, int]] = []
        reason = None
        try:
            for counter in self.counters:
                if key is None:
                    reason = await self._ask(counter, "admit")
                else:
                    pause = _WAIT_POLL_S[0]
                    while True:
                        verdict, value = await self._ask(counter, "reserve", int(tokens), cost_usd)
                        if verdict != "wait":
                            break
                        await asyncio.sleep(pause)  # the calls in flight settle, then it may fit
                        pause = min(_WAIT_POLL_S[1], pause * 2)
                    if verdict == "admit":
                        held.append((counter, value))
                    else:
                        reason = value
                if reason is not None:
                    break
        except Exception as exc:
            # Fail closed: a counter nobody can reach (its driver is gone) pays for nothing.
            reason = f"the run's budget counter is unreachable ({type(exc).__name__})"
        except BaseException:
            for counter, ticket in held:  # cancelled before it went upstream: nothing to charge
                self._tell(counter, "release", ticket)
            raise
        if reason is not None:
            for counter, ticket in held:
                self._tell(counter, "release", ticket)
            if self.refused is None:
                self.refused = reason
            return reason
        if key is not None:
            self._open[key] = held
        return None

    def charge(self, tokens: int, cost_usd: float | None, key: Any = None) -> None:
        held = self._open.pop(key, None) if key is not None else None
        if not tokens and not cost_usd:
            for counter, ticket in held or []:  # a failed call: nothing was billed
                self._tell(counter, "release", ticket)
            return
        self.tokens += int(tokens)
        self.cost_usd += float(cost_usd or 0.0)
        if held is not None:
            for counter, ticket in held:
                self._tell(counter, "settle", ticket, int(tokens), cost_usd)
            return
        for counter in self.counters:
            self._tell(counter, "charge", int(tokens), cost_usd)

    @property
    def metered(self) -> tuple[int, float]:
        """What this rollout charged to the run's counter: (tokens, USD)."""
        return self.tokens, self.cost_usd
