"""SSR's decisions as typed events (DESIGN §5.11: state is a projection of events).

Every decision of a round is one ``events`` row whose payload is one of the
dataclasses below: the parent the round starts from (``ssr.round``), each judged
record (``ssr.judged``), the evidence order (``ssr.refresh``), each optimizer answer
(``ssr.candidate``, the child's source in the blob store), the children that race
(``ssr.candidates``), each race stage and its result (``ssr.stage``,
``ssr.stage_result``), the selection (``ssr.selection``), a role cap that stopped
the run (``ssr.role_budget``), the stop and the summary (the last three are the events
every method shares, :mod:`milo_ray.search.events`). :mod:`milo_ray.ssr.state` folds
them back into what a resumed run must not decide (or pay for) again.

Two fields of every event are ``events`` columns, not payload: ``round`` and
``harness_id`` (the round's parent, except for ``ssr.selection``, where it is the
selected harness). Everything else is the JSON payload, written and read by the one
codec of :mod:`milo_ray.search.events`, which names the kind and the field on a
payload it cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from milo_ray.search.events import Event, EventTypes, RoleBudget, Stopped, Summarized

COLUMNS = ("round", "harness_id")


@dataclass(frozen=True)
class SSREvent(Event):
    """Base of SSR's own events: ``round`` and ``harness_id`` are table columns, and a
    payload key no field names is an error."""

    column_fields: ClassVar[tuple[str, ...]] = COLUMNS


@dataclass(frozen=True)
class ResumeMarker(SSREvent):
    kind: ClassVar[str] = "ssr.resume"
    note: str = ""
    round: int | None = None
    harness_id: str | None = None


@dataclass(frozen=True)
class RoundStarted(SSREvent):
    """Round ``round`` starts from parent ``harness_id`` after ``stall`` rounds without
    strict improvement, with ``executions_used`` of the budget spent."""

    kind: ClassVar[str] = "ssr.round"
    round: int
    harness_id: str
    stall: int
    executions_used: int


@dataclass(frozen=True)
class Judged(SSREvent):
    """One judged training trajectory of the parent (``harness_id``). The event is the
    record; the ``experience`` row (verdict + embedding) is derived from it."""

    kind: ClassVar[str] = "ssr.judged"
    round: int
    harness_id: str
    task_id: str
    score: float
    resolved: bool
    w: float | None = None
    a: float | None = None
    u: float | None = None
    summary: str = ""
    suggestions: list[str] = field(default_factory=list)
    insights: str = ""
    failure_modes: list[str] = field(default_factory=list)
    mechanisms: list[str] = field(default_factory=list)
    trace_ref: str | None = None
    judge_error: str | None = None
    attempts: int = 0


@dataclass(frozen=True)
class Refreshed(SSREvent):
    """The parent's training refresh, judged and ordered: ``order`` is the evidence
    order (RER permutation or an ablation's) the round's candidates draw from."""

    kind: ClassVar[str] = "ssr.refresh"
    round: int
    harness_id: str
    tasks: int
    resolved: int
    mean_score: float
    judge_failures: list[str]
    order: list[str]
    ordering: str
    executions_used: int


@dataclass(frozen=True)
class RefreshUnaffordable(SSREvent):
    kind: ClassVar[str] = "ssr.refresh_unaffordable"
    round: int
    harness_id: str
    needed: int
    remaining: float


@dataclass(frozen=True)
class RefreshAborted(SSREvent):
    kind: ClassVar[str] = "ssr.refresh_aborted"
    round: int
    harness_id: str
    reason: str
    finished: int


@dataclass(frozen=True)
class CandidateDrawn(SSREvent):
    """One optimizer answer: candidate ``index``, draw ``draw`` (0, then one per
    duplicate re-draw). ``child_id``/``source_ref``/``name`` identify the child (its
    files are the ``source_ref`` blob), or ``error`` says why there is none or why it
    is invalid. How long the call took is in its ``agent_calls`` row, not here: a
    replayed answer must equal its record."""

    kind: ClassVar[str] = "ssr.candidate"
    round: int
    harness_id: str
    index: int
    draw: int
    scale: int
    seed: int
    child_id: str | None
    source_ref: str | None
    name: str | None
    error: str | None
    report: str = ""


@dataclass(frozen=True)
class CandidatesChosen(SSREvent):
    """The round's M children (the last draw of each) and those that race."""

    kind: ClassVar[str] = "ssr.candidates"
    round: int
    harness_id: str
    generated: list[dict[str, Any]]
    racing: list[str]
    evidence: str


@dataclass(frozen=True)
class StageStarted(SSREvent):
    """``racing.StageRequest.payload()``: the stage batch and who runs it."""

    kind: ClassVar[str] = "ssr.stage"
    round: int
    harness_id: str
    stage: int
    batch: dict[str, Any]
    harnesses: list[str]
    executions: int


@dataclass(frozen=True)
class StageAborted(SSREvent):
    kind: ClassVar[str] = "ssr.stage_aborted"
    round: int
    stage: int
    reason: str
    harness_id: str | None = None


@dataclass(frozen=True)
class StageResult(SSREvent):
    """``racing.StageReport.payload()``: cumulative scores and eliminations."""

    kind: ClassVar[str] = "ssr.stage_result"
    round: int
    harness_id: str
    stage: int
    scores: dict[str, float]
    eliminated: list[str]
    survivors: list[str]
    cumulative_tasks: int


@dataclass(frozen=True)
class Selection(SSREvent):
    """``racing.RaceOutcome.payload()``: the verdict (``harness_id`` is the selected
    harness, the new parent when ``replaced``)."""

    kind: ClassVar[str] = "ssr.selection"
    round: int
    harness_id: str
    parent_id: str
    selected: str
    replaced: bool
    completed_stages: int
    stop_reason: str
    parent_score: float | None
    best_child: str | None
    best_child_score: float | None
    executions: int
    scores: dict[str, float] = field(default_factory=dict)


SSR_EVENTS = EventTypes("ssr", (ResumeMarker, RoundStarted, Judged, Refreshed, RefreshUnaffordable, RefreshAborted,
                                 CandidateDrawn, CandidatesChosen, StageStarted, StageAborted, StageResult, Selection,
                                 RoleBudget, Stopped, Summarized))
REGISTRY: dict[str, type[Event]] = SSR_EVENTS.classes()


def parse(kind: str, payload: Mapping[str, Any] | None, **columns: Any) -> Event | None:
    """The typed event of an ``events`` row, or None for a kind of another namespace
    (other methods' events, run-level records such as ``embedder.loaded``)."""
    if not SSR_EVENTS.owns(kind):
        return None
    return SSR_EVENTS.decode(kind, payload, **{c: v for c, v in columns.items() if c in COLUMNS})
