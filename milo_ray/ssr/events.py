"""SSR's decisions as typed events (DESIGN §5.11: state is a projection of events).

Every decision of a round is one ``events`` row whose payload is one of the
dataclasses below: the parent the round starts from (``ssr.round``), each judged
record (``ssr.judged``), the evidence order (``ssr.refresh``), each optimizer answer
(``ssr.candidate``, the child's source in the blob store), the children that race
(``ssr.candidates``), each race stage and its result (``ssr.stage``,
``ssr.stage_result``), the selection (``ssr.selection``), a role cap that stopped
the run (``ssr.role_budget``) and the stop. :mod:`milo_ray.ssr.state` folds them
back into what a resumed run must not decide (or pay for) again.

Two fields of every event are ``events`` columns, not payload: ``round`` and
``harness_id`` (the round's parent, except for ``ssr.selection``, where it is the
selected harness). Everything else is the JSON payload, written by ``to_payload``
and read back by ``from_payload``, which names the kind and the field on a payload
it cannot read.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Mapping

COLUMNS = ("round", "harness_id")


@dataclass(frozen=True)
class SSREvent:
    """Base of every SSR event: ``round`` and ``harness_id`` are table columns."""

    kind: ClassVar[str] = ""

    def columns(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in COLUMNS if getattr(self, c, None) is not None}

    def to_payload(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in COLUMNS}

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], **columns: Any) -> "SSREvent":
        """The event from its payload and columns; ``ValueError`` names a missing or
        unknown field."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(payload) - names)
        if unknown:
            raise ValueError(f"{cls.kind} event: unknown payload field(s) {unknown}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            source = columns if f.name in COLUMNS else payload
            if f.name in source:
                values[f.name] = source[f.name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"{cls.kind} event: payload field {f.name!r} is missing")
        return cls(**values)


def _plain(v: Any) -> Any:
    """Tuples as lists, so a payload equals its JSON round trip (duplicate detection
    compares payload text)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


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


@dataclass(frozen=True)
class RoleBudget(SSREvent):
    """A role's cap (``run.budget.roles.<role>``) or the run's token/USD cap refused new
    work of ``role``: the run stops with the incumbent."""

    kind: ClassVar[str] = "ssr.role_budget"
    round: int
    harness_id: str
    role: str
    reason: str


@dataclass(frozen=True)
class Stopped(SSREvent):
    kind: ClassVar[str] = "ssr.stop"
    round: int
    harness_id: str
    reason: str
    rounds: int
    incumbent: str
    executions_used: int


REGISTRY: dict[str, type[SSREvent]] = {cls.kind: cls for cls in (
    ResumeMarker, RoundStarted, Judged, Refreshed, RefreshUnaffordable, RefreshAborted, CandidateDrawn,
    CandidatesChosen, StageStarted, StageAborted, StageResult, Selection, RoleBudget, Stopped)}


def parse(kind: str, payload: Mapping[str, Any] | None, **columns: Any) -> SSREvent | None:
    """The typed event of an ``events`` row, or None for a kind SSR does not project
    (``ssr.summary``, other methods' events)."""
    cls = REGISTRY.get(kind)
    if cls is None:
        return None
    return cls.from_payload(payload or {}, **{c: v for c, v in columns.items() if c in COLUMNS and v is not None})
