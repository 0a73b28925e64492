"""Exclusive 3-D hypervolume contributions of a general-position front, vectorized.

Private helper of ``hypervolume.hv_contributions`` for the common case: points
(shifted so that ``ref`` is the origin, all coordinates > 0) that are mutually
non-dominated and have pairwise distinct coordinates on every axis.  Anything
else returns ``None`` and the caller uses its general path.

The idea is the z-sweep of the 3-D hypervolume (points inserted in z-descending
order into the xy staircase of the points above them), but instead of running
the sweep point by point, every fact the sweep needs is read off a few n x n
boolean relations at once:

* ``L(i)``: the staircase neighbour on the left when ``i`` is inserted = the
  highest-x earlier point with a larger y;
* ``R(i)``: the neighbour below/right = the highest-y earlier point with a
  larger x;
* ``kill(i)``: the point that removes ``i`` from the staircase = the first later
  point whose xy-rectangle contains ``i``'s.

While ``s`` is on the staircase, its exclusive xy-region is the rectangle
``(X, x_s] x (Y, y_s]`` between its current neighbours, minus the rectangles of
the points ``s`` itself removed on insertion ("killed" points; no other point
can cover that rectangle).  ``X`` only grows, each time a later point ``i`` is
inserted as its new left neighbour (``R(i) = s``); ``Y`` likewise when
``L(i) = s``.  So each point's exclusive volume is a sum, over the events of
its own timeline (insertion, neighbour changes, removal), of the slab height
between events times the region's area; the region is cut into vertical strips
at the killed points' x so that every term is a product of non-negative
differences (no cancellation between large volumes).

Cost: O(n^2) work in about a dozen uint8/bool array operations for the three
relations, then O(n log n) for sorting O(n) events and strips; memory O(n^2)
bytes.  Reference: the box decomposition of Emmerich & Fonseca (2011),
"Computing hypervolume contributions in low dimensions: asymptotically optimal
algorithm and complexity results".
"""

from __future__ import annotations

import numpy as np

# Per-size "j < i" masks; small and read-only, so reused across calls.
_TRIANGLES: dict[int, np.ndarray] = {}
_TRIANGLE_CACHE_MAX_N = 1024


def _earlier_mask(n: int, arr: np.ndarray) -> np.ndarray:
    T = _TRIANGLES.get(n)
    if T is None:
        T = arr[:, None] < arr  # T[j, i]: j comes before i in the sweep
        T.flags.writeable = False
        if n <= _TRIANGLE_CACHE_MAX_N:
            _TRIANGLES[n] = T
    return T


def contributions_3d_general_position(Q: np.ndarray) -> np.ndarray | None:
    """Exclusive contributions of the rows of ``Q`` (n >= 2, 3 columns, all > 0), or ``None``.

    ``None`` means the fast path does not apply (a tie on some axis, or a row
    dominated by another row); the result is then left to the caller's
    general algorithm.
    """
    n = Q.shape[0]
    zo = np.argsort(Q[:, 2])[::-1]
    Qz = Q[zo]
    x, y, z = Qz[:, 0], Qz[:, 1], Qz[:, 2]  # sweep order: z descending
    xo = np.argsort(x)
    yo = np.argsort(y)
    xs, ys = x[xo], y[yo]
    if (xs[1:] == xs[:-1]).any() or (ys[1:] == ys[:-1]).any() or (z[1:] == z[:-1]).any():
        return None
    small = n < 255  # ranks (+1) and n - j fit in uint8: the n x n passes are 8-bit
    rdt = np.uint8 if small else np.uint16
    ar = np.arange(n)
    arr = ar.astype(rdt)
    xr = np.empty(n, rdt)
    xr[xo] = arr
    yr = np.empty(n, rdt)
    yr[yo] = arr
    # Relations as [j, i] matrices (reductions over axis 0 run along contiguous rows).
    Xg = xr[:, None] > xr  # x_j > x_i
    Yg = yr[:, None] > yr  # y_j > y_i
    T = _earlier_mask(n, arr)
    # kill(i) = the first such j: max of n - j; L(i) / R(i) = the highest x / y:
    # rank + 1, 0 = none.
    pairs = ((Xg, Yg, n - arr), (T, Yg, xr + 1), (T, Xg, yr + 1))
    if small:
        # Layout [j, relation, i]: the max over j then runs over rows of 3n bytes.
        M = np.empty((n, 3, n), bool)
        V = np.empty((n, 3, 1), rdt)
        for k, (a, b, v) in enumerate(pairs):
            np.logical_and(a, b, out=M[:, k])
            V[:, k, 0] = v
        # 0/1 -> 0/255 masks, then AND with the values: two cheap 8-bit passes
        # (a bool-by-uint8 multiply goes through a slow casting loop).
        Mu = M.view(np.uint8)
        np.negative(Mu, out=Mu)
        kv, lv, rv = np.bitwise_and(Mu, V, out=Mu).max(axis=0)
    else:
        # One relation at a time keeps the peak memory at a few n x n arrays.
        K = np.empty((n, n), bool)
        buf = np.empty((n, n), rdt)
        kv, lv, rv = (
            np.multiply(np.logical_and(a, b, out=K), v[:, None], out=buf).max(axis=0) for a, b, v in pairs
        )
    if (kv > n - arr).any():
        return None  # an earlier (higher-z) point contains it: dominated
    iL = np.flatnonzero(lv)
    iR = np.flatnonzero(rv)
    iK = np.flatnonzero(kv)
    lv = lv.astype(np.intp)
    rv = rv.astype(np.intp)
    kill = n - kv[iK].astype(np.intp)
    xi = xr.astype(np.intp) + 1
    yi = yr.astype(np.intp) + 1
    nL, nR, nK = iL.size, iR.size, iK.size

    # Events (owner, time): insertion (X = x_L, Y = y_R), a new right neighbour
    # (Y := y_i), a new left neighbour (X := x_i), removal (X := x_owner, so the
    # region is empty from then on).  X and Y are stored as rank + 1 (0 = ref).
    owner = np.concatenate((ar, xo[lv[iL] - 1], yo[rv[iR] - 1], iK))
    time = np.concatenate((ar, iL, iR, kill))
    ex = np.concatenate((lv, np.zeros(nL, np.intp), xi[iR], xi[iK]))
    ey = np.concatenate((rv, yi[iL], np.zeros(nR + nK, np.intp)))
    key = owner * n + time
    order = np.argsort(key.astype(np.uint16) if small else key, kind="stable")
    owner = owner[order]
    # Both coordinates only grow along an owner's timeline: a running max per
    # owner (offset by owner so groups cannot leak into each other).
    base = owner * (n + 1)
    ex = ex[order]
    ex += base
    np.maximum.accumulate(ex, out=ex)
    ex -= base
    ey = ey[order]
    ey += base
    np.maximum.accumulate(ey, out=ey)
    ey -= base
    X = np.concatenate(([0.0], xs))[ex]
    Y = np.concatenate(([0.0], ys))[ey]
    # Slab below each event: down to the owner's next event, or to the ref (z = 0).
    ze = z[time[order]]
    dz = ze.copy()
    dz[:-1] -= ze[1:]
    last = np.flatnonzero(owner[1:] != owner[:-1])
    dz[last] = ze[last]
    xw = x[owner]
    yw = y[owner]

    if nK == 0:
        w = (xw - X) * (yw - Y) * dz
        vals = np.bincount(owner, weights=w, minlength=n)
    else:
        # Killed points of each owner by x: strip k spans (x_{k-1}, x_k] above y_k.
        kk = kill * (n + 1) + xi[iK]
        ks = np.argsort(kk.astype(np.uint16) if small else kk, kind="stable")
        dk = iK[ks]
        ko = kill[ks]
        dx = x[dk]
        dy = y[dk]
        first = np.ones(dk.size, bool)
        first[1:] = ko[1:] != ko[:-1]
        left = np.empty(dk.size)
        left[0] = 0.0
        left[1:] = dx[:-1]
        left[first] = 0.0
        cnt = np.bincount(ko, minlength=n)
        lastx = np.zeros(n)
        lastx[ko] = dx  # sorted by x, so the last write is the owner's rightmost killed point
        # Rightmost strip (x_last_killed, x_s] above Y.
        w = xw - np.maximum(lastx[owner], X)
        np.maximum(w, 0.0, out=w)
        w *= yw - Y
        w *= dz
        vals = np.bincount(owner, weights=w, minlength=n)
        # Strips above killed points: one term per (event, killed point of its owner).
        reps = cnt[owner]
        pe = np.repeat(np.arange(owner.size), reps)
        start = np.cumsum(cnt) - cnt
        ps = np.arange(pe.size) + np.repeat(start[owner] - (np.cumsum(reps) - reps), reps)
        po = owner[pe]
        w = dx[ps] - np.maximum(left[ps], X[pe])
        np.maximum(w, 0.0, out=w)
        w *= y[po] - np.maximum(Y[pe], dy[ps])
        w *= dz[pe]
        vals += np.bincount(po, weights=w, minlength=n)
    out = np.empty(n)
    out[zo] = vals
    return out
