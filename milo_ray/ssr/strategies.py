"""SSR's evidence strategies (papers/002 §4.1–4.2, §6.4 ablations), each a small object
behind one protocol: the evidence ordering π and the per-candidate evidence sets.

``method.ordering`` and ``method.evidence`` name one of the registered objects
(:data:`ORDERINGS`, :data:`EVIDENCE_SETS`) or give a ``_target_`` building another
object of the protocol (:mod:`milo_ray.search.strategy`); the racing rule
(``method.racing``) lives with the race it rules (:mod:`milo_ray.ssr.racing`).

Strategies are pure and draw only from the generator they are handed (one per round
and purpose, derived from the run seed), so the same seed gives the same evidence.
:func:`milo_ray.ssr.evidence.order_records` and :func:`~milo_ray.ssr.evidence.evidence_sets`
are the calls the loop makes; they handle what every strategy shares (judge failures
are excluded, no evidence means no candidates).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from milo_ray.search.strategy import Choice


@runtime_checkable
class EvidenceOrdering(Protocol):
    """Orders the judged records of a round: the order π every evidence prefix, the
    racing batches and the optimizer's memory follow."""

    name: str

    def order(self, records: Sequence[Any], rng: np.random.Generator) -> Sequence[int]:
        """A permutation of ``range(len(records))``; ``records`` are judged records
        (``w``, ``q`` in [0, 1], ``embedding`` when embedded), never empty."""
        ...


class RerOrdering:
    """Representative Evidence Ranking (§4.1): the greedy permutation of the monotone
    submodular F(Y) = Σ_j w_j·log(1 + Σ_{i∈Y} q_i·s_ij), ties by lower record index."""

    name = "rer"

    def order(self, records: Sequence[Any], rng: np.random.Generator) -> Sequence[int]:
        from milo_ray.kernels.submodular import clipped_cosine, rer_order

        if any(r.embedding is None for r in records):
            raise ValueError("order_records: RER ordering needs embeddings (call embed_records first)")
        w = np.array([r.w for r in records], dtype=float)
        q = np.array([r.q for r in records], dtype=float)
        S = clipped_cosine(np.stack([r.embedding for r in records]))
        return [int(i) for i in rer_order(w, q, S)]


class QualityOnlyOrdering:
    """q = a·u descending, ties by lower index: quality without coverage (QUALITY-ONLY)."""

    name = "quality_only"

    def order(self, records: Sequence[Any], rng: np.random.Generator) -> Sequence[int]:
        q = np.array([r.q for r in records], dtype=float)
        return sorted(range(len(records)), key=lambda i: (-q[i], i))


class RandomOrdering:
    """A uniform permutation (the RANDOM ablation)."""

    name = "random"

    def order(self, records: Sequence[Any], rng: np.random.Generator) -> Sequence[int]:
        return [int(i) for i in rng.permutation(len(records))]


@runtime_checkable
class EvidenceSets(Protocol):
    """Gives each candidate of a round its evidence set."""

    name: str

    def sets(self, order: Sequence[str], sizes: Sequence[int], m: int,
             rng: np.random.Generator) -> list[tuple[str, ...]]:
        """Up to ``m`` sets of task ids, each in evidence order. ``order``: the judged
        tasks in evidence order (never empty); ``sizes``: the scale sizes ⌈α_i·N⌉,
        strictly increasing, the last being ``len(order)`` (fewer than ``m`` on a tiny
        pool)."""
        ...


class MultiscalePrefixes:
    """Nested prefixes of the ordering, one per scale (SSR proper, §4.2)."""

    name = "rer"

    def sets(self, order: Sequence[str], sizes: Sequence[int], m: int,
             rng: np.random.Generator) -> list[tuple[str, ...]]:
        return [tuple(order[:k]) for k in sizes]


class TopKFixed:
    """Every candidate gets the same top ⌈α_1·N⌉ records (TOP-K FIXED)."""

    name = "topk_fixed"

    def sets(self, order: Sequence[str], sizes: Sequence[int], m: int,
             rng: np.random.Generator) -> list[tuple[str, ...]]:
        return [tuple(order[: sizes[0]]) for _ in range(m)]


class TopKResampling:
    """Each candidate an independent uniform ⌈α_1·N⌉-subset, kept in evidence order
    (TOP-K RESAMPLING)."""

    name = "topk_resampling"

    def sets(self, order: Sequence[str], sizes: Sequence[int], m: int,
             rng: np.random.Generator) -> list[tuple[str, ...]]:
        out = []
        for _ in range(m):
            pick = set(rng.choice(len(order), size=sizes[0], replace=False).tolist())
            out.append(tuple(t for i, t in enumerate(order) if i in pick))
        return out


class FixedN:
    """Every candidate gets all N records (FIXED-N)."""

    name = "fixed_n"

    def sets(self, order: Sequence[str], sizes: Sequence[int], m: int,
             rng: np.random.Generator) -> list[tuple[str, ...]]:
        return [tuple(order) for _ in range(m)]


ORDERINGS: Choice[EvidenceOrdering] = Choice(
    "evidence ordering", {"rer": RerOrdering, "random": RandomOrdering, "quality_only": QualityOnlyOrdering},
    EvidenceOrdering)
EVIDENCE_SETS: Choice[EvidenceSets] = Choice(
    "evidence strategy", {"rer": MultiscalePrefixes, "topk_fixed": TopKFixed, "topk_resampling": TopKResampling,
                          "fixed_n": FixedN}, EvidenceSets)
