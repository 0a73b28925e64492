"""The run's spending ledger: executions, tokens and USD, exact under concurrency.

The scheduler *reserves* one execution per uncached rollout before it submits
anything and *commits* it (with the tokens and cost the rollout reported) when the
rollout's final result arrives, or *releases* it when the rollout never started.
Because reservation is atomic for a whole batch, the execution cap can never be
overrun, whatever the interleaving of concurrent callers. Token and cost caps are
soft: a rollout's spend is only known after it ran, so once either cap is reached the
scheduler stops starting new rollouts (in-flight ones finish and are recorded).

Infrastructure retries of one rollout are one execution: the method asked for one
rollout and receives one result. Cached results cost nothing. On resume the ledger
is rebuilt from the rollouts already in the store (see :meth:`BudgetLedger.restore`).

Within a rollout: when the rollouts' model calls go through a metering gateway, the
ledger is linked to the run's shared counter (:meth:`BudgetLedger.share`,
:mod:`milo_ray.boundary.gateway.run_budget`), which every worker's gateway checks
before each call and charges after it, so the token/USD caps also stop rollouts that
are already running. The ledger stays the run's record and pushes into the counter the
spend the gateways did not meter (restored spend, the search agents' calls, rollouts of
an executor without a gateway); it learns the counter's verdict from the rollouts the
counter stopped (:meth:`BudgetLedger.mark_exhausted`). Without a link (an offline
executor, no token/USD cap) the caps stop new rollouts only, as described above.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

log = logging.getLogger(__name__)


def _send(counter: Any, method: str, *args: Any) -> None:
    """Call ``method`` on the shared counter: a Ray actor handle (not awaited), or a plain
    ``RunSpend`` in one process."""
    fn = getattr(counter, method)
    try:
        fn.remote(*args) if hasattr(fn, "remote") else fn(*args)
    except Exception as exc:  # the counter is gone (Ray shut down): the gateways fail closed
        log.warning("the run's budget counter did not take %s%r: %s", method, args, exc)


class BudgetExceeded(RuntimeError):
    """A request did not fit the remaining budget; nothing of it was started.

    When raised after a token/cost cap stopped a batch midway, ``partial`` maps the
    indices of the requests that did finish to their results.
    """

    def __init__(self, message: str, *, partial: dict[int, Any] | None = None) -> None:
        super().__init__(message)
        self.partial: dict[int, Any] = dict(partial or {})


def _check_cap(name: str, value: float | int | None) -> None:
    if value is not None and (not isinstance(value, (int, float)) or value < 0 or math.isnan(value)):
        raise ValueError(f"BudgetLedger: {name}={value!r} must be a non-negative number or None (unlimited)")


class BudgetLedger:
    """Caps on executions, tokens (input + output) and cost in USD; ``None`` = unlimited."""

    def __init__(self, executions: int | None = None, tokens: int | None = None, cost_usd: float | None = None):
        _check_cap("executions", executions)
        _check_cap("tokens", tokens)
        _check_cap("cost_usd", cost_usd)
        self.executions = executions
        self.tokens = tokens
        self.cost_usd = cost_usd
        self._lock = threading.Lock()
        self._executions_used = 0
        self._reserved = 0
        self._tokens_used = 0
        self._cost_used = 0.0
        self._shared: Any = None  # the run's budget counter (a RunSpendActor handle)
        self._exhausted_by: str | None = None  # why the shared counter stopped the run

    # --- reading -------------------------------------------------------------------
    @property
    def executions_used(self) -> int:
        return self._executions_used

    @property
    def reserved(self) -> int:
        """Executions promised to rollouts that have not finished yet."""
        return self._reserved

    @property
    def tokens_used(self) -> int:
        return self._tokens_used

    @property
    def cost_used_usd(self) -> float:
        return self._cost_used

    def remaining_executions(self) -> float:
        """Executions still available to new requests (``math.inf`` when uncapped)."""
        with self._lock:
            return self._remaining_locked()

    def _remaining_locked(self) -> float:
        if self.executions is None:
            return math.inf
        return max(0, self.executions - self._executions_used - self._reserved)

    def spend_exhausted(self) -> bool:
        """True once the token or cost cap is reached: no new rollout may start."""
        with self._lock:
            return self._spend_exhausted_locked()

    def _spend_exhausted_locked(self) -> bool:
        return self._exhausted_by is not None or (self.tokens is not None and self._tokens_used >= self.tokens) or (
            self.cost_usd is not None and self._cost_used >= self.cost_usd
        )

    @property
    def caps_spend(self) -> bool:
        """Whether a token or USD cap is set (what a shared counter would enforce)."""
        return self.tokens is not None or self.cost_usd is not None

    @property
    def exhausted_by(self) -> str | None:
        """Why the shared counter stopped the run's model calls (None: it did not)."""
        return self._exhausted_by

    def can_afford(self, n: int) -> bool:
        """Whether ``n`` more executions could be reserved right now."""
        with self._lock:
            return n <= 0 or (n <= self._remaining_locked() and not self._spend_exhausted_locked())

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state for budget checkpoints and the manifest."""
        with self._lock:
            return {
                "executions": self.executions,
                "tokens": self.tokens,
                "cost_usd": self.cost_usd,
                "executions_used": self._executions_used,
                "reserved": self._reserved,
                "tokens_used": self._tokens_used,
                "cost_used_usd": self._cost_used,
                "exhausted_by": self._exhausted_by,
            }

    # --- mutating ------------------------------------------------------------------
    def reserve(self, n: int) -> None:
        """Atomically promise ``n`` executions, or raise :class:`BudgetExceeded`."""
        if n < 0:
            raise ValueError(f"BudgetLedger.reserve: n={n} must be >= 0")
        if n == 0:
            return
        with self._lock:
            if self._spend_exhausted_locked():
                raise BudgetExceeded(
                    f"token/cost budget spent (tokens {self._tokens_used}/{self.tokens}, "
                    f"cost ${self._cost_used:.4f}/{self.cost_usd}); refusing {n} new rollouts"
                )
            remaining = self._remaining_locked()
            if n > remaining:
                raise BudgetExceeded(
                    f"{n} uncached rollouts requested but only {remaining} of {self.executions} executions remain "
                    f"({self._executions_used} used, {self._reserved} in flight); nothing was started"
                )
            self._reserved += n

    def commit(self, *, tokens: int = 0, cost_usd: float = 0.0, metered: tuple[int, float] = (0, 0.0)) -> None:
        """Turn one reservation into a spent execution carrying its tokens and cost.
        ``metered``: the part of it the rollout's gateway already charged to the shared
        counter (so only the rest is pushed there)."""
        with self._lock:
            if self._reserved <= 0:
                raise RuntimeError("BudgetLedger.commit without a matching reserve()")
            self._reserved -= 1
            self._executions_used += 1
            self._tokens_used += int(tokens)
            self._cost_used += float(cost_usd)
            self._push_locked(int(tokens) - int(metered[0]), float(cost_usd) - float(metered[1]))

    def charge(self, *, tokens: int = 0, cost_usd: float | None = 0.0, metered: tuple[int, float] = (0, 0.0)) -> None:
        """Count spend that is not a rollout (an agent call of the search, a failed
        attempt's calls): it uses up the token and USD caps but no execution. An unpriced
        call (``cost_usd`` None) counts its tokens only. ``metered``: as in :meth:`commit`."""
        with self._lock:
            self._tokens_used += int(tokens)
            self._cost_used += float(cost_usd or 0.0)
            self._push_locked(int(tokens) - int(metered[0]), float(cost_usd or 0.0) - float(metered[1]))

    def share(self, counter: Any) -> None:
        """Link the run's shared budget counter (a ``RunSpendActor`` handle): it starts
        from everything spent so far (on resume, the stored spend) and from now on
        receives every spend the gateways do not meter themselves. None: unlink."""
        with self._lock:
            self._shared = counter
            if counter is None:
                return
            self._push_locked(self._tokens_used, self._cost_used)
            if self._spend_exhausted_locked():
                _send(counter, "exhaust", self._exhausted_by or "the run's token/USD budget was spent before")

    def mark_exhausted(self, reason: str) -> None:
        """The shared counter refused a rollout's model call: the budget is spent for the
        whole run (no new rollout starts, the search stops), whatever this ledger's own
        tally says (the refused call's rollout may have been charged less than the cap)."""
        with self._lock:
            if self._exhausted_by is None:
                self._exhausted_by = reason

    def _push_locked(self, tokens: int, cost_usd: float) -> None:
        # Fire and forget: the counter runs this driver's calls in order; what it has not
        # received yet is spend the driver learned after the fact anyway.
        if self._shared is not None and (tokens > 0 or cost_usd > 0):
            _send(self._shared, "add", max(0, tokens), max(0.0, cost_usd))

    def release(self, n: int = 1) -> None:
        """Give back reservations of rollouts that never started."""
        with self._lock:
            if n > self._reserved:
                raise RuntimeError(f"BudgetLedger.release({n}) exceeds the {self._reserved} reserved executions")
            self._reserved -= n

    def restore(self, *, executions: int, tokens: int, cost_usd: float) -> None:
        """Count spend that happened before a resume (rebuilt from the stored rollouts)."""
        with self._lock:
            self._executions_used += int(executions)
            self._tokens_used += int(tokens)
            self._cost_used += float(cost_usd)
            self._push_locked(int(tokens), float(cost_usd))

    def restore_from_rollouts(self, rollouts: Any) -> None:
        """Charge every budgeted row of a stored ``rollouts`` table (a pyarrow Table):
        each row was one execution, with its tokens and cost. Infra failures count too --
        they ran. Rows run outside the budget (``budgeted`` false: final evaluations) do
        not; rows written before that column existed (null) do."""
        import pyarrow.compute as pc

        if "budgeted" in rollouts.column_names:
            rollouts = rollouts.filter(pc.fill_null(rollouts["budgeted"], True))
        if rollouts.num_rows == 0:
            return

        def total(col: str) -> float:
            return (pc.sum(rollouts[col]).as_py() or 0) if col in rollouts.column_names else 0

        self.restore(
            executions=rollouts.num_rows,
            tokens=int(total("input_tokens") + total("output_tokens")),
            cost_usd=float(total("cost_usd")),
        )

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"BudgetLedger(executions={s['executions_used']}/{s['executions']}, reserved={s['reserved']}, "
            f"tokens={s['tokens_used']}/{s['tokens']}, cost={s['cost_used_usd']:.4f}/{s['cost_usd']})"
        )
