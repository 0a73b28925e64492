"""MILO's configurable strategies (papers/000 §4.2, App. A.5): parent selection and the
lineage memory a mutator reads, each a small object behind one protocol.

``method.parent_selection`` and ``method.memory`` name one of the registered objects
(:data:`PARENT_SELECTIONS`, :data:`MEMORIES`) or give a ``_target_`` building another
object of the protocol (:mod:`milo_ray.search.strategy`). The A.5 ablation ladder is
made of these choices: ``best`` + ``flat`` for the flat-archive baselines, ``softmax``
+ ``lineage`` for MILO proper. ``method.mutator_mode`` is a plain enumerated value
(:data:`MUTATOR_MODES`): the mutator reads it from its request's context.

Strategies are pure: a parent selection sees the island's admitted set as a
:class:`ParentPool` and draws only from the generator it is handed (one per island and
round, derived from the run seed), so the same seed gives the same parent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from milo_ray.kernels.pareto import sample_parent, selection_scores
from milo_ray.milo.lineage import Lineage, LineageNode
from milo_ray.milo.render import render_flat_archive, render_island
from milo_ray.search.strategy import Choice


@dataclass(frozen=True)
class ParentPool:
    """What a parent selection chooses from: island ``island``'s admitted harnesses with
    a fitness vector, in insertion order, their fitness matrix F (one row each, all axes
    maximized), their behavior matrix B (pass rate per task of the current B_search),
    and the island's dominance tolerance and softmax temperature."""

    island: int
    nodes: Sequence[LineageNode]
    fitness: np.ndarray
    behavior: np.ndarray
    eps: float
    temperature: float


@runtime_checkable
class ParentSelection(Protocol):
    """Chooses the parent of an island's next mutation."""

    name: str

    def select(self, pool: ParentPool, rng: np.random.Generator) -> int:
        """The index into ``pool.nodes`` of the parent (the pool is never empty)."""
        ...


class SoftmaxSelection:
    """h_par ~ softmax(η/T), η(h1) = −Σ_{h2≠h1} Dom(h1,h2)·Sim(h1,h2) (§4.2 stage 1):
    harnesses that are dominated by behaviorally similar ones are picked less often."""

    name = "softmax"

    @staticmethod
    def eta(pool: ParentPool) -> np.ndarray:
        return np.asarray(selection_scores(pool.fitness, pool.behavior, eps=pool.eps), dtype=float)

    def probabilities(self, pool: ParentPool) -> np.ndarray:
        z = self.eta(pool) / pool.temperature
        p = np.exp(z - z.max())
        return p / p.sum()

    def select(self, pool: ParentPool, rng: np.random.Generator) -> int:
        return int(sample_parent(self.eta(pool), temperature=pool.temperature, rng=rng))


class BestAccuracySelection:
    """The admitted harness with the highest search accuracy, ties by insertion order
    (the flat-archive baselines of App. A.5). Draws nothing from ``rng``."""

    name = "best"

    def select(self, pool: ParentPool, rng: np.random.Generator) -> int:
        return max(range(len(pool.nodes)), key=lambda i: pool.nodes[i].accuracy or 0.0)


@runtime_checkable
class MemoryRendering(Protocol):
    """The markdown a mutator reads of its island (and the orchestrator of every island)."""

    name: str

    def render(self, lineage: Lineage, *, mutator: str | None, stall: int, best_val: float | None) -> str:
        ...


class LineageMemory:
    """The indented lineage tree with verdicts, diffs and the needle ranking (§4.1.2)."""

    name = "lineage"

    def render(self, lineage: Lineage, *, mutator: str | None, stall: int, best_val: float | None) -> str:
        return render_island(lineage, mutator=mutator, stall=stall, best_val=best_val)


class FlatArchiveMemory:
    """Admitted harnesses and their scores only: no tree, no edits, no rejected children
    (the unstructured archive of the App. A.5 baselines)."""

    name = "flat"

    def render(self, lineage: Lineage, *, mutator: str | None, stall: int, best_val: float | None) -> str:
        return render_flat_archive(lineage)


PARENT_SELECTIONS: Choice[ParentSelection] = Choice(
    "parent selection", {"softmax": SoftmaxSelection, "best": BestAccuracySelection}, ParentSelection)
MEMORIES: Choice[MemoryRendering] = Choice(
    "memory rendering", {"lineage": LineageMemory, "flat": FlatArchiveMemory}, MemoryRendering)
# "agentic": the mutator reads the parent's evidence dir and the memory; "one_shot": the
# parent's source and aggregate score only.
MUTATOR_MODES: Choice[str] = Choice("mutator mode", {"agentic": lambda: "agentic", "one_shot": lambda: "one_shot"})
