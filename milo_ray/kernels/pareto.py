"""Fitness vectors, pass-primary epsilon-dominance, admission and parent selection.

Pure numpy kernels behind MILO's island bookkeeping (MILO §4.2 and App. A.1;
DESIGN §4.1).  All fitness axes are maximized and live in ``[0, 1]``: axis 0 is
accuracy, axes ``1..q`` are ``1 - cost_i / cap_i``.

Dominance rule (``F_a`` dominates ``F_b``), with ``d = F_a[0] - F_b[0]``:

* ``d > eps`` (clearly more accurate), or
* ``|d| <= eps`` and ``F_a[i] > F_b[i]`` strictly on every cost axis ``i >= 1``.

With no cost axes the tie band never dominates: a vacuous "better on every cost
axis" would make two harnesses within ``eps`` of each other dominate each other.
The relation is irreflexive and antisymmetric but, because of the band, not
transitive, so ``pareto_front`` is defined directly as "no row dominates it".
"""

from __future__ import annotations

import numpy as np

from milo_ray.kernels._validate import as_array, as_int, as_scalar, check_eps, check_range

__all__ = [
    "fitness_vectors",
    "dominates",
    "dominance_matrix",
    "pareto_front",
    "admits",
    "behavior_similarity",
    "selection_scores",
    "sample_parent",
    "task_regret",
    "most_dissimilar",
]

# Rows per block in the O(n^2) kernels: ~block * n temporaries.  Small blocks keep
# the temporaries in cache, which is several times faster than one big broadcast.
_BLOCK_ELEMS = 65_536


def _fitness_matrix(name: str, F) -> np.ndarray:
    arr = as_array(name, F, ndim=2)
    if arr.shape[0] and arr.shape[1] == 0:
        raise ValueError(f"{name}: needs at least the accuracy column, got shape {arr.shape}")
    return arr


def fitness_vectors(acc, costs, caps) -> np.ndarray:
    """Fitness matrix ``F`` (n, 1+q): ``F[:,0] = acc``, ``F[:,i] = clip(1 - costs[:,i-1]/caps[i-1], 0, 1)``.

    ``acc`` (n,) in [0, 1]; ``costs`` (n, q) non-negative; ``caps`` (q,) strictly
    positive (the fixed per-task caps, e.g. 20M tokens and 7,200 s).  O(n q).
    MILO §4.2.
    """
    acc = as_array("acc", acc, ndim=1)
    costs = as_array("costs", costs, ndim=2)
    caps = as_array("caps", caps, ndim=1)
    if costs.shape[0] != acc.shape[0]:
        raise ValueError(f"costs: has {costs.shape[0]} rows but acc has {acc.shape[0]} entries")
    if costs.shape[1] != caps.shape[0]:
        raise ValueError(f"caps: has {caps.shape[0]} entries but costs has {costs.shape[1]} columns")
    check_range("acc", acc, low=0.0, high=1.0)
    check_range("costs", costs, low=0.0)
    if caps.size and not np.all(caps > 0):
        i = int(np.argmin(caps))
        raise ValueError(f"caps: every cap must be > 0, got {float(caps[i])!r} at index {i}")
    F = np.empty((acc.shape[0], 1 + caps.shape[0]), dtype=np.float64)
    F[:, 0] = acc
    F[:, 1:] = np.clip(1.0 - costs / caps, 0.0, 1.0)
    return F


def dominates(a, b, *, eps: float = 0.02) -> bool:
    """True iff fitness vector ``a`` dominates ``b`` under the pass-primary rule. O(q)."""
    eps = check_eps(eps)
    a = as_array("a", a, ndim=1, allow_empty=False)
    b = as_array("b", b, ndim=1, allow_empty=False)
    if a.shape != b.shape:
        raise ValueError(f"b: shape {b.shape} does not match a's shape {a.shape}")
    d = a[0] - b[0]
    if d > eps:
        return True
    if abs(d) <= eps and a.shape[0] > 1:
        return bool(np.all(a[1:] > b[1:]))
    return False


def _dominance_block(Fi: np.ndarray, F: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """``D[r, j]`` = row ``r`` of ``Fi`` dominates row ``j`` of ``F``.

    Same float operations as ``dominates``: with ``d = a0 - b0``, ``d > eps`` or
    ``-eps <= d <= eps`` and strictly better costs (``d >= -eps`` suffices in the
    second term because ``d > eps`` is already true otherwise).
    """
    d = np.subtract.outer(Fi[:, 0], F[:, 0])
    if out is None:
        out = np.empty(d.shape, dtype=bool)
    np.greater(d, eps, out=out)
    if F.shape[1] > 1:
        band = d >= -eps
        tmp = np.empty(d.shape, dtype=bool)
        for ax in range(1, F.shape[1]):
            np.greater.outer(Fi[:, ax], F[:, ax], out=tmp)
            band &= tmp
        out |= band
    return out


def dominance_matrix(F, *, eps: float = 0.02) -> np.ndarray:
    """Boolean (n, n) matrix, ``D[i, j]`` = ``F[i]`` dominates ``F[j]``.

    Vectorized in row blocks: O(n^2 q) time, O(n^2) output plus O(block * n)
    temporaries.  MILO §4.2.
    """
    eps = check_eps(eps)
    F = _fitness_matrix("F", F)
    n = F.shape[0]
    D = np.empty((n, n), dtype=bool)
    step = max(1, _BLOCK_ELEMS // max(n, 1))
    for s in range(0, n, step):
        _dominance_block(F[s : s + step], F, eps, out=D[s : s + step])
    return D


def pareto_front(F, *, eps: float = 0.02) -> np.ndarray:
    """Indices (ascending) of the rows of ``F`` that no row dominates.

    Never materializes more than a block of the dominance matrix: O(n^2 q)
    time, O(block * n) memory.  Empty input gives an empty index array.
    """
    eps = check_eps(eps)
    F = _fitness_matrix("F", F)
    n = F.shape[0]
    dominated = np.zeros(n, dtype=bool)
    step = max(1, _BLOCK_ELEMS // max(n, 1))
    for s in range(0, n, step):
        dominated |= _dominance_block(F[s : s + step], F, eps).any(axis=0)
    return np.flatnonzero(~dominated)


def admits(front_F, child_F, *, eps: float = 0.02) -> bool:
    """Admission test Adm(child): True iff no row of ``front_F`` dominates ``child_F``.

    An empty front admits everything. O(|front| q). MILO §4.2.
    """
    eps = check_eps(eps)
    child = as_array("child_F", child_F, ndim=1, allow_empty=False)
    front = as_array("front_F", front_F, ndim=2)
    if front.shape[0] == 0:
        return True
    if front.shape[1] != child.shape[0]:
        raise ValueError(f"child_F: has {child.shape[0]} axes but front_F rows have {front.shape[1]}")
    return not bool(_dominance_block(front, child[None, :], eps).any())


def behavior_similarity(B) -> np.ndarray:
    """``Sim[i, j] = 1 - ||B[i] - B[j]||_1 / m`` for per-task pass-rate rows ``B`` (n, m) in [0, 1].

    O(n^2 m) time in row blocks. MILO §4.2.
    """
    B = as_array("B", B, ndim=2)
    n, m = B.shape
    if n and m == 0:
        raise ValueError("B: needs at least one task column (m = 0 makes similarity undefined)")
    check_range("B", B, low=0.0, high=1.0)
    S = np.empty((n, n), dtype=np.float64)
    step = max(1, 32 * _BLOCK_ELEMS // max(n * m, 1))
    for s in range(0, n, step):
        S[s : s + step] = 1.0 - np.abs(B[s : s + step, None, :] - B[None, :, :]).sum(axis=2) / m
    return S


def selection_scores(F, B, *, eps: float = 0.02) -> np.ndarray:
    """Parent-selection scores ``eta_i = -sum_{j != i} Dom(i, j) * Sim(i, j)``.

    ``Dom(i, j) = 1[F_j dominates F_i]``: a harness dominated by many
    behaviorally similar harnesses is unlikely to be picked. O(n^2 (q + m)).
    MILO §4.2.
    """
    F = _fitness_matrix("F", F)
    B = as_array("B", B, ndim=2)
    if B.shape[0] != F.shape[0]:
        raise ValueError(f"B: has {B.shape[0]} rows but F has {F.shape[0]}")
    D = dominance_matrix(F, eps=eps)  # D[j, i]: j dominates i
    sim = behavior_similarity(B)
    return -(D.T * sim).sum(axis=1)


def sample_parent(eta, *, temperature: float, rng: np.random.Generator) -> int:
    """Draw an index from ``softmax(eta / temperature)``.

    Shifts by the max before exponentiating, so any finite ``eta`` works. O(n).
    """
    T = as_scalar("temperature", temperature, low=0.0, strict_low=True)
    eta = as_array("eta", eta, ndim=1, allow_empty=False)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    z = eta / T
    p = np.exp(z - z.max())
    p /= p.sum()
    # Inverse-CDF draw: one uniform, no dependence on rng.choice's internals.
    u = rng.random()
    idx = int(np.searchsorted(np.cumsum(p), u, side="right"))
    return min(idx, eta.shape[0] - 1)


def task_regret(acc) -> np.ndarray:
    """Per-task regret ``rho(tau) = max_h Acc(h, tau) - mean_h Acc(h, tau)`` for ``acc`` (n_harness, n_task).

    O(n_harness n_task). MILO App. A.1 (curriculum).
    """
    acc = as_array("acc", acc, ndim=2)
    if acc.shape[0] == 0:
        raise ValueError("acc: needs at least one harness row")
    return acc.max(axis=0) - acc.mean(axis=0)


def most_dissimilar(B, k: int) -> np.ndarray:
    """The ``k`` most behavior-dissimilar rows of ``B`` (n, m), for island initialization.

    Rule (greedy farthest-point on the L1 distance between behavior rows):

    * ``k = 0``: empty; ``k = 1``: the row with the largest total L1 distance
      to all others (ties -> lower index);
    * ``k >= 2``: start with the most distant pair (ties -> lexicographically
      smallest ``(i, j)``, ``i < j``), then repeatedly add the row whose minimum
      distance to the chosen rows is largest (ties -> lower index).

    Returned in pick order. O(n^2 m + n k). MILO §4.2 (initialization).
    """
    B = as_array("B", B, ndim=2)
    n = B.shape[0]
    k = as_int("k", k)
    if k > n:
        raise ValueError(f"k: asked for {k} rows but B has only {n}")
    if k == 0:
        return np.empty(0, dtype=np.intp)
    dist = np.abs(B[:, None, :] - B[None, :, :]).sum(axis=2)
    if k == 1:
        return np.array([int(np.argmax(dist.sum(axis=1)))], dtype=np.intp)
    iu = np.triu_indices(n, 1)
    best = int(np.argmax(dist[iu]))  # row-major upper triangle = lexicographic (i, j)
    chosen = [int(iu[0][best]), int(iu[1][best])]
    mind = np.minimum(dist[chosen[0]], dist[chosen[1]])
    taken = np.zeros(n, dtype=bool)
    taken[chosen] = True
    while len(chosen) < k:
        cand = np.where(taken, -np.inf, mind)
        nxt = int(np.argmax(cand))
        chosen.append(nxt)
        taken[nxt] = True
        mind = np.minimum(mind, dist[nxt])
    return np.asarray(chosen, dtype=np.intp)
