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

Worst-case overrun: a call is admitted while the counter is under its caps and charged
when it returns, so what a run can spend beyond its cap is the cost of the calls admitted
before the counter reached it and not yet charged then -- the model calls in flight across
the run at that moment, each bounded by its input and the model's ``max_output_tokens`` --
and never a further call.
"""

from __future__ import annotations

import contextvars
import math
import threading
from typing import Any

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
    """The run's token and USD caps (None: unlimited) and what was spent against them.

    ``admit()`` is None while the run may call the model, else the reason it may not;
    ``charge()`` counts one metered call; ``add()`` counts spend known elsewhere (the
    driver's ledger). Thread-safe."""

    def __init__(self, tokens: int | None = None, cost_usd: float | None = None) -> None:
        self.tokens_cap = _cap("tokens", tokens)
        self.cost_cap = _cap("cost_usd", cost_usd)
        self.tokens = 0
        self.cost_usd = 0.0
        self.calls = 0  # calls charged through the gateways
        self.refused = 0  # calls refused once exhausted
        self.exhausted: str | None = None
        self._lock = threading.Lock()

    def admit(self) -> str | None:
        with self._lock:
            self._check_locked()
            if self.exhausted is not None:
                self.refused += 1
            return self.exhausted

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
                    "exhausted": self.exhausted}

    def _add_locked(self, tokens: int, cost_usd: float | None) -> None:
        self.tokens += max(0, int(tokens))
        self.cost_usd += max(0.0, float(cost_usd or 0.0))
        self._check_locked()

    def _check_locked(self) -> None:
        if self.exhausted is not None:
            return
        if self.cost_cap is not None and self.cost_usd >= self.cost_cap:
            self.exhausted = f"the run's USD budget is spent (${self.cost_usd:.6f} of run.budget.cost_usd=${self.cost_cap:g})"
        elif self.tokens_cap is not None and self.tokens >= self.tokens_cap:
            self.exhausted = f"the run's token budget is spent ({self.tokens} of run.budget.tokens={self.tokens_cap:g})"


class RunSpendActor:
    """Ray actor shell around :class:`RunSpend` (a synchronous actor: see the module
    docstring for why the order of one caller's calls matters)."""

    def __init__(self, tokens: int | None, cost_usd: float | None) -> None:
        self.spend = RunSpend(tokens, cost_usd)

    def admit(self) -> str | None:
        return self.spend.admit()

    def charge(self, tokens: int, cost_usd: float | None) -> None:
        self.spend.charge(tokens, cost_usd)

    def add(self, tokens: int, cost_usd: float | None) -> None:
        self.spend.add(tokens, cost_usd)

    def exhaust(self, reason: str) -> None:
        self.spend.exhaust(reason)

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
    """One budgeted rollout's access to the run's counter (see the module docstring).

    ``counter``: the :class:`RunSpendActor` handle, or a :class:`RunSpend` (one process,
    no Ray). :meth:`admit` asks before a call; :meth:`charge` counts a finished call (not
    awaited: the actor runs one caller's calls in order, so this worker's next admission
    sees it). ``refused`` is the reason the run's budget refused a call of this rollout."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        self._remote = hasattr(getattr(counter, "admit", None), "remote")
        self.tokens = 0
        self.cost_usd = 0.0
        self.refused: str | None = None

    async def admit(self) -> str | None:
        try:
            reason = await self.counter.admit.remote() if self._remote else self.counter.admit()
        except Exception as exc:
            # Fail closed: a counter nobody can reach (its driver is gone) pays for nothing.
            reason = f"the run's budget counter is unreachable ({type(exc).__name__})"
        if reason is not None and self.refused is None:
            self.refused = reason
        return reason

    def charge(self, tokens: int, cost_usd: float | None) -> None:
        if not tokens and not cost_usd:
            return  # a failed call: nothing was billed
        self.tokens += int(tokens)
        self.cost_usd += float(cost_usd or 0.0)
        if self._remote:
            try:
                self.counter.charge.remote(int(tokens), cost_usd)  # runs even with its ref dropped
            except Exception:  # the counter is gone: the next admission refuses (fail closed)
                pass
        else:
            self.counter.charge(int(tokens), cost_usd)

    @property
    def metered(self) -> tuple[int, float]:
        """What this rollout charged to the run's counter: (tokens, USD)."""
        return self.tokens, self.cost_usd
