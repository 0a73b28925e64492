"""MILO's typed events: one frozen dataclass per ``events`` row kind a MILO run writes.

Owns the event classes, their JSON payload codec (:meth:`MiloEvent.to_payload`,
:meth:`MiloEvent.from_payload`) and :data:`EVENT_TYPES`, the registry from a stored
``kind`` string to its class (:func:`decode`). The kind strings and payload keys are
the on-disk format of every run directory written so far (resume reads them back):
they never change; a new field gets a default so older payloads still decode.

Applying events is :mod:`milo_ray.milo.state`'s job; here they are plain data.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from milo_ray.milo.lineage import LineageNode


class UnknownEvent(ValueError):
    """A stored ``milo.*`` kind no event class is registered for."""


def _int_keys(d: Mapping[Any, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}


def _str_keys(d: Mapping[int, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in d.items()}


@dataclass(frozen=True)
class MiloEvent(ABC):
    """Base of every MILO event. Subclasses set ``kind`` (the stored string)."""

    kind: ClassVar[str] = ""

    @abstractmethod
    def to_payload(self) -> dict[str, Any]:
        """The JSON payload stored in the ``events`` row."""

    @classmethod
    @abstractmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "MiloEvent":
        """The event a stored payload records (payloads of older runs included)."""


@dataclass(frozen=True)
class SeedScore:
    """A seed harness's search-split evaluation at initialization (every seed, placed or not)."""

    name: str
    harness_id: str
    accuracy: float
    fitness: list[float]
    costs: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "harness_id": self.harness_id, "accuracy": self.accuracy,
                "fitness": list(self.fitness), "costs": dict(self.costs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SeedScore":
        return cls(str(d.get("name") or ""), str(d["harness_id"]), float(d["accuracy"]),
                   [float(x) for x in d.get("fitness") or []], dict(d.get("costs") or {}))


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

    def to_payload(self) -> dict[str, Any]:
        return {"search_tasks": list(self.search_tasks), "val_tasks": list(self.val_tasks),
                "task_pool": list(self.task_pool), "islands": list(self.islands),
                "assignment": _str_keys(self.assignment), "seeds": [s.to_dict() for s in self.seeds],
                "members": {str(j): [[nid, int(i)] for nid, i in m] for j, m in self.members.items()}}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Init":
        return cls([str(t) for t in p["search_tasks"]], [str(t) for t in p["val_tasks"]],
                   [str(t) for t in p["task_pool"]], [int(j) for j in p["islands"]],
                   {j: str(m) for j, m in _int_keys(p["assignment"]).items()},
                   [SeedScore.from_dict(s) for s in p.get("seeds", [])],
                   {j: [(str(nid), int(i)) for nid, i in m] for j, m in _int_keys(p.get("members", {})).items()})


@dataclass(frozen=True)
class NodeRecorded(MiloEvent):
    """A node joins an island's tree: a seed, a mutation's or a graft's child (admitted
    or not). The node is the record; the ``harnesses`` row is derived from it."""

    kind: ClassVar[str] = "milo.node"
    node: LineageNode

    def to_payload(self) -> dict[str, Any]:
        return {"node": self.node.to_dict()}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "NodeRecorded":
        return cls(LineageNode.from_dict(copy.deepcopy(dict(p["node"]))))


@dataclass(frozen=True)
class HeldOut(MiloEvent):
    """A node's held-out (B_val) score."""

    kind: ClassVar[str] = "milo.heldout"
    island: int
    node_id: str
    val_accuracy: float

    def to_payload(self) -> dict[str, Any]:
        return {"island": self.island, "node_id": self.node_id, "val_accuracy": self.val_accuracy}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "HeldOut":
        return cls(int(p["island"]), str(p["node_id"]), float(p["val_accuracy"]))


@dataclass(frozen=True)
class Progress(MiloEvent):
    """Island j closed round ``rounds_done`` (or a graft reset its stall) with stall ``stall``."""

    kind: ClassVar[str] = "milo.progress"
    island: int
    rounds_done: int
    stall: int

    def to_payload(self) -> dict[str, Any]:
        return {"island": self.island, "rounds_done": self.rounds_done, "stall": self.stall}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Progress":
        return cls(int(p["island"]), int(p["rounds_done"]), int(p["stall"]))


@dataclass(frozen=True)
class Reassign(MiloEvent):
    kind: ClassVar[str] = "milo.reassign"
    island: int
    mutator: str
    decision_id: str

    def to_payload(self) -> dict[str, Any]:
        return {"island": self.island, "mutator": self.mutator, "decision_id": self.decision_id}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Reassign":
        return cls(int(p["island"]), str(p["mutator"]), str(p["decision_id"]))


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
    index: int | None = None

    def to_payload(self) -> dict[str, Any]:
        p = {"island": self.island, "from_island": self.from_island, "node_id": self.node_id,
             "mutator": self.mutator, "decision_id": self.decision_id}
        if self.index is not None:
            p["index"] = self.index
        return p

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "IslandFounded":
        return cls(int(p["island"]), int(p["from_island"]), str(p["node_id"]), str(p["mutator"]),
                   str(p["decision_id"]), None if p.get("index") is None else int(p["index"]))


@dataclass(frozen=True)
class CurriculumChanged(MiloEvent):
    kind: ClassVar[str] = "milo.curriculum"
    version: int
    tasks: list[str]
    decision_id: str

    def to_payload(self) -> dict[str, Any]:
        return {"version": self.version, "tasks": list(self.tasks), "decision_id": self.decision_id}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "CurriculumChanged":
        return cls(int(p["version"]), [str(t) for t in p["tasks"]], str(p["decision_id"]))


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

    def to_payload(self) -> dict[str, Any]:
        return {"island": self.island, "node_id": self.node_id, "changes": copy.deepcopy(self.changes)}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Refit":
        return cls(int(p["island"]), str(p["node_id"]), copy.deepcopy(dict(p["changes"])))


@dataclass(frozen=True)
class Decision(MiloEvent):
    """A validated orchestrator decision (``decision`` as ``validate_decision`` returns it)."""

    kind: ClassVar[str] = "milo.decision"
    decision_id: str
    trigger: int
    round: int
    decision: dict[str, Any]

    def to_payload(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id, "trigger": self.trigger, "round": self.round,
                "decision": copy.deepcopy(self.decision)}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Decision":
        return cls(str(p["decision_id"]), int(p["trigger"]), int(p["round"]), copy.deepcopy(dict(p["decision"])))


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

    def to_payload(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id, "trigger": self.trigger, "round": self.round, "error": self.error,
                "raw": copy.deepcopy(self.raw), "first_error": self.first_error,
                "first_raw": copy.deepcopy(self.first_raw)}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "DecisionInvalid":
        first = p.get("first_error")
        return cls(str(p["decision_id"]), int(p["trigger"]), int(p["round"]), str(p["error"]),
                   copy.deepcopy(p.get("raw")), None if first is None else str(first), copy.deepcopy(p.get("first_raw")))


@dataclass(frozen=True)
class MoveDone(MiloEvent):
    kind: ClassVar[str] = "milo.move_done"
    decision_id: str
    index: int
    move: str  # stored as "kind": reassign | speciate | recombine | curriculum

    def to_payload(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id, "index": self.index, "kind": self.move}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "MoveDone":
        return cls(str(p["decision_id"]), int(p["index"]), str(p["kind"]))


@dataclass(frozen=True)
class MoveFailed(MiloEvent):
    """A move that could not be carried out (a record; it changes no state)."""

    kind: ClassVar[str] = "milo.move_failed"
    decision_id: str
    index: int
    error: str

    def to_payload(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id, "index": self.index, "error": self.error}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "MoveFailed":
        return cls(str(p["decision_id"]), int(p["index"]), str(p["error"]))


@dataclass(frozen=True)
class InterventionDone(MiloEvent):
    kind: ClassVar[str] = "milo.intervention_done"
    decision_id: str

    def to_payload(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "InterventionDone":
        return cls(str(p["decision_id"]))


@dataclass(frozen=True)
class Step(MiloEvent):
    """Lock-step: the islands (and their round) of the step about to run."""

    kind: ClassVar[str] = "milo.step"
    rounds: dict[int, int]

    def to_payload(self) -> dict[str, Any]:
        return {"rounds": {str(j): int(r) for j, r in self.rounds.items()}}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Step":
        return cls({j: int(r) for j, r in _int_keys(p["rounds"]).items()})


@dataclass(frozen=True)
class RoleBudget(MiloEvent):
    """An agent role reached its cap (``run.budget.roles.<role>``, or the run's token/USD
    budget): no new work of that role starts from here on."""

    kind: ClassVar[str] = "milo.role_budget"
    role: str
    reason: str

    def to_payload(self) -> dict[str, Any]:
        return {"role": self.role, "reason": self.reason}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "RoleBudget":
        return cls(str(p["role"]), str(p["reason"]))


@dataclass(frozen=True)
class Stopped(MiloEvent):
    """The search ended (a record): ``finished`` or why it stopped early."""

    kind: ClassVar[str] = "milo.stop"
    reason: str

    def to_payload(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Stopped":
        return cls(str(p["reason"]))


@dataclass(frozen=True)
class Summarized(MiloEvent):
    """The run's summary dict (a record; its payload is the summary itself)."""

    kind: ClassVar[str] = "milo.summary"
    summary: dict[str, Any]

    def to_payload(self) -> dict[str, Any]:
        return copy.deepcopy(self.summary)

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> "Summarized":
        return cls(copy.deepcopy(dict(p)))


EVENT_TYPES: dict[str, type[MiloEvent]] = {
    c.kind: c for c in (Init, NodeRecorded, HeldOut, Progress, Reassign, IslandFounded, CurriculumChanged, Refit,
                        Decision, DecisionInvalid, MoveDone, MoveFailed, InterventionDone, Step, RoleBudget,
                        Stopped, Summarized)
}


def decode(kind: str, payload: Mapping[str, Any] | None) -> MiloEvent:
    """The typed event of one stored row; an unregistered ``milo.*`` kind is an error
    (a run directory written by a newer version, or a corrupted row), never skipped."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise UnknownEvent(f"events row kind {kind!r}: not a MILO event kind (known: {', '.join(sorted(EVENT_TYPES))})")
    try:
        return cls.from_payload(payload or {})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"events row kind {kind!r}: malformed payload ({type(e).__name__}: {e})") from e
