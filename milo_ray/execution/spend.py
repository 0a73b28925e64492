"""The scheduler's side of the run's spend: which ledger a batch is reserved on, the
run's shared budget counter at the model gateways, and the rollouts that counter stopped.

A batch counted against the run's budget is reserved on the run's
:class:`~milo_ray.execution.budget.BudgetLedger`; a ``count_budget=False`` batch (a final
evaluation) on ``uncounted``, which is never capped. When the executor meters its model
calls (a gateway) and a token/USD cap is set, one counter
(:mod:`~milo_ray.boundary.gateway.run_budget`) is started for the run and handed to
every worker, so a spent budget stops the running rollouts' calls too; a rollout it
stopped midway is remembered, so the batch holding it ends in
:class:`~milo_ray.execution.budget.BudgetExceeded` (with every result). A job of a sweep
capped with ``hydra.launcher.max_usd`` (``run.budget.sweep``) also hands its workers the
sweep's ledger (:func:`~milo_ray.boundary.gateway.run_budget.sweep_spend`), shared by every
job of the sweep: its refusal stops the run the same way, with the sweep's reason.
"""

from __future__ import annotations

from typing import Any, Iterable

from milo_ray.execution.budget import BudgetExceeded, BudgetLedger
import logging

from milo_ray.boundary.gateway.run_budget import (is_sweep_reason, meters_model_calls, start_run_spend,
                                                 stop_run_spend, sweep_spend)

log = logging.getLogger(__name__)


class SchedulerSpend:
    """The run's ``budget`` ledger, the ``uncounted`` one, and the gateways' counters:
    the run's, and the sweep's ledger when ``sweep`` = (its name, its USD cap) is given."""

    def __init__(self, budget: BudgetLedger, executor_config: Any, store: Any,
                 sweep: tuple[str, float] | None = None) -> None:
        self.budget = budget
        self.uncounted = BudgetLedger()
        self._store = store
        meters = meters_model_calls(executor_config)
        # Only a capped run whose executor meters its model calls needs a counter (the
        # offline executors keep the ledger's rule alone).
        self._wants_counter = budget.caps_spend and meters
        self._sweep = sweep if sweep is not None and meters else None
        if sweep is not None and not meters:
            log.warning("run.budget.sweep: this job's executor makes no metered model calls (no gateway), so it "
                        "charges nothing to the sweep's ledger %s", sweep[0])
        self.counter: Any = None
        self.sweep_ledger: Any = None
        self._stopped: set[str] = set()

    def ledger(self, count_budget: bool) -> BudgetLedger:
        return self.budget if count_budget else self.uncounted

    def counts(self, ledger: BudgetLedger) -> bool:
        """Whether a job reserved on ``ledger`` is counted against the run's budget."""
        return ledger is self.budget

    def start_counter(self) -> Any:
        """Start the run's counter and find the sweep's ledger (once, after Ray is up): what
        the workers are handed -- one counter, a list [run's, sweep's], or None when the run
        needs none. The run's starts from the ledger's spend (on resume, the stored spend)."""
        if self._wants_counter and self.counter is None:
            self.counter = start_run_spend(self.budget.tokens, self.budget.cost_usd)
            self.budget.share(self.counter)
        if self._sweep is not None and self.sweep_ledger is None:
            self.sweep_ledger = sweep_spend(*self._sweep)
        counters = [c for c in (self.counter, self.sweep_ledger) if c is not None]
        return counters[0] if len(counters) == 1 else (counters or None)

    def stop_counter(self) -> None:
        """The run's counter dies with the run's rollouts; the ledger keeps its own record.
        The sweep's ledger lives on for the sweep's other jobs."""
        self.sweep_ledger = None
        if self.counter is not None:
            self.budget.share(None)
            stop_run_spend(self.counter)
            self.counter = None

    def counter_refused(self, key: str, reason: str, *, has_result: bool) -> None:
        """The counter refused a model call of rollout ``key``: no new rollout starts (the
        ledger is spent; the queued ones are dropped at the next dispatch) and, when the
        rollout still produced a result, its batch is cut short by the budget."""
        if self.budget.exhausted_by is None:
            self.budget.mark_exhausted(reason)
            # scope: which counter refused -- the run's own, or the sweep's (the sweep summary
            # names the jobs the sweep's cap stopped by it).
            self._store.event("run_budget_exhausted", {"reason": reason, "ledger": self.budget.snapshot(),
                                                       "scope": "sweep" if is_sweep_reason(reason) else "run"})
        if has_result:
            self._stopped.add(key)

    def charge_failed_attempt(self, ledger: BudgetLedger, calls: Iterable[dict[str, Any]],
                              metered: tuple[int, float]) -> None:
        """Charge the model calls of an attempt that failed (paid for, but no stored result
        carries them); ``metered`` is what its gateway already charged to the counter."""
        if ledger is not self.budget:
            return
        calls = list(calls)
        tokens = sum(int(c.get("input_tokens") or 0) + int(c.get("output_tokens") or 0) for c in calls)
        self.budget.charge(tokens=tokens, cost_usd=sum(c.get("cost_usd") or 0.0 for c in calls), metered=metered)

    def stopped_midway(self, key: str, count_budget: bool) -> BudgetExceeded | None:
        """The error a counted batch ends in when the counter stopped its rollout ``key``."""
        if count_budget and key in self._stopped:
            return BudgetExceeded(f"the run's token/USD budget stopped rollouts midway "
                                  f"({self.budget.exhausted_by or 'spent'})")
        return None
