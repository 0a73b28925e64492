"""What a run is doing right now, for the progress display and experiment tracking.

:class:`RunStatus` is fed by the run store's append listener (``store.add_listener``):
it sees every ``events`` row the method writes and every ``rollouts`` / ``agent_calls``
row (spend). What a method's events mean is the method's own: its plugin's
:meth:`~milo_ray.search.plugin.MethodPlugin.status` view takes them and gives the
method's lines (MILO: one per island, projected through the same state the loop uses;
SSR: the race in progress), the run line's best-so-far and the rounds closed. The run
passes its plugin; a status without one takes the plugin of the first event a
registered method owns (:mod:`milo_ray.methods`). No method calls it and it makes no Ray
call: the store already runs on the driver.

Subscribers (:meth:`RunStatus.subscribe`) get one :class:`RoundMetrics` when a round
closes (a MILO island's progress event, an SSR round's selection).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from milo_ray import methods
from milo_ray.execution.progress import fmt_duration
from milo_ray.search.plugin import MethodPlugin, RoundMetrics, StatusView

__all__ = ["RunStatus", "RoundMetrics", "Spend"]

log = logging.getLogger(__name__)


@dataclass
class Spend:
    """Tokens and USD of every rollout and non-solver agent call seen so far (a solver's
    calls are inside its rollout's totals); ``unpriced``: rows with no known cost;
    executions against the run's budget (None: uncapped)."""

    tokens: int = 0
    cost_usd: float = 0.0
    unpriced: int = 0
    executions_used: int = 0
    executions_budget: int | None = None


class RunStatus:
    """Live status of the run's method (its plugin's lines) plus run-wide best, spend and ETA.

    ``method``: the run's method plugin, or its name (None: the plugin of the first event
    a registered method owns). ``budget``: the run's
    :class:`~milo_ray.execution.budget.BudgetLedger` (executions used against the cap);
    ``deadline``: the run's ``time.monotonic()`` deadline; ``max_rounds``: the method's
    round limit (``method.max_rounds``). Each, when known, bounds the ETA.
    """

    def __init__(self, *, method: MethodPlugin | str | None = None, budget: Any = None,
                 deadline: float | None = None, max_rounds: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget, self.deadline, self.max_rounds = budget, deadline, max_rounds
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.RLock()
        self._subscribers: list[Callable[[RoundMetrics], None]] = []
        self._plugin: MethodPlugin | None = None
        self._view: StatusView | None = None
        if method is not None:
            plugin = methods.plugin_named(method) if isinstance(method, str) else method
            if plugin is None:
                raise LookupError(f"RunStatus: no method plugin named {method!r}")
            self._use(plugin)
        self._spend = Spend()
        self._exec0 = self._executions_used()  # executions used when this session started
        self._round0: int | None = None  # rounds closed when this session started (resume)
        self.version = 0  # bumped on every change the display shows
        self._broken = False

    @property
    def method(self) -> str | None:
        """The name of the method whose events the status follows (None: none seen yet)."""
        return None if self._plugin is None else self._plugin.name

    @property
    def plugin(self) -> MethodPlugin | None:
        return self._plugin

    def _use(self, plugin: MethodPlugin) -> None:
        self._plugin, self._view = plugin, plugin.status(self._spend_metrics)

    # ------------------------------------------------------------------ feeding
    def subscribe(self, fn: Callable[[RoundMetrics], None]) -> None:
        self._subscribers.append(fn)

    def replay(self, store: Any) -> None:
        """Catch up with what earlier sessions of a resumed run stored (nothing is
        published to subscribers: those rounds were reported when they closed)."""
        for table in ("rollouts", "agent_calls"):
            self.observe(table, store.read(table).to_pylist(), publish=False)
        rows = sorted(store.read("events").to_pylist(), key=lambda r: r.get("seq") or 0)
        self.observe("events", rows, publish=False)
        self._exec0 = self._executions_used()
        self._round0 = self._rounds_done()

    def observe(self, table: str, rows: list[dict[str, Any]], *, publish: bool = True) -> None:
        """The store listener. A status that cannot follow the run says so once and
        stops updating; it never fails the store's write."""
        if self._broken:
            return
        out: list[RoundMetrics] = []
        try:
            with self._lock:
                if table == "events":
                    for row in rows:
                        out.extend(self._event(row))
                elif table in ("rollouts", "agent_calls"):
                    self._count(table, rows)
                else:
                    return
                self.version += 1
        except Exception:
            self._broken = True
            log.exception("live run status stopped updating (the run continues)")
            return
        if publish:
            for m in out:
                for fn in self._subscribers:
                    fn(m)

    def _count(self, table: str, rows: list[dict[str, Any]]) -> None:
        s = self._spend
        for r in rows:
            if table == "agent_calls" and r.get("role") == "solver":
                continue
            s.tokens += int(r.get("input_tokens") or 0) + int(r.get("output_tokens") or 0)
            if r.get("cost_usd") is None:
                s.unpriced += 1
            else:
                s.cost_usd += float(r["cost_usd"])

    def _event(self, row: dict[str, Any]) -> list[RoundMetrics]:
        kind = str(row.get("kind") or "")
        if self._plugin is None:
            owner = methods.plugin_owning_event(kind)
            if owner is None:
                return []  # a run-level record (embedder.loaded, tasks_skipped, ...)
            self._use(owner)
        if self._view is None or not self._plugin.owns_event(kind):
            return []
        return self._view.observe(row)

    # ------------------------------------------------------------------ reading
    def _executions_used(self) -> int:
        return int(getattr(self.budget, "executions_used", 0) or 0)

    def spend(self) -> Spend:
        with self._lock:
            s = Spend(**vars(self._spend))
        s.executions_used = self._executions_used()
        s.executions_budget = getattr(self.budget, "executions", None)
        return s

    def _spend_metrics(self) -> dict[str, float]:
        s = self.spend()
        return {"spend/tokens": float(s.tokens), "spend/usd": s.cost_usd, "executions_used": float(s.executions_used)}

    def _rounds_done(self) -> int | None:
        return None if self._view is None else self._view.rounds_done()

    def eta_s(self) -> float | None:
        """Seconds until the run's nearest known end: its time limit, its execution
        budget at this session's rate, or ``max_rounds`` at this session's pace."""
        now = self._clock()
        elapsed = max(now - self._t0, 1e-9)
        bounds: list[float] = []
        if self.deadline is not None:
            bounds.append(max(self.deadline - now, 0.0))
        cap = getattr(self.budget, "executions", None)
        used = self._executions_used()
        done = used - self._exec0
        if cap is not None and done > 0:
            bounds.append(max(cap - used, 0) / (done / elapsed))
        with self._lock:
            fewest = self._rounds_done()
        if self.max_rounds is not None and fewest is not None and fewest - (self._round0 or 0) > 0:
            bounds.append(max(self.max_rounds - fewest, 0) * elapsed / (fewest - (self._round0 or 0)))
        return min(bounds) if bounds else None

    def lines(self) -> list[str]:
        """The status as plain text lines (the method's lines, then the run line)."""
        with self._lock:
            out = [] if self._view is None else list(self._view.lines())
            head = None if self._view is None else self._view.headline()
        s = self.spend()
        usd = f"${s.cost_usd:.4f}" + (f" (+{s.unpriced} unpriced)" if s.unpriced else "")
        cap = "" if s.executions_budget is None else f"/{s.executions_budget}"
        out.append(f"run  {head or 'best -'}  spend {s.tokens:,} tokens {usd}  executions {s.executions_used}{cap}  "
                   f"eta {fmt_duration(self.eta_s())}")
        return out
