"""MILO's run state as a pure projection of its typed events (DESIGN §5.11).

Owns :class:`MiloState`: the islands (plain :class:`~milo_ray.milo.island.Island`
objects holding :class:`~milo_ray.milo.lineage.LineageNode` trees), the curriculum,
the island -> mutator assignment, per-island progress and the orchestrator's
bookkeeping. :meth:`MiloState.apply` is the only way any of it changes: the run's
:class:`~milo_ray.search.events.EventLog` appends an event to the store and applies it
(``MiloRun.emit``), and a resumed run replays the stored events, in order, into a
fresh state. ``apply`` has no I/O, no Ray
and no clock, so the same events always give the same state.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

from milo_ray.milo.events import (CurriculumChanged, Decision, DecisionInvalid, HeldOut, Init, InterventionDone,
                                  IslandFounded, MoveDone, MoveFailed, NodeRecorded, Progress, Reassign,
                                  Refit, RoleBudget, SeedScore, Step, Stopped, Summarized)
from milo_ray.milo.island import Island
from milo_ray.milo.lineage import LineageNode
from milo_ray.search.events import Event

_HANDLERS: dict[type[Event], Callable[["MiloState", Any], None]] = {}


def _handles(*types: type[Event]) -> Callable[[Callable[["MiloState", Any], None]], Callable[["MiloState", Any], None]]:
    def register(fn: Callable[["MiloState", Any], None]) -> Callable[["MiloState", Any], None]:
        for t in types:
            _HANDLERS[t] = fn
        return fn

    return register


class MiloState:
    """Everything a MILO run knows, rebuilt from its events.

    ``eps`` and ``temperature`` configure the islands' admission and parent selection
    (they are config, not state: every island the events create gets them).
    """

    def __init__(self, *, eps: float = 0.02, temperature: float = 1.0) -> None:
        self.eps, self.temperature = float(eps), float(temperature)
        self.initialized = False
        self.islands: dict[int, Island] = {}
        self.node_island: dict[str, int] = {}  # node id -> the island holding it now
        self.recorded: dict[str, LineageNode] = {}  # node id -> the node as its milo.node event recorded it
        self.progress: dict[int, tuple[int, int]] = {}  # island -> (rounds done, stall)
        self.assignment: dict[int, str] = {}
        self.search_tasks: list[str] = []
        self.val_tasks: list[str] = []
        self.task_pool: list[str] = []
        self.version = 0  # curriculum version of search_tasks
        self.seed_scores: list[SeedScore] = []
        self.init_members: dict[int, list[tuple[str, int]]] = {}  # island -> (seed node id, seed index)
        self.decisions: dict[str, Decision] = {}
        self.moves_done: dict[str, set[int]] = {}
        self.decisions_done: set[str] = set()
        self.last_intervention: dict[int, int] = {}  # island -> rounds_done when it last triggered the orchestrator
        self.mutator_stats: dict[str, dict[str, int]] = {}
        self.val_gain: dict[str, bool] = {}  # node id -> whether its held-out score was a new island best
        self.speciations: dict[tuple[str, int], tuple[int, str]] = {}  # (decision, move) -> (new island, root)
        self.last_step: dict[int, int] = {}  # lock-step: island -> the round its latest step runs
        self.exhausted_roles: dict[str, str] = {}  # agent role -> why it may start no new work
        self.events_applied = 0

    # ------------------------------------------------------------------ applying
    def apply(self, event: Event) -> None:
        """Apply one event. Events are never mutated, so one event list can build any
        number of states."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"MiloState.apply: no handler for {type(event).__name__} "
                            f"(kind {getattr(event, 'kind', '?')!r}); register one with @_handles")
        handler(self, event)
        self.events_applied += 1

    @_handles(Init)
    def _init(self, e: Init) -> None:
        self.initialized = True
        self.search_tasks, self.val_tasks, self.task_pool = list(e.search_tasks), list(e.val_tasks), list(e.task_pool)
        self.seed_scores = list(e.seeds)
        self.init_members = {j: list(m) for j, m in e.members.items()}
        for j in e.islands:
            self._new_island(j)
        self.assignment.update(e.assignment)

    @_handles(NodeRecorded)
    def _node(self, e: NodeRecorded) -> None:
        n = e.node
        self.recorded[n.node_id] = copy.deepcopy(n)
        self.islands[n.island].add_node(copy.deepcopy(n))  # the island's copy is relabelled later
        self.node_island[n.node_id] = n.island
        if n.origin in ("mutation", "graft") and n.mutator:
            st = self.mutator_stats.setdefault(n.mutator, {"children": 0, "admitted": 0})
            st["children"] += 1
            st["admitted"] += int(bool(n.admitted))

    @_handles(HeldOut)
    def _heldout(self, e: HeldOut) -> None:
        # The island answers whether this is a new best; replay gives the same answer.
        self.val_gain[e.node_id] = bool(self.islands[e.island].record_val(e.node_id, e.val_accuracy))

    @_handles(Progress)
    def _progress(self, e: Progress) -> None:
        self.islands[e.island].set_progress(e.rounds_done, e.stall)
        self.progress[e.island] = (e.rounds_done, e.stall)

    @_handles(Reassign)
    def _reassign(self, e: Reassign) -> None:
        self.assignment[e.island] = e.mutator

    @_handles(IslandFounded)
    def _island(self, e: IslandFounded) -> None:
        moved = self.islands[e.from_island].detach_subtree(e.node_id)
        self._new_island(e.island)
        self.islands[e.island].adopt_subtree(moved)
        for n in moved:
            self.node_island[n.node_id] = e.island
        self.assignment[e.island] = e.mutator
        if e.index is not None:
            self.speciations[(e.decision_id, e.index)] = (e.island, e.node_id)

    @_handles(CurriculumChanged)
    def _curriculum(self, e: CurriculumChanged) -> None:
        self.version, self.search_tasks = e.version, list(e.tasks)

    @_handles(Refit)
    def _refit(self, e: Refit) -> None:
        self.islands[e.island].relabel(e.node_id, copy.deepcopy(e.changes))

    @_handles(Decision)
    def _decision(self, e: Decision) -> None:
        self.decisions[e.decision_id] = e
        self.moves_done.setdefault(e.decision_id, set())
        self.last_intervention[e.trigger] = e.round

    @_handles(DecisionInvalid)
    def _decision_invalid(self, e: DecisionInvalid) -> None:
        self.last_intervention[e.trigger] = e.round

    @_handles(MoveDone)
    def _move_done(self, e: MoveDone) -> None:
        self.moves_done.setdefault(e.decision_id, set()).add(e.index)

    @_handles(InterventionDone)
    def _intervention_done(self, e: InterventionDone) -> None:
        self.decisions_done.add(e.decision_id)

    @_handles(Step)
    def _step(self, e: Step) -> None:
        self.last_step = dict(e.rounds)

    @_handles(RoleBudget)
    def _role_budget(self, e: RoleBudget) -> None:
        self.exhausted_roles.setdefault(e.role, e.reason)

    @_handles(MoveFailed, Stopped, Summarized)
    def _record_only(self, e: Event) -> None:
        """Records for people and reports; the search's state does not depend on them."""

    def _new_island(self, j: int) -> None:
        if j not in self.islands:
            self.islands[j] = Island(j, eps=self.eps, temperature=self.temperature)
            self.progress.setdefault(j, (0, 0))

    # ------------------------------------------------------------------ reading
    def node(self, node_id: str) -> LineageNode:
        """A node as its island holds it now (relabels and speciation applied)."""
        try:
            return self.islands[self.node_island[node_id]].node(node_id)
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the run") from None

    def has_node(self, node_id: str) -> bool:
        return node_id in self.node_island

    def nodes(self) -> list[LineageNode]:
        return [n for j in sorted(self.islands) for n in self.islands[j].nodes()]

    def rounds_done(self, j: int) -> int:
        return self.progress[j][0]

    def stall(self, j: int) -> int:
        return self.progress[j][1]

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (equal states give equal snapshots)."""
        return {
            "initialized": self.initialized,
            "islands": {j: {"nodes": [n.to_dict() for n in isl.nodes()], "rounds_done": isl.rounds_done,
                            "stall": isl.stall, "best_val": isl.best_val, "best_val_node": isl.best_val_node}
                        for j, isl in sorted(self.islands.items())},
            "node_island": dict(self.node_island),
            "recorded": {k: n.to_dict() for k, n in self.recorded.items()},
            "progress": dict(self.progress), "assignment": dict(self.assignment),
            "search_tasks": list(self.search_tasks), "val_tasks": list(self.val_tasks),
            "task_pool": list(self.task_pool), "version": self.version,
            "seed_scores": [dataclasses.asdict(s) for s in self.seed_scores], "init_members": dict(self.init_members),
            "decisions": {k: d.to_payload() for k, d in self.decisions.items()},
            "moves_done": {k: sorted(v) for k, v in self.moves_done.items()},
            "decisions_done": sorted(self.decisions_done), "last_intervention": dict(self.last_intervention),
            "mutator_stats": copy.deepcopy(self.mutator_stats), "val_gain": dict(self.val_gain),
            "speciations": dict(self.speciations), "last_step": dict(self.last_step),
            "exhausted_roles": dict(self.exhausted_roles), "events_applied": self.events_applied,
        }
