"""What a run is doing right now, for the progress display and experiment tracking.

:class:`RunStatus` is fed by the run store's append listener (``store.add_listener``):
it sees every ``events`` row the method writes (MILO's and SSR's typed events, decoded
by their :class:`~milo_ray.search.events.EventTypes`, MILO's projected through the same
:class:`~milo_ray.milo.state.MiloState` the loop uses, so the values shown are the run's own) and every
``rollouts`` / ``agent_calls`` row (spend). No method calls it and it makes no Ray call:
the store already runs on the driver.

Subscribers (:meth:`RunStatus.subscribe`) get one :class:`RoundMetrics` when a round
closes: a MILO island's ``milo.progress`` event, an SSR round's ``ssr.selection``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from milo_ray.execution.progress import fmt_duration
from milo_ray.milo.events import MILO_EVENTS, Progress
from milo_ray.milo.state import MiloState
from milo_ray.search.events import Event, Stopped
from milo_ray.ssr.events import SSR_EVENTS, CandidatesChosen, RoundStarted, Selection, StageResult, StageStarted

log = logging.getLogger(__name__)


@dataclass
class IslandStatus:
    """One MILO island: its mutator, rounds closed, best search accuracy of its admitted
    harnesses, best held-out accuracy, and rounds without a held-out gain."""

    island: int
    mutator: str | None
    round: int
    best_search: float | None
    best_heldout: float | None
    stall: int


@dataclass
class RaceStatus:
    """The SSR round in progress: its parent, the race stage, the children still racing
    (of those that entered) and the parent's latest cumulative race score."""

    round: int
    parent: str
    stall: int
    stage: int = 0
    surviving: int = 0
    racing: int = 0
    parent_score: float | None = None
    incumbent_score: float | None = None
    stopped: str | None = None


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


@dataclass
class RoundMetrics:
    """A closed round's numbers as a tracker logs them: ``step`` is the round (MILO's
    run-wide numbers use the count of rounds closed on any island, so their history is
    ordered), ``time`` the closing event's wall-clock time."""

    method: str
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    time: float | None = None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


class RunStatus:
    """Live per-island / per-race status plus run-wide best, spend and ETA.

    ``budget``: the run's :class:`~milo_ray.execution.budget.BudgetLedger` (executions
    used against the cap); ``deadline``: the run's ``time.monotonic()`` deadline;
    ``max_rounds``: MILO's per-island round limit. Each, when known, bounds the ETA.
    """

    def __init__(self, *, budget: Any = None, deadline: float | None = None, max_rounds: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget, self.deadline, self.max_rounds = budget, deadline, max_rounds
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.RLock()
        self._subscribers: list[Callable[[RoundMetrics], None]] = []
        self.method: str | None = None
        self._milo: Any = None  # a MiloState, built on the first milo.* event
        self._closes = 0  # MILO: rounds closed on any island (milo.progress events)
        self._race: RaceStatus | None = None
        self._spend = Spend()
        self._exec0 = self._executions_used()  # executions used when this session started
        self._round0: int | None = None  # MILO: fewest rounds closed when this session started (resume)
        self.version = 0  # bumped on every change the display shows
        self._broken = False

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
        self._round0 = self._fewest_rounds()

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
        if MILO_EVENTS.owns(kind):
            return self._milo_event(MILO_EVENTS.decode_row(row), row)
        if SSR_EVENTS.owns(kind):
            m = self._ssr_event(SSR_EVENTS.decode_row(row), row)
            return [] if m is None else [m]
        return []

    def _milo_event(self, ev: Event, row: dict[str, Any]) -> list[RoundMetrics]:
        if self._milo is None:
            self.method, self._milo = "milo", MiloState()
        self._milo.apply(ev)
        if not isinstance(ev, Progress):
            return []
        self._closes += 1
        isl = self._island(ev.island)
        metrics = {f"island{isl.island}/stall": float(isl.stall), f"island{isl.island}/round": float(isl.round)}
        if isl.best_search is not None:
            metrics[f"island{isl.island}/best_search_accuracy"] = isl.best_search
        if isl.best_heldout is not None:
            metrics[f"island{isl.island}/heldout_accuracy"] = isl.best_heldout
        best = self._milo_best()
        run = {k: best[k] for k in ("best_search_accuracy", "best_heldout_accuracy") if best[k] is not None}
        t = row.get("time")
        return [RoundMetrics("milo", ev.rounds_done, metrics, t),
                RoundMetrics("milo", self._closes, {**run, "rounds_closed": float(self._closes),
                                                    **self._spend_metrics()}, t)]

    def _ssr_event(self, ev: Event, row: dict[str, Any]) -> RoundMetrics | None:
        self.method = "ssr"
        race = self._race
        if isinstance(ev, RoundStarted):
            keep = race.incumbent_score if race is not None else None
            self._race = RaceStatus(ev.round, ev.harness_id, ev.stall, incumbent_score=keep)
        elif race is None:
            return None
        elif isinstance(ev, CandidatesChosen):
            race.racing = race.surviving = len(ev.racing)
        elif isinstance(ev, StageStarted):
            race.stage = ev.stage
        elif isinstance(ev, StageResult):
            race.stage, race.surviving = ev.stage, len(ev.survivors)
            race.parent_score = ev.scores.get(race.parent, race.parent_score)
        elif isinstance(ev, Selection):
            race.parent_score = ev.parent_score if ev.parent_score is not None else race.parent_score
            race.incumbent_score = ev.best_child_score if ev.replaced else race.parent_score
            metrics = {"replaced": float(ev.replaced), "completed_stages": float(ev.completed_stages)}
            for key, value in (("parent_score", ev.parent_score), ("best_child_score", ev.best_child_score),
                               ("incumbent_score", race.incumbent_score)):
                if value is not None:
                    metrics[key] = float(value)
            return RoundMetrics("ssr", ev.round, {**metrics, **self._spend_metrics()}, row.get("time"))
        elif isinstance(ev, Stopped):
            race.stopped = ev.reason
        return None

    # ------------------------------------------------------------------ reading
    def _island(self, j: int) -> IslandStatus:
        st = self._milo
        isl = st.islands[j]
        scored = [n.accuracy for n in isl.lineage.admitted() if n.accuracy is not None]
        best = isl.best()
        rounds, stall = st.progress.get(j, (0, 0))
        return IslandStatus(j, st.assignment.get(j), rounds, max(scored, default=None),
                            None if best is None else best.val_accuracy, stall)

    def islands(self) -> list[IslandStatus]:
        with self._lock:
            return [] if self._milo is None else [self._island(j) for j in sorted(self._milo.islands)]

    def race(self) -> RaceStatus | None:
        with self._lock:
            return None if self._race is None else RaceStatus(**vars(self._race))

    def _milo_best(self) -> dict[str, Any]:
        rows = [self._island(j) for j in sorted(self._milo.islands)]
        search = [(i.best_search, i.island) for i in rows if i.best_search is not None]
        held = [(i.best_heldout, i.island) for i in rows if i.best_heldout is not None]
        s, h = max(search, default=(None, None)), max(held, default=(None, None))
        return {"best_search_accuracy": s[0], "best_search_island": s[1],
                "best_heldout_accuracy": h[0], "best_heldout_island": h[1]}

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
        out = {"spend/tokens": float(s.tokens), "spend/usd": s.cost_usd, "executions_used": float(s.executions_used)}
        return out

    def _fewest_rounds(self) -> int | None:
        if self._milo is None or not self._milo.progress:
            return None
        return min(r for r, _ in self._milo.progress.values())

    def eta_s(self) -> float | None:
        """Seconds until the run's nearest known end: its time limit, its execution
        budget at this session's rate, or MILO's ``max_rounds`` at this session's pace."""
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
            fewest = self._fewest_rounds()
        if self.max_rounds is not None and fewest is not None and fewest - (self._round0 or 0) > 0:
            bounds.append(max(self.max_rounds - fewest, 0) * elapsed / (fewest - (self._round0 or 0)))
        return min(bounds) if bounds else None

    def lines(self) -> list[str]:
        """The status as plain text lines (one per island or race, then the run line)."""
        with self._lock:
            method = self.method
            islands = self.islands() if method == "milo" else []
            race = self.race()
            best = self._milo_best() if method == "milo" and self._milo.islands else None
        out: list[str] = []
        for i in islands:
            out.append(f"island {i.island}  mutator {i.mutator or '-'}  round {i.round}  best search "
                       f"{_fmt(i.best_search)}  held-out {_fmt(i.best_heldout)}  stall {i.stall}")
        if race is not None:
            state = f"  stopped ({race.stopped})" if race.stopped else ""
            out.append(f"ssr round {race.round}  stage {race.stage}  surviving {race.surviving}/{race.racing}  "
                       f"parent {race.parent[:12]} score {_fmt(race.parent_score)}  stall {race.stall}{state}")
        s = self.spend()
        if best is not None:
            head = (f"best held-out {_fmt(best['best_heldout_accuracy'])} (island {best['best_heldout_island']})  "
                    f"search {_fmt(best['best_search_accuracy'])} (island {best['best_search_island']})")
        elif race is not None:
            head = f"incumbent score {_fmt(race.incumbent_score)}"
        else:
            head = "best -"
        usd = f"${s.cost_usd:.4f}" + (f" (+{s.unpriced} unpriced)" if s.unpriced else "")
        cap = "" if s.executions_budget is None else f"/{s.executions_budget}"
        out.append(f"run  {head}  spend {s.tokens:,} tokens {usd}  executions {s.executions_used}{cap}  "
                   f"eta {fmt_duration(self.eta_s())}")
        return out
