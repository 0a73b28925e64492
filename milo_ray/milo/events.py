"""MILO's typed events: one frozen dataclass per ``events`` row kind a MILO run writes.

Owns the event classes and :data:`MILO_EVENTS`, the registry from a stored ``kind``
string to its class (:func:`decode`). Their payloads are written and read by the one
codec of :mod:`milo_ray.search.events`; the kind strings and payload keys are the
on-disk format of every run directory written so far (resume reads them back): they
never change; a new field gets a default so older payloads still decode. The role cap,
the stop and the summary are the events every method shares, stored as
``milo.role_budget``, ``milo.stop`` and ``milo.summary``.

Applying events is :mod:`milo_ray.milo.state`'s job; here they are plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from milo_ray.milo.lineage import LineageNode
from milo_ray.search.events import (Event, EventTypes, RoleBudget, Stopped, Summarized, UnknownEvent, absent_when_none,
                                    stored_as)

__all__ = ["MiloEvent", "SeedScore", "Init", "NodeRecorded", "HeldOut", "Progress", "Reassign", "IslandFounded",
           "CurriculumChanged", "Refit", "Decision", "DecisionInvalid", "MoveDone", "MoveFailed", "InterventionDone",
           "Step", "RoleBudget", "Stopped", "Summarized", "MILO_EVENTS", "EVENT_TYPES", "UnknownEvent", "decode"]


@dataclass(frozen=True)
class MiloEvent(Event):
    """Base of MILO's own events. Their payload keys are read leniently, as they always
    were: a key no field names is ignored."""

    ignore_unknown: ClassVar[bool] = True


@dataclass(frozen=True)
class SeedScore:
    """A seed harness's search-split evaluation at initialization (every seed, placed or not)."""

    name: str
    harness_id: str
    accuracy: float
    fitness: list[float]
    costs: dict[str, float]


@dataclass(frozen=True)
class Init(MiloEvent):
    """The run's start: B_search, B_val, the curriculum pool, the islands, m^(1), every
    seed's evaluation and which seeds (``(node id, index into the run's seeds)``) found
    which island."""

    kind: ClassVar[str] = "milo.init"
    search_tasks: list[str]
    val_tasks: list[str]
    task_pool: list[str]
    islands: list[int]
    assignment: dict[int, str]
    seeds: list[SeedScore] = field(default_factory=list)
    members: dict[int, list[tuple[str, int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeRecorded(MiloEvent):
    """A node joins an island's tree: a seed, a mutation's or a graft's child (admitted
    or not). The node is the record; the ``harnesses`` row is derived from it."""

    kind: ClassVar[str] = "milo.node"
    node: LineageNode


@dataclass(frozen=True)
class HeldOut(MiloEvent):
    """A node's held-out (B_val) score."""

    kind: ClassVar[str] = "milo.heldout"
    island: int
    node_id: str
    val_accuracy: float


@dataclass(frozen=True)
class Progress(MiloEvent):
    """Island j closed round ``rounds_done`` (or a graft reset its stall) with stall ``stall``."""

    kind: ClassVar[str] = "milo.progress"
    island: int
    rounds_done: int
    stall: int


@dataclass(frozen=True)
class Reassign(MiloEvent):
    kind: ClassVar[str] = "milo.reassign"
    island: int
    mutator: str
    decision_id: str


@dataclass(frozen=True)
class IslandFounded(MiloEvent):
    """Speciate: the subtree rooted at ``node_id`` moves from ``from_island`` to the new
    island ``island`` under ``mutator``; ``index`` is the move's index in its decision."""

    kind: ClassVar[str] = "milo.island"
    island: int
    from_island: int
    node_id: str
    mutator: str
    decision_id: str
    index: int | None = absent_when_none()  # absent in events stored before moves were indexed


@dataclass(frozen=True)
class CurriculumChanged(MiloEvent):
    kind: ClassVar[str] = "milo.curriculum"
    version: int
    tasks: list[str]
    decision_id: str


@dataclass(frozen=True)
class Refit(MiloEvent):
    """A node re-evaluated on the current B_search; ``changes`` are LineageNode fields."""

    kind: ClassVar[str] = "milo.refit"
    island: int
    node_id: str
    changes: dict[str, Any]

    def __post_init__(self) -> None:
        unknown = set(self.changes) - set(LineageNode.__dataclass_fields__)
        if unknown:
            raise ValueError(f"milo.refit changes: {sorted(unknown)} are not LineageNode fields")


@dataclass(frozen=True)
class Decision(MiloEvent):
    """A validated orchestrator decision (``decision`` as ``validate_decision`` returns it)."""

    kind: ClassVar[str] = "milo.decision"
    decision_id: str
    trigger: int
    round: int
    decision: dict[str, Any]


@dataclass(frozen=True)
class DecisionInvalid(MiloEvent):
    """An orchestrator answer the loop could not execute, after its one re-ask (or a
    failed call): the intervention is skipped. ``error``/``raw``: the last answer and why
    it was refused; ``first_error``/``first_raw``: the first answer when the orchestrator
    was re-asked (None otherwise, and in events stored before re-asks existed)."""

    kind: ClassVar[str] = "milo.decision_invalid"
    decision_id: str
    trigger: int
    round: int
    error: str
    raw: Any = None
    first_error: str | None = None
    first_raw: Any = None


@dataclass(frozen=True)
class MoveDone(MiloEvent):
    kind: ClassVar[str] = "milo.move_done"
    decision_id: str
    index: int
    move: str = stored_as("kind")  # reassign | speciate | recombine | curriculum


@dataclass(frozen=True)
class MoveFailed(MiloEvent):
    """A move that could not be carried out (a record; it changes no state)."""

    kind: ClassVar[str] = "milo.move_failed"
    decision_id: str
    index: int
    error: str


@dataclass(frozen=True)
class InterventionDone(MiloEvent):
    kind: ClassVar[str] = "milo.intervention_done"
    decision_id: str


@dataclass(frozen=True)
class Step(MiloEvent):
    """Lock-step: the islands (and their round) of the step about to run."""

    kind: ClassVar[str] = "milo.step"
    rounds: dict[int, int]


MILO_EVENTS = EventTypes("milo", (Init, NodeRecorded, HeldOut, Progress, Reassign, IslandFounded, CurriculumChanged,
                                   Refit, Decision, DecisionInvalid, MoveDone, MoveFailed, InterventionDone, Step,
                                   RoleBudget, Stopped, Summarized))
EVENT_TYPES: dict[str, type[Event]] = MILO_EVENTS.classes()


def decode(kind: str, payload: Mapping[str, Any] | None) -> Event:
    """The typed event of one stored row; an unregistered ``milo.*`` kind is an error
    (a run directory written by a newer version, or a corrupted row), never skipped."""
    try:
        return MILO_EVENTS.decode(kind, payload)
    except UnknownEvent:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"events row kind {kind!r}: malformed payload ({type(e).__name__}: {e})") from e
