"""Representative Evidence Ranking: clipped-cosine coverage and its greedy order.

Pure numpy kernels for SSR's RER step (SSR §4.1; DESIGN §4.2).  Records carry an
importance ``w_j``, a quality ``q_i = a_i * u_i`` and an embedding ``z_i``;
``S_ij = max(0, cos(z_i, z_j))``.  The coverage objective

    F(Y) = sum_j w_j * log(1 + sum_{i in Y} q_i * S_ij)

is monotone submodular (for w, q, S >= 0), so the greedy permutation gives every
prefix a (1 - 1/e) guarantee against the best set of the same size.

Marginal gains are always computed by one expression,
``gain_i = sum_j w_j * log1p(q_i * S_ij / (1 + C_j))`` with ``C`` the current
coverage vector, evaluated row by row with numpy's pairwise sum (``_gains``).
The lazy greedy in ``rer_order`` therefore reproduces the naive greedy (all
gains recomputed after every pick, ties to the lower index) bit for bit: a fresh
gain is accepted only once every entry whose stale bound lies within a 1e-9
slack of it (relative to the gain and to F) has been refreshed, so rounding can
never let a stale bound hide a gain the naive greedy would pick.  Besides
older exact gains, the lazy greedy uses the linear bound ``log1p(x) <= x``
(one dot product per row instead of ``n`` logarithms) to keep most rows from
ever being evaluated exactly.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from milo_ray.kernels._validate import as_array, as_int, check_range

__all__ = ["clipped_cosine", "coverage_objective", "rer_order", "prefix_sizes"]

_BOUND_INFLATE = 1e-9  # slack (relative to the gain and to F) on stale lazy-greedy bounds


def clipped_cosine(Z) -> np.ndarray:
    """``S_ij = max(0, cos(z_i, z_j))`` for embedding rows ``Z`` (n, dim).

    Zero rows have similarity 0 with every row, themselves included; non-zero
    rows have ``S_ii = 1`` exactly.  O(n^2 dim).  SSR §4.1.
    """
    Z = as_array("Z", Z, ndim=2)
    norms = np.sqrt(np.einsum("ij,ij->i", Z, Z))
    nonzero = norms > 0
    U = np.zeros_like(Z)
    U[nonzero] = Z[nonzero] / norms[nonzero, None]
    S = np.clip(U @ U.T, 0.0, 1.0)
    idx = np.flatnonzero(nonzero)
    S[idx, idx] = 1.0
    return S


def _check_wqs(w, q, S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = as_array("w", w, ndim=1)
    q = as_array("q", q, ndim=1)
    S = as_array("S", S, ndim=2)
    n = w.shape[0]
    if q.shape[0] != n:
        raise ValueError(f"q: has {q.shape[0]} entries but w has {n}")
    if S.shape != (n, n):
        raise ValueError(f"S: expected shape ({n}, {n}) to match w, got {S.shape}")
    check_range("w", w, low=0.0)
    check_range("q", q, low=0.0)
    check_range("S", S, low=0.0)
    return w, q, S


def coverage_objective(Y, w, q, S) -> float:
    """``F(Y) = sum_j w_j log(1 + sum_{i in Y} q_i S_ij)``; ``Y`` is a set of row indices (duplicates count once).

    O(|Y| n).  SSR §4.1.
    """
    w, q, S = _check_wqs(w, q, S)
    n = w.shape[0]
    Yarr = np.asarray(list(Y) if not isinstance(Y, np.ndarray) else Y)
    if Yarr.size and (Yarr.ndim != 1 or not np.issubdtype(Yarr.dtype, np.integer)):
        raise ValueError(f"Y: expected a 1-D collection of integer indices, got {Yarr!r}")
    Yarr = np.unique(Yarr.astype(np.intp)) if Yarr.size else np.empty(0, dtype=np.intp)
    if Yarr.size and (Yarr[0] < 0 or Yarr[-1] >= n):
        raise ValueError(f"Y: indices must lie in [0, {n}), got {Yarr.tolist()}")
    C = q[Yarr] @ S[Yarr] if Yarr.size else np.zeros(n)
    return float(np.dot(w, np.log1p(C)))


def _gains(rows: np.ndarray, inv: np.ndarray, w: np.ndarray, q: np.ndarray, S: np.ndarray) -> np.ndarray:
    """Marginal gains of adding each of ``rows`` to the set whose coverage is ``C`` (``inv = 1 / (1 + C)``).

    ``F(Y + i) - F(Y) = sum_j w_j * log1p(q_i * S_ij / (1 + C_j))`` (the log of a
    ratio, so no cancellation between two large logarithms).  This is the single
    definition of a gain shared by the lazy greedy and the naive reference;
    row-wise pairwise sums give identical floats whatever the batch.
    """
    X = S[rows] * (q[rows, None] * inv)
    np.log1p(X, out=X)
    X *= w
    return X.sum(axis=1)


def _refresh(heap, rows, step, inv, w, q, S) -> None:
    fresh = _gains(np.asarray(rows, dtype=np.intp), inv, w, q, S)
    for idx, v in zip(rows, fresh.tolist()):
        heapq.heappush(heap, (-v, idx, step, True))


def rer_order(w, q, S) -> np.ndarray:
    """The complete greedy permutation maximizing ``F`` (SSR §4.1, DESIGN §4.2).

    Lazy greedy over a max-heap of upper bounds keyed by ``(-bound, index)``.
    Each entry records the step its bound belongs to and whether it is an
    exact gain (``_gains``) or only a bound.  Two bounds are used, both valid
    by concavity/submodularity: an exact gain from an earlier step, and the
    linear bound ``q_i * sum_j S_ij w_j / (1 + C_j)`` (``log1p(x) <= x``),
    which costs one dot product instead of ``n`` logarithms; once the
    coverage is large it is within a few percent of the gain, so most stale
    rows sink below the leader without ever being evaluated exactly.
    A row at the top is first re-bounded linearly against the current
    coverage, then, if it is still on top, evaluated exactly.  An exact top is
    accepted only when no other entry's bound lies within the rounding slack
    of it (those are evaluated exactly first).  The result equals the naive
    greedy (every gain recomputed each step, ties to the lower index)
    exactly, because accepted gains come from the same ``_gains`` expression
    (see the module docstring).  Worst case O(n^3) like the naive greedy;
    typically O(n^2) dot-product work plus a few exact evaluations per pick.
    ``n = 0`` gives an empty array.
    """
    w, q, S = _check_wqs(w, q, S)
    n = w.shape[0]
    if n == 0:
        return np.empty(0, dtype=np.intp)
    C = np.zeros(n)
    inv = np.ones(n)
    winv = w.copy()  # w / (1 + C): the linear bound of row i is q_i * S_i . winv
    step = 0
    # Entries: (-bound, index, step of the bound, exact?).  A value from an older
    # step is an upper bound on the current gain (submodularity), up to
    # rounding, which the acceptance slack below absorbs.
    heap = [(-float(v), i, 0, False) for i, v in enumerate((q * (S @ w)).tolist())]
    heapq.heapify(heap)
    order: list[int] = []
    push, pop, dot = heapq.heappush, heapq.heappop, np.dot
    ql = q.tolist()
    fval = 0.0  # F of the current prefix: scale of the rounding error in a gain
    while heap:
        negv, i, when, exact = heap[0]
        if when != step:
            # Stale: a linear bound against the current coverage is ~n times
            # cheaper than the exact gain and often enough to sink the row.
            b = ql[i] * float(dot(S[i], winv))
            pop(heap)
            push(heap, (max(negv, -b), i, step, False))
            continue
        if not exact:
            pop(heap)
            _refresh(heap, [i], step, inv, w, q, S)
            continue
        # The top is exact and current.  Every entry whose bound is within the
        # slack of it must be exact too before it can be accepted; exact ties
        # then fall to the lower index through the heap order.
        v = -negv
        thresh = v - _BOUND_INFLATE * (abs(v) + fval) - 1e-300
        top = pop(heap)
        near = []
        while heap and -heap[0][0] >= thresh:
            near.append(pop(heap))
        stale = [e[1] for e in near if not (e[3] and e[2] == step)]
        if stale:
            for e in near:
                if e[3] and e[2] == step:
                    push(heap, e)
            push(heap, top)
            _refresh(heap, stale, step, inv, w, q, S)
            continue
        for e in near:
            push(heap, e)
        order.append(i)
        C += q[i] * S[i]
        inv = 1.0 / (1.0 + C)
        winv = w * inv
        fval = float(np.dot(w, np.log1p(C)))
        step += 1
    return np.asarray(order, dtype=np.intp)


def prefix_sizes(n: int, fractions) -> list[int]:
    """Evidence-prefix sizes ``k = ceil(alpha * n)`` for each fraction ``alpha`` in (0, 1].

    Rules: fractions may come in any order; ``alpha * n`` is rounded up with a
    1e-9 slack (so 0.7 * 10 gives 7, not 8); every size is at least 1; repeated
    sizes are kept once; the result is sorted, strictly increasing and always
    ends with ``n`` (the full record set is appended when the largest fraction
    is below 1).  ``n = 0`` gives ``[]``.  SSR §4.2 (scales ``k_1 < ... < k_M = N``).
    """
    n = as_int("n", n)
    fr = as_array("fractions", fractions, ndim=1, allow_empty=False)
    if np.any(fr <= 0) or np.any(fr > 1):
        bad = fr[(fr <= 0) | (fr > 1)][0]
        raise ValueError(f"fractions: each fraction must be in (0, 1], got {float(bad)!r}")
    if n == 0:
        return []
    sizes = {max(1, math.ceil(float(a) * n - 1e-9)) for a in fr}
    sizes.add(n)
    return sorted(sizes)
