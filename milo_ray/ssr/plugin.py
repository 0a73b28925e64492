"""SSR as a method plugin (:mod:`milo_ray.search.plugin`): its config, roles, recorded
decisions as its state, the live race line, its report figures and decision table, and
its final-test setup.

The final test is the one the run recorded in its summary; runs written before that
record fall back to ``method.test_split`` / ``method.test_rollouts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from milo_ray.search.events import Event, Stopped
from milo_ray.search.plugin import MethodPlugin, ReportSection, ReportTable, RoundMetrics
from milo_ray.ssr.config import SSRConfig
from milo_ray.ssr.events import SSR_EVENTS, CandidatesChosen, RoundStarted, Selection, StageResult, StageStarted
from milo_ray.ssr.state import RecordedRun

ROLES = ("judge", "optimizer", "embedder")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


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


class SSRStatus:
    """The live SSR status: the race of the current round; a round's metrics when its
    selection is made."""

    def __init__(self, spend: Callable[[], dict[str, float]]) -> None:
        self._spend = spend
        self.race: RaceStatus | None = None

    def observe(self, row: Mapping[str, Any]) -> list[RoundMetrics]:
        ev = SSR_EVENTS.decode_row(row)
        race = self.race
        if isinstance(ev, RoundStarted):
            keep = race.incumbent_score if race is not None else None
            self.race = RaceStatus(ev.round, ev.harness_id, ev.stall, incumbent_score=keep)
        elif race is None:
            return []
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
            return [RoundMetrics("ssr", ev.round, {**metrics, **self._spend()}, row.get("time"))]
        elif isinstance(ev, Stopped):
            race.stopped = ev.reason
        return []

    def lines(self) -> list[str]:
        race = self.race
        if race is None:
            return []
        state = f"  stopped ({race.stopped})" if race.stopped else ""
        return [f"ssr round {race.round}  stage {race.stage}  surviving {race.surviving}/{race.racing}  "
                f"parent {race.parent[:12]} score {_fmt(race.parent_score)}  stall {race.stall}{state}"]

    def headline(self) -> str | None:
        return None if self.race is None else f"incumbent score {_fmt(self.race.incumbent_score)}"

    def rounds_done(self) -> int | None:
        return None  # SSR has no per-round limit: its budget and patience end it


class SSRPlugin(MethodPlugin):
    name = "ssr"
    method_class = "SSRMethod"
    schema = SSRConfig
    events = SSR_EVENTS

    def roles(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        return ROLES

    def project(self, events: Iterable[Event]) -> RecordedRun:
        run = RecordedRun()
        for e in events:
            run.apply(e)
        return run

    def status(self, spend: Callable[[], dict[str, float]]) -> SSRStatus:
        return SSRStatus(spend)

    def report_sections(self, res: Any) -> list[ReportSection]:
        from milo_ray.ssr.figures import figures, ssr_decisions  # matplotlib: only when a report is drawn

        figs, decisions = figures(res), ssr_decisions(res)
        if not figs and not len(decisions):
            return []
        return [ReportSection("ssr-figures", "SSR search",
                              "Evidence coverage, racing and budget of Successive Scale Racing (SSR §4).", figs,
                              [ReportTable("ssr-decisions-table", "Decisions per round", decisions)])]

    def test_setup(self, res: Any) -> tuple[str, int | None]:
        m = res.config.get("method") or {}
        k = m.get("test_rollouts")
        return str(m.get("test_split") or "test"), None if k is None else int(k)


PLUGIN = SSRPlugin()
