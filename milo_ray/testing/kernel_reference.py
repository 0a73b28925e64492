"""Slow, obviously-correct reference implementations the kernel tests and benchmarks
compare against. Not for use in the search itself."""

from __future__ import annotations

import numpy as np

from milo_ray.kernels.submodular import _gains


def naive_greedy(w, q, S) -> np.ndarray:
    """RER's greedy done the naive way: recompute every remaining gain after each pick,
    argmax with ties to the lower index. O(n^2 k)."""
    n = len(w)
    C = np.zeros(n)
    remaining = list(range(n))
    order = []
    while remaining:
        g = _gains(np.asarray(remaining), 1.0 / (1.0 + C), w, q, S)
        i = remaining.pop(int(np.argmax(g)))
        order.append(i)
        C = C + q[i] * S[i]
    return np.asarray(order, dtype=np.intp)
