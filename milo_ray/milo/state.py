"""MILO's run state as a pure projection of its typed events (DESIGN §5.11).

Owns :class:`MiloState`: the run-level state (the curriculum, the island -> mutator
assignment, which island holds which node, the orchestrator's bookkeeping) and the
islands it routes each island's own events to. An island (its lineage, admitted set,
stall counter and held-out verdicts) is held by its island object only: a plain
:class:`~milo_ray.milo.island.Island` by default (read-side projections, tests), or,
in a run, a handle on the Ray actor that owns it (``island_factory``, see
:mod:`milo_ray.milo.island_actor`); this state keeps no second copy. The readers that
compose island data (``node``, ``progress``, ``snapshot``, ...) block on an actor, so
the run's loop asks islands through :func:`~milo_ray.milo.island_actor.ask` instead.

:meth:`MiloState.apply` is the only way any of it changes: the run's
:class:`~milo_ray.search.events.EventLog` appends an event to the store and applies it
(``MiloRun.emit``), and a resumed run replays the stored events, in order, into a
fresh state (each island rebuilt from its own events). ``apply`` has no I/O and no
clock, so the same events always give the same state.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

from milo_ray.milo.events import (CurriculumChanged, Decision, DecisionInvalid, HeldOut, Init, InterventionDone,
                                  IslandFounded, MoveDone, MoveFailed, NodeRecorded, Progress, Reassign,
                                  Refit, RoleBudget, SeedScore, Step, Stopped, Summarized)
from milo_ray.milo.island import Island, IslandPart
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
    ``island_factory(j)`` makes island j's owner (default: a plain :class:`Island`).
    """

    def __init__(self, *, eps: float = 0.02, temperature: float = 1.0,
                 island_factory: Callable[[int], Any] | None = None) -> None:
        self.eps, self.temperature = float(eps), float(temperature)
        self._make_island = island_factory or (lambda j: Island(j, eps=self.eps, temperature=self.temperature))
        self.initialized = False
        self.islands: dict[int, Any] = {}  # island -> its owner (an Island or an island_actor.IslandRef)
        self.node_island: dict[str, int] = {}  # node id -> the island holding it now
        self.node_harness: dict[str, str] = {}  # node id -> its harness id (fixed for a node's life)
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
        self.islands[n.island].apply(e)
        self.node_island[n.node_id] = n.island
        self.node_harness[n.node_id] = n.harness_id
        if n.origin in ("mutation", "graft") and n.mutator:
            st = self.mutator_stats.setdefault(n.mutator, {"children": 0, "admitted": 0})
            st["children"] += 1
            st["admitted"] += int(bool(n.admitted))

    @_handles(HeldOut, Progress, Refit)
    def _island_event(self, e: HeldOut | Progress | Refit) -> None:
        self.islands[e.island].apply(e)

    @_handles(Reassign)
    def _reassign(self, e: Reassign) -> None:
        self.assignment[e.island] = e.mutator

    @_handles(IslandFounded)
    def _island(self, e: IslandFounded) -> None:
        moved: IslandPart = self.islands[e.from_island].detach(e.node_id)
        self._new_island(e.island)
        self.islands[e.island].adopt(moved)
        for node_id in moved.node_ids:
            self.node_island[node_id] = e.island
        self.assignment[e.island] = e.mutator
        if e.index is not None:
            self.speciations[(e.decision_id, e.index)] = (e.island, e.node_id)

    @_handles(CurriculumChanged)
    def _curriculum(self, e: CurriculumChanged) -> None:
        self.version, self.search_tasks = e.version, list(e.tasks)

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
            self.islands[j] = self._make_island(j)

    # ------------------------------------------------------------------ reading
    def node(self, node_id: str) -> LineageNode:
        """A node as its island holds it now (relabels and speciation applied)."""
        try:
            return self.islands[self.node_island[node_id]].node(node_id)
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the run") from None

    def has_node(self, node_id: str) -> bool:
        return node_id in self.node_island

    def island_of(self, node_id: str) -> Any:
        """The owner of the island holding ``node_id`` now."""
        try:
            return self.islands[self.node_island[node_id]]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the run") from None

    def harness_of(self, node_id: str | None) -> str | None:
        """A node's harness id, None for no node or one the run does not hold."""
        return self.node_harness.get(node_id) if node_id else None

    def nodes(self) -> list[LineageNode]:
        return [n for j in sorted(self.islands) for n in self.islands[j].nodes()]

    @property
    def progress(self) -> dict[int, tuple[int, int]]:
        """island -> (rounds done, stall), as the islands hold them."""
        return {j: tuple(self.islands[j].status()) for j in sorted(self.islands)}  # type: ignore[misc]

    @property
    def recorded(self) -> dict[str, LineageNode]:
        """node id -> the node as its ``milo.node`` event recorded it (from the islands)."""
        out: dict[str, LineageNode] = {}
        for j in sorted(self.islands):
            out.update({k: LineageNode.from_dict(v) for k, v in self.islands[j].snapshot()["recorded"].items()})
        return out

    @property
    def val_gain(self) -> dict[str, bool]:
        """node id -> whether its held-out score was a new island best (from the islands)."""
        out: dict[str, bool] = {}
        for j in sorted(self.islands):
            out.update(self.islands[j].snapshot()["val_gain"])
        return out

    def rounds_done(self, j: int) -> int:
        return self.islands[j].status()[0]

    def stall(self, j: int) -> int:
        return self.islands[j].status()[1]

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (equal states give equal snapshots)."""
        parts = {j: self.islands[j].snapshot() for j in sorted(self.islands)}
        return {
            "initialized": self.initialized,
            "islands": {j: {k: p[k] for k in ("nodes", "rounds_done", "stall", "best_val", "best_val_node")}
                        for j, p in parts.items()},
            "node_island": dict(self.node_island),
            "recorded": {k: v for p in parts.values() for k, v in p["recorded"].items()},
            "progress": {j: (p["rounds_done"], p["stall"]) for j, p in parts.items()},
            "assignment": dict(self.assignment),
            "search_tasks": list(self.search_tasks), "val_tasks": list(self.val_tasks),
            "task_pool": list(self.task_pool), "version": self.version,
            "seed_scores": [dataclasses.asdict(s) for s in self.seed_scores], "init_members": dict(self.init_members),
            "decisions": {k: d.to_payload() for k, d in self.decisions.items()},
            "moves_done": {k: sorted(v) for k, v in self.moves_done.items()},
            "decisions_done": sorted(self.decisions_done), "last_intervention": dict(self.last_intervention),
            "mutator_stats": copy.deepcopy(self.mutator_stats),
            "val_gain": {k: v for p in parts.values() for k, v in p["val_gain"].items()},
            "speciations": dict(self.speciations), "last_step": dict(self.last_step),
            "exhausted_roles": dict(self.exhausted_roles), "events_applied": self.events_applied,
        }
