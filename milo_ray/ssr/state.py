"""What an SSR run has already decided: the projection of its ``ssr.*`` events.

A resumed run re-walks its deterministic procedure (rollouts come back from the
scheduler's cache) and asks :class:`RecordedRun` before every paid step: a judged
record, an evidence order or an optimizer answer found here is read back instead of
asked for again, so resume never repeats a judge or optimizer call (DESIGN §5.11).
Race stages are checked against their records as they are replayed: a resumed run
that would race differently from what it recorded stops with an error instead of
writing a second, different history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from milo_ray.search.events import Event, EventLog
from milo_ray.ssr.events import (SSR_EVENTS, CandidateDrawn, CandidatesChosen, Judged, Refreshed, RoleBudget,
                                 RoundStarted, Selection, StageResult, StageStarted)


class ResumeDiverged(RuntimeError):
    """The replayed procedure asked for a decision other than the recorded one (a
    different config, seed or benchmark on the same run directory)."""


@dataclass
class RoundRecord:
    """The recorded decisions of one round."""

    round: int
    started: RoundStarted | None = None
    judged: dict[str, Judged] = field(default_factory=dict)  # task_id -> record
    refresh: Refreshed | None = None
    draws: dict[tuple[int, int], CandidateDrawn] = field(default_factory=dict)  # (index, draw) -> answer
    candidates: CandidatesChosen | None = None
    stages: dict[int, StageStarted] = field(default_factory=dict)
    results: dict[int, StageResult] = field(default_factory=dict)
    selection: Selection | None = None


@dataclass
class RecordedRun:
    """Every round's recorded decisions plus the run-level ones, folded in ``seq`` order."""

    rounds: dict[int, RoundRecord] = field(default_factory=dict)
    role_budget: RoleBudget | None = None

    def round(self, rnd: int) -> RoundRecord:
        """The round's record (empty when nothing of it was recorded yet); events applied
        later land in this same object."""
        return self.rounds.setdefault(rnd, RoundRecord(rnd))

    def apply(self, ev: Event) -> None:
        rnd = getattr(ev, "round", None)
        rec = self.rounds.setdefault(rnd, RoundRecord(rnd)) if rnd is not None else None
        if isinstance(ev, RoundStarted):
            rec.started = ev
        elif isinstance(ev, Judged):
            rec.judged[ev.task_id] = ev
        elif isinstance(ev, Refreshed):
            rec.refresh = ev
        elif isinstance(ev, CandidateDrawn):
            rec.draws[(ev.index, ev.draw)] = ev
        elif isinstance(ev, CandidatesChosen):
            rec.candidates = ev
        elif isinstance(ev, StageStarted):
            rec.stages[ev.stage] = ev
        elif isinstance(ev, StageResult):
            rec.results[ev.stage] = ev
        elif isinstance(ev, Selection):
            rec.selection = ev
        elif isinstance(ev, RoleBudget):
            self.role_budget = ev

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]]) -> "RecordedRun":
        """Fold ``events`` rows (any order; applied by ``seq``); other namespaces' rows are skipped."""
        out = cls()
        for ev in SSR_EVENTS.decode_rows(rows):
            out.apply(ev)
        return out

    @classmethod
    def from_store(cls, store: Any) -> "RecordedRun":
        out = cls()
        EventLog(store, SSR_EVENTS).replay(out.apply)
        return out


def check_parent(rec: RoundRecord, parent_id: str) -> None:
    """The replayed round starts from the recorded parent, or the resume has diverged."""
    if rec.started is not None and rec.started.harness_id != parent_id:
        raise ResumeDiverged(f"round {rec.round}: recorded parent {rec.started.harness_id[:12]}, replay reached "
                             f"{parent_id[:12]}; resume with the config and seed the run was started with")


def check_stage(rec: RoundRecord, replayed: StageStarted | StageResult) -> None:
    """A replayed race stage (its batch and runners, or its result) equals the recorded
    one: the race is deterministic given its inputs and the cached rewards."""
    old = (rec.stages if isinstance(replayed, StageStarted) else rec.results).get(replayed.stage)
    if old is not None and old.to_payload() != replayed.to_payload():
        raise ResumeDiverged(f"round {rec.round}: {replayed.kind} of stage {replayed.stage} was recorded as "
                             f"{old.to_payload()}, the replayed race gives {replayed.to_payload()}")
