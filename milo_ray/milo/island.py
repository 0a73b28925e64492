"""One MILO island (papers/000 §4.2): its lineage tree, admitted set H_j^+, parent
selection, admission verdicts, held-out stall counter and which held-out scores were
new bests. How a parent is chosen and how the memory is rendered are strategy objects
(:mod:`milo_ray.milo.strategies`).

Owns :class:`Island`, a plain object with no Ray or I/O (unit-tested directly), and the
plain values it answers with (:class:`Verdict`, :class:`RoundPlan`, :class:`IslandView`,
:class:`IslandPart`). The island *decides* (which parent, admitted or not, a new
held-out best or not); the loop *carries out* (mutation, evaluation, events). An island
changes only by :meth:`Island.apply` of its own ``events`` rows (and by handing a
subtree to a new island), so replaying the store rebuilds it exactly. In a run each
island is a Ray actor wrapping this class (:mod:`milo_ray.milo.island_actor`), the only
in-memory owner of the island's state; read-side projections use it directly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from milo_ray.core.seeds import derive_seed

from milo_ray.kernels.hypervolume import delta_hv
from milo_ray.kernels.pareto import admits, dominates
from milo_ray.milo.events import HeldOut, NodeRecorded, Progress, Refit
from milo_ray.milo.lineage import Lineage, LineageNode
from milo_ray.milo.strategies import MEMORIES, PARENT_SELECTIONS, MemoryRendering, ParentPool, ParentSelection, SoftmaxSelection


@dataclass(frozen=True)
class Verdict:
    """Admission of a child: Adm(h) plus its hypervolume contribution and a reason."""

    admitted: bool
    delta_hv: float
    reason: str


@dataclass(frozen=True)
class RoundPlan:
    """What the loop needs from island j to start round ``rounds_done + 1``, in one answer:
    the counters, the parent the selection strategy draws (None, with ``problem``, when
    the island has no admitted harness) and the memory rendered for the mutator."""

    rounds_done: int
    stall: int
    parent: LineageNode | None
    memory: str
    problem: str | None = None


@dataclass(frozen=True)
class IslandView:
    """What the orchestrator reads of one island: its summary and its rendered tree."""

    summary: dict[str, Any]
    tree: str


@dataclass
class IslandPart:
    """A subtree handed from one island to another by Speciate: the nodes (parents
    first), the nodes as their ``milo.node`` events recorded them, and the held-out
    verdicts of the moved nodes (they follow their nodes, so a moved node is never
    measured twice)."""

    nodes: list[LineageNode]
    recorded: dict[str, LineageNode] = field(default_factory=dict)
    val_gain: dict[str, bool] = field(default_factory=dict)

    @property
    def node_ids(self) -> list[str]:
        return [n.node_id for n in self.nodes]


# The events an island applies to itself; the run-level state routes them here.
ISLAND_EVENTS: tuple[type, ...] = (NodeRecorded, HeldOut, Progress, Refit)


class Island:
    """State and policies of island j. Not thread-safe: one owner (the actor or a test)."""

    def __init__(self, island: int, *, eps: float = 0.02, temperature: float = 1.0) -> None:
        if eps < 0:
            raise ValueError(f"Island: eps={eps} must be >= 0")
        if temperature <= 0:
            raise ValueError(f"Island: temperature={temperature} must be > 0")
        self.island = int(island)
        self.eps = float(eps)
        self.temperature = float(temperature)
        self.lineage = Lineage(island)
        self.stall = 0
        self.rounds_done = 0
        self.best_val: float | None = None
        self.best_val_node: str | None = None
        self.recorded: dict[str, LineageNode] = {}  # node id -> the node as its milo.node event recorded it
        self.val_gain: dict[str, bool] = {}  # node id -> whether its held-out score was a new island best

    # --- events (the only way a run changes an island) -------------------------------
    def apply(self, event: Any) -> None:
        """Apply one of this island's events (:data:`ISLAND_EVENTS`). Events are never
        mutated: the island keeps copies."""
        if isinstance(event, NodeRecorded):
            n = event.node
            self.recorded[n.node_id] = copy.deepcopy(n)
            self.add_node(copy.deepcopy(n))  # the lineage's copy is relabelled later
        elif isinstance(event, HeldOut):
            # The island answers whether this is a new best; replay gives the same answer.
            self.val_gain[event.node_id] = bool(self.record_val(event.node_id, event.val_accuracy))
        elif isinstance(event, Progress):
            self.set_progress(event.rounds_done, event.stall)
        elif isinstance(event, Refit):
            self.relabel(event.node_id, copy.deepcopy(event.changes))
        else:
            raise TypeError(f"island {self.island}: {type(event).__name__} is not an island event "
                            f"(expected one of {[t.__name__ for t in ISLAND_EVENTS]})")

    def apply_all(self, events: Iterable[Any]) -> int:
        """Apply events in order (one actor call per batch); how many were applied."""
        k = 0
        for k, e in enumerate(events, 1):
            self.apply(e)
        return k

    # --- lineage ---------------------------------------------------------------------
    def add_node(self, node: LineageNode | dict[str, Any]) -> None:
        self.lineage.add(node if isinstance(node, LineageNode) else LineageNode.from_dict(node))

    def node(self, node_id: str) -> LineageNode:
        return self.lineage.node(node_id)

    def nodes(self) -> list[LineageNode]:
        return self.lineage.nodes()

    def relabel(self, node_id: str, changes: dict[str, Any]) -> None:
        self.lineage.update(node_id, **changes)

    def find(self, key: str) -> str | None:
        n = self.lineage.find(key)
        return None if n is None else n.node_id

    def is_root(self, node_id: str) -> bool:
        return any(r.node_id == node_id for r in self.lineage.roots())

    # --- admission (§4.2 stage 4, Eq. 7) ----------------------------------------------
    def _admitted_matrix(self) -> tuple[list[LineageNode], np.ndarray]:
        adm = [n for n in self.lineage.admitted() if n.fitness is not None]
        F = np.array([n.fitness for n in adm], dtype=float) if adm else np.zeros((0, 0))
        return adm, F

    def judge(self, fitness: list[float]) -> Verdict:
        """Adm(child) = no admitted harness of this island eps-dominates it; ΔHV is recorded."""
        child = np.asarray(fitness, dtype=float)
        adm, F = self._admitted_matrix()
        if not adm:
            return Verdict(True, float(delta_hv(np.zeros((0, child.size)), child)), "admitted: first harness of the island")
        dhv = float(delta_hv(F, child))
        if admits(F, child, eps=self.eps):
            return Verdict(True, dhv, "admitted: not dominated by any admitted harness")
        # Name the strongest dominator so mutators see *why* an edit failed.
        doms = [n for n in adm if dominates(np.asarray(n.fitness), child, eps=self.eps)]
        top = max(doms, key=lambda n: (n.accuracy or 0.0)) if doms else adm[0]
        return Verdict(
            False,
            dhv,
            f"dominated by {top.node_id} (acc {top.accuracy:.3f} vs {child[0]:.3f})",
        )

    # --- parent selection (§4.2 stage 1) ------------------------------------------------
    def parent_pool(self) -> ParentPool:
        """The admitted set a parent selection chooses from (``ValueError`` when empty)."""
        adm, F = self._admitted_matrix()
        if not adm:
            raise ValueError(f"island {self.island}: no admitted harness to select a parent from")
        return ParentPool(self.island, tuple(adm), F, self._behavior_matrix(adm), self.eps, self.temperature)

    def selection_probabilities(self) -> tuple[list[str], list[float]]:
        """softmax(eta/T) over the admitted set, eta = -sum_h2 Dom(h1,h2) * Sim(h1,h2)."""
        pool = self.parent_pool()
        return [n.node_id for n in pool.nodes], SoftmaxSelection().probabilities(pool).tolist()

    def select_parent(self, seed: int, mode: str | ParentSelection = "softmax") -> str:
        """The parent's node id, chosen by ``mode``: a :class:`ParentSelection` or a
        registered name (``"softmax"``: eta/T; ``"best"``: the highest search accuracy,
        the flat-archive baseline of App. A.5), with a generator seeded by ``seed``."""
        selection = PARENT_SELECTIONS.resolve(mode, key="mode") if isinstance(mode, str) else mode
        pool = self.parent_pool()
        return pool.nodes[selection.select(pool, np.random.default_rng(seed))].node_id

    @staticmethod
    def _behavior_matrix(adm: list[LineageNode]) -> np.ndarray:
        # After a curriculum change every admitted node is re-fit on the same task set,
        # so the shared keys are the current B_search.
        common = set(adm[0].behavior)
        for n in adm[1:]:
            common &= set(n.behavior)
        tasks = sorted(common)
        if not tasks:
            return np.zeros((len(adm), 1))
        return np.array([[n.behavior[t] for t in tasks] for n in adm], dtype=float)

    # --- held-out monitoring (§4.2 stage 5) ---------------------------------------------
    def record_val(self, node_id: str, val_accuracy: float) -> bool:
        """Store a held-out score; True when it is a new held-out best of the island."""
        self.lineage.update(node_id, val_accuracy=float(val_accuracy))
        if self.best_val is None or val_accuracy > self.best_val:
            self.best_val, self.best_val_node = float(val_accuracy), node_id
            return True
        return False

    def set_progress(self, rounds_done: int, stall: int) -> None:
        self.rounds_done, self.stall = int(rounds_done), int(stall)

    def best(self) -> LineageNode | None:
        """The island's best admitted harness: highest held-out score, then search accuracy."""
        adm = [n for n in self.lineage.admitted() if n.evaluated]
        if not adm:
            return None
        return max(adm, key=lambda n: (n.val_accuracy if n.val_accuracy is not None else -1.0, n.accuracy or 0.0))

    # --- speciation --------------------------------------------------------------------
    def detach_subtree(self, node_id: str) -> list[LineageNode]:
        if node_id not in self.lineage:
            raise ValueError(f"island {self.island} has no node {node_id!r} to speciate")
        if self.is_root(node_id):
            raise ValueError(f"node {node_id!r} is a root of island {self.island}; speciate a descendant")
        moved = self.lineage.detach_subtree(node_id)
        if self.best_val_node is not None and self.best_val_node not in self.lineage:
            vals = [(n.val_accuracy, n.node_id) for n in self.lineage.admitted() if n.val_accuracy is not None]
            self.best_val, self.best_val_node = max(vals) if vals else (None, None)
        return moved

    def detach(self, node_id: str) -> IslandPart:
        """Hand the subtree rooted at ``node_id`` to a new island (Speciate), with the
        recorded copies and held-out verdicts of its nodes."""
        moved = self.detach_subtree(node_id)
        ids = [n.node_id for n in moved]
        return IslandPart(moved, {i: self.recorded.pop(i) for i in ids if i in self.recorded},
                          {i: self.val_gain.pop(i) for i in ids if i in self.val_gain})

    def adopt(self, part: IslandPart) -> None:
        """Found this (new) island on a subtree another island handed over."""
        self.adopt_subtree(part.nodes)
        self.recorded.update(part.recorded)
        self.val_gain.update(part.val_gain)

    def adopt_subtree(self, nodes: list[LineageNode]) -> None:
        """Seed this (new) island with a moved subtree (the nodes become this island's);
        its root becomes admitted here, since the dominating lineage it was crowded out
        by stays behind."""
        for i, n in enumerate(nodes):
            if i == 0:
                n.admitted = True
                n.verdict_reason = f"admitted: speciated from island {n.island}"
            self.lineage.add(n)
        for n in self.lineage.admitted():
            if n.val_accuracy is not None and (self.best_val is None or n.val_accuracy > self.best_val):
                self.best_val, self.best_val_node = n.val_accuracy, n.node_id

    # --- answers the loop asks for (one call each; see RoundPlan) -------------------------
    def status(self) -> tuple[int, int]:
        """(rounds done, stall)."""
        return self.rounds_done, self.stall

    def progress(self) -> tuple[int, int]:
        """(rounds done, idle rounds): the rounds since this island last evaluated a new
        child. A duplicate of a harness already evaluated, an invalid child or a failed
        mutation costs no execution and evaluates none; 0 right after one was evaluated."""
        last = max((n.round for n in self.lineage.nodes() if n.accuracy is not None), default=0)
        return self.rounds_done, max(0, self.rounds_done - last)

    def plan(self, run_seed: int, selection: str | ParentSelection, memory: str | MemoryRendering,
             mutator: str | None) -> RoundPlan:
        """Everything round ``rounds_done + 1`` starts from: the parent drawn with the
        round's derived seed and the memory rendered for ``mutator``, read from one
        state (nothing can change the island between the two)."""
        r = self.rounds_done + 1
        try:
            parent: LineageNode | None = self.node(self.select_parent(derive_seed(run_seed, "parent", self.island, r),
                                                                      selection))
            problem = None
        except ValueError as e:  # no admitted harness: the loop raises it if it needs a parent
            parent, problem = None, str(e)
        return RoundPlan(self.rounds_done, self.stall, parent, self.render(memory=memory, mutator=mutator), problem)

    def held_out_gain(self, node_id: str) -> bool | None:
        """Whether the node's held-out score was a new island best; None before it is measured."""
        return self.val_gain.get(node_id)

    def refit_due(self, version: int) -> list[str]:
        """Admitted, evaluated nodes measured on another curriculum version than ``version``."""
        return [n.node_id for n in self.lineage.admitted() if n.evaluated and n.search_version != version]

    def speciation_root(self, key: str) -> tuple[str | None, str | None]:
        """(the node a Speciate of ``key`` (node or harness id) would move, or None; why
        it cannot, or None). A root would empty the island; an unevaluated node has no
        fitness to found an island with."""
        found = self.find(key)
        if found is None or self.is_root(found):
            return None, f"{key!r} is missing or a root of island {self.island}"
        if self.node(found).fitness is None:
            return None, f"{key!r} was never evaluated (invalid or missing child): it cannot found an island"
        return found, None

    def view(self, recent: int = 5, mutator: str | None = None) -> IslandView:
        """The orchestrator's view: summary and lineage tree, in one answer."""
        return IslandView(self.summary(recent), self.render(memory="lineage", mutator=mutator))

    def recorded_nodes(self) -> list[LineageNode]:
        return list(self.recorded.values())

    def snapshot(self) -> dict[str, Any]:
        """The island as plain data (equal islands give equal snapshots)."""
        return {"nodes": [n.to_dict() for n in self.nodes()], "rounds_done": self.rounds_done, "stall": self.stall,
                "best_val": self.best_val, "best_val_node": self.best_val_node,
                "recorded": {k: n.to_dict() for k, n in self.recorded.items()}, "val_gain": dict(self.val_gain)}

    # --- summaries for the orchestrator --------------------------------------------------
    def summary(self, recent: int = 5) -> dict[str, Any]:
        children = [n for n in self.lineage if n.origin in ("mutation", "graft")]
        roots = {n.node_id for n in self.lineage.roots()}
        last = children[-recent:]
        best = self.best()
        return {
            "island": self.island,
            "stall": self.stall,
            "rounds_done": self.rounds_done,
            "best": None if best is None else best.to_dict(),
            "best_val": self.best_val,
            "n_nodes": len(self.lineage),
            "n_admitted": len(self.lineage.admitted()),
            "recent": [
                {"node_id": n.node_id, "admitted": n.admitted, "mutation": n.mutation, "reason": n.verdict_reason,
                 "accuracy": n.accuracy, "mutator": n.mutator}
                for n in last
            ],
            "admitted": [
                {"node_id": n.node_id, "harness_id": n.harness_id, "accuracy": n.accuracy,
                 "val_accuracy": n.val_accuracy, "behavior": dict(n.behavior), "fitness": n.fitness}
                for n in self.lineage.admitted() if n.evaluated
            ],
            "nodes": [
                {"node_id": n.node_id, "harness_id": n.harness_id, "accuracy": n.accuracy, "admitted": n.admitted,
                 "behavior": dict(n.behavior), "fitness": n.fitness, "is_root": n.node_id in roots, "origin": n.origin}
                for n in self.lineage if n.evaluated
            ],
        }

    def render(self, *, memory: str | MemoryRendering = "lineage", mutator: str | None = None) -> str:
        """The island's memory as ``memory`` (a :class:`MemoryRendering` or a registered
        name: ``"lineage"`` tree or ``"flat"`` archive) renders it for ``mutator``."""
        rendering = MEMORIES.resolve(memory, key="memory") if isinstance(memory, str) else memory
        return rendering.render(self.lineage, mutator=mutator, stall=self.stall, best_val=self.best_val)
