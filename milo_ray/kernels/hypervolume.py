"""Exact hypervolume, exclusive contributions and delta-HV for maximized objectives.

Used by MILO's admission bookkeeping (MILO §4.2, DESIGN §4.1: ``dHV = HV(H+ u
{child}) - HV(H+)``, measured from the origin).  Conventions:

* every axis is **maximized**; ``ref`` defaults to the origin;
* a point contributes only where it is strictly above ``ref`` on every axis
  (points on or below ``ref`` on some axis have an empty box and are dropped);
* internally points are shifted so that ``ref`` is the origin.

Algorithms (n points, d axes):

* d = 1: the largest coordinate, O(n).
* d = 2: sort by x descending + running max of y, O(n log n), vectorized.
* d = 3: sweep in z (descending) over the xy staircase, O(n log n)
  comparisons plus O(n^2) worst-case element moves (negligible in practice);
  compiled (``_sweep3d``) from ``_COMPILED_HV3_MIN_POINTS`` points on, a
  Python loop over sorted lists below that.
* d >= 4: exact dimension sweep (slice on the last axis, recurse on the
  prefixes down to the 3-D sweep), O(n^{d-2} log n).

Exclusive contributions use the leave-one-out definition
``HV(X) - HV(X minus {p})``: dominated and duplicated points get 0, and a
dominated point does reduce its dominator's contribution.  See
``hv_contributions`` for the fast 2-D/3-D formulas; 3-D fronts in general
position (no ties, no dominated rows) go through the compiled z-sweep of
``_sweep3d`` that keeps one exclusive-volume account per staircase point.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from types import ModuleType

import numpy as np

from milo_ray.kernels._validate import as_array

__all__ = ["hypervolume", "hv_contributions", "delta_hv"]

# Above this many non-dominated points the O(n^2)-memory 3-D contribution grid
# would need more than ~200 MB, so the leave-one-out path is used instead.
_GRID_MAX_POINTS = 4000

# Below this many points the 3-D volume sweep runs as a Python loop (under
# ~100 us).  MILO's admission computes small 3-D volumes in every island actor,
# and those processes should not pay numba's import and cache load (~0.6 s,
# several seconds on the very first compile) for fronts of a few dozen points.
_COMPILED_HV3_MIN_POINTS = 128


@functools.cache
def _compiled() -> ModuleType:
    """The numba sweeps, imported on first use (see ``_COMPILED_HV3_MIN_POINTS``)."""
    from milo_ray.kernels import _sweep3d

    return _sweep3d


# --------------------------------------------------------------------------- input


def _points_and_ref(points, ref, *, name: str = "points") -> tuple[np.ndarray, np.ndarray]:
    P = as_array(name, points, ndim=2)
    d = P.shape[1]
    if d == 0:
        raise ValueError(f"{name}: needs at least one objective column, got shape {P.shape}")
    if ref is None:
        r = np.zeros(d)
    else:
        r = as_array("ref", ref, ndim=1)
        if r.shape[0] != d:
            raise ValueError(f"ref: has {r.shape[0]} coordinates but {name} has {d} columns")
    return P, r


def _shift(P: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shift to ``ref = 0`` and keep rows strictly above it; returns (shifted rows, their indices).

    The result may be ``P`` itself (origin reference): callers only read it.
    """
    Q = P - r if r.any() else P
    if Q.size == 0 or Q.min() > 0:
        return Q, np.arange(Q.shape[0])
    # Column by column: a reduction over a short trailing axis is several times slower.
    ok = Q[:, 0] > 0
    for ax in range(1, Q.shape[1]):
        ok &= Q[:, ax] > 0
    if ok.all():
        return Q, np.arange(Q.shape[0])
    keep = np.flatnonzero(ok)
    return Q[keep], keep


# --------------------------------------------------------------------------- volumes (ref = 0, all > 0)


def _hv2(Q: np.ndarray) -> float:
    order = np.argsort(-Q[:, 0], kind="stable")
    xs = Q[order, 0]
    ys = np.maximum.accumulate(Q[order, 1])
    widths = xs - np.append(xs[1:], 0.0)
    return float(np.dot(widths, ys))


def _hv3(Q: np.ndarray) -> float:
    """z-sweep over a 2-D staircase (x non-decreasing, y strictly descending)."""
    if Q.shape[0] >= _COMPILED_HV3_MIN_POINTS:
        return float(_compiled().hypervolume3(np.ascontiguousarray(Q)))
    order = np.argsort(-Q[:, 2], kind="stable")
    S = Q[order]
    zc = S[:, 2]
    # gaps[k] = z_{k-1} - z_k: the slab swept before point k is inserted.
    gaps = np.concatenate(([0.0], zc[:-1] - zc[1:])).tolist()
    xl, yl = S[:, 0].tolist(), S[:, 1].tolist()
    # Sentinels (x=0, y=inf) and (x=inf, y=0) remove every bounds check from the loop.
    xs: list[float] = [0.0, np.inf]
    ys: list[float] = [np.inf, 0.0]
    area = 0.0
    vol = 0.0
    bis = bisect_left
    for x, y, g in zip(xl, yl, gaps):
        vol += area * g
        pos = bis(xs, x)
        yright = ys[pos]
        if yright >= y:
            continue  # weakly dominated in the xy-plane by an earlier (higher-z) point
        # An earlier point with the same x and a lower y stays, right after the
        # new one, as a zero-width step: it adds no area and is removed with
        # the new point's left part later, so no equality test is needed here.
        yleft = ys[pos - 1]
        if yleft > y:
            # Nothing is removed: the gain is one rectangle.
            area += (x - xs[pos - 1]) * (y - yright)
            xs.insert(pos, x)
            ys.insert(pos, y)
            continue
        if ys[pos - 2] > y:
            # Exactly one point (pos - 1) is removed: replace it in place.
            xp = xs[pos - 1]
            xleft = xs[pos - 2]
            # Same grouping as the general branch below, so the sum is bit-identical.
            area += y * (x - xleft) - ((xp - xleft) * yleft + (x - xp) * yright)
            xs[pos - 1] = x
            ys[pos - 1] = y
            continue
        hi = pos
        a = pos
        while ys[a - 1] <= y:
            a -= 1
        xleft = xs[a - 1]
        covered = 0.0
        prev = xleft
        for j in range(a, hi):
            xj = xs[j]
            covered += (xj - prev) * ys[j]
            prev = xj
        covered += (x - prev) * yright
        area += y * (x - xleft) - covered
        xs[a:hi] = [x]
        ys[a:hi] = [y]
    return vol + area * float(zc[-1])


def _hv_sweep(Q: np.ndarray, base: int) -> float:
    """Exact dimension sweep on the last axis, recursing until ``base`` dimensions."""
    n, d = Q.shape
    if n == 0:
        return 0.0
    if d <= base:
        return _hv_fast(Q)
    order = np.argsort(-Q[:, -1], kind="stable")
    S = Q[order]
    c = S[:, -1]
    nxt = np.append(c[1:], 0.0)
    total = 0.0
    for k in range(n):
        w = c[k] - nxt[k]
        if w > 0:
            total += w * _hv_sweep(S[: k + 1, :-1], base)
    return total


def _hv_fast(Q: np.ndarray) -> float:
    n, d = Q.shape
    if n == 0:
        return 0.0
    if d == 1:
        return float(Q[:, 0].max())
    if d == 2:
        return _hv2(Q)
    if d == 3:
        return _hv3(Q)
    return _hv_sweep(Q, 3)


def _hv_general(points, ref=None) -> float:
    """Reference path: dimension sweep all the way down to 1-D (used to cross-check the fast paths)."""
    P, r = _points_and_ref(points, ref)
    Q, _ = _shift(P, r)
    return _hv_sweep(Q, 1)


def hypervolume(points, /, *, ref=None) -> float:
    """Exact hypervolume of ``points`` (n, d), all axes maximized, measured from ``ref`` (default origin).

    Complexity: O(n log n) for d <= 3, O(n^{d-2} log n) for d >= 4 (see the
    module docstring).  Empty input gives 0.0.  MILO §4.2.
    """
    P, r = _points_and_ref(points, ref)
    Q, _ = _shift(P, r)
    return _hv_fast(Q)


# --------------------------------------------------------------------------- contributions


def _dominance_flags(Q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: (strictly dominated by a different row, has an identical twin, weakly dominates another row)."""
    n = Q.shape[0]
    strict = np.zeros(n, dtype=bool)
    twin = np.zeros(n, dtype=bool)
    dominator = np.zeros(n, dtype=bool)
    step = max(1, 2_000_000 // max(n * Q.shape[1], 1))
    idx = np.arange(n)
    for s in range(0, n, step):
        blk = Q[s : s + step]
        rows = np.arange(blk.shape[0])
        W = blk[:, None, 0] >= Q[None, :, 0]  # W[i, j]: row s+i >= row j on every axis
        E = blk[:, None, 0] == Q[None, :, 0]
        for ax in range(1, Q.shape[1]):
            W &= blk[:, None, ax] >= Q[None, :, ax]
            E &= blk[:, None, ax] == Q[None, :, ax]
        W[rows, idx[s : s + step]] = False
        E[rows, idx[s : s + step]] = False
        strict |= (W & ~E).any(axis=0)
        twin[s : s + step] = E.any(axis=1)
        dominator[s : s + step] = W.any(axis=1)
    return strict, twin, dominator


def _leave_one_out(Q: np.ndarray, i: int) -> float:
    """HV(X) - HV(X minus {i}) = vol(box_i) - HV({min(q, x_i) : q != i}), no big-number subtraction of HVs."""
    p = Q[i]
    others = np.minimum(np.delete(Q, i, axis=0), p)
    others = others[np.all(others > 0, axis=1)]
    return float(np.prod(p)) - _hv_fast(others)


def _contrib2_clean(N: np.ndarray) -> np.ndarray:
    """2-D exclusive boxes of mutually non-dominated distinct points: (x - x_left) * (y - y_right)."""
    order = np.argsort(N[:, 0], kind="stable")
    xs, ys = N[order, 0], N[order, 1]
    out = np.empty(N.shape[0])
    out[order] = (xs - np.concatenate(([0.0], xs[:-1]))) * (ys - np.append(ys[1:], 0.0))
    return out


def _contrib3_grid(N: np.ndarray) -> np.ndarray:
    """3-D exclusive contributions of mutually non-dominated points via the xy height field.

    On the (n+1) x (n+1) grid of x/y ranks, each cell's owner is the point with
    the highest z among the points covering it; the exclusive volume of the owner
    above the cell is ``z_owner - h2``, where ``h2`` (the best other cover) is a
    grid lookup: covers with a higher x rank are ``H1[xr+1, b]``, covers with a
    higher y rank are ``H1[a, yr+1]``, and no other point can cover the cell
    without being dominated by the owner.  Only valid for points that dominate
    no other point (the caller fixes up the rest).  O(n^2) time and memory.
    """
    n = N.shape[0]
    m = n + 1
    x, y, z = N[:, 0], N[:, 1], N[:, 2]
    xo = np.argsort(x, kind="stable")
    yo = np.argsort(y, kind="stable")
    zo = np.argsort(z, kind="stable")
    # Rank arrays carry one extra slot: index n is a dummy "no cover" point.
    xr = np.empty(m, dtype=np.intp)
    yr = np.empty(m, dtype=np.intp)
    zr = np.empty(n, dtype=np.int32)
    xr[xo] = np.arange(n)
    yr[yo] = np.arange(n)
    xr[n] = yr[n] = n - 1
    zr[zo] = np.arange(n, dtype=np.int32)
    G = np.full((m, m), -1, dtype=np.int32)
    G[xr[:n], yr[:n]] = zr
    # Suffix max over both axes: G[a, b] = highest z rank among points with xr >= a and yr >= b.
    R = G[::-1, ::-1]
    np.maximum.accumulate(R, axis=0, out=R)
    np.maximum.accumulate(R, axis=1, out=R)
    zs_ext = np.append(z[zo], 0.0)  # z rank -1 (no cover) -> height 0 (= ref)
    H1 = zs_ext[G].ravel()
    zo_ext = np.append(zo, n)  # z rank -1 -> dummy point n
    core = G[:n, :n]
    owner = zo_ext[core]
    rows = np.arange(n)[:, None]
    cols = np.arange(n)[None, :]
    h2 = np.maximum(H1[(xr[owner] + 1) * m + cols], H1[rows * m + (yr[owner] + 1)])
    xs = x[xo]
    ys = y[yo]
    wx = xs - np.concatenate(([0.0], xs[:-1]))
    wy = ys - np.concatenate(([0.0], ys[:-1]))
    vals = np.outer(wx, wy)
    vals *= zs_ext[core] - h2
    return np.bincount(owner.ravel(), weights=vals.ravel(), minlength=m)[:n]


def hv_contributions(points, /, *, ref=None) -> np.ndarray:
    """Exclusive hypervolume contribution ``HV(X) - HV(X minus {p})`` of every row (n,).

    Rows on or below ``ref`` on some axis, weakly dominated rows and duplicates
    get 0 (removing one duplicate leaves the volume unchanged, so neither copy
    gets credit).  A row that weakly dominates another row has that row's box
    subtracted from its own exclusive region.

    Complexity: d = 3 with mutually non-dominated rows and no tie on any axis
    (the usual front): one compiled z-sweep, O(n log n) for usual fronts
    (``_sweep3d.contributions3``).  Otherwise O(n^2 d) dominance flags, then
    d = 2: O(n log n) neighbour formula; d = 3: O(n^2) height-field grid
    (``_contrib3_grid``); rows that dominate other rows, d >= 4 and very large
    3-D fronts: one clipped hypervolume per row (O(n) hypervolume calls).
    MILO §4.2.
    """
    P, r = _points_and_ref(points, ref)
    Q, keep = _shift(P, r)
    n, d = Q.shape
    if d == 3 and n >= 2:
        fast, ok = _compiled().contributions3(np.ascontiguousarray(Q))
        if ok:
            if n == P.shape[0]:
                return fast
            out = np.zeros(P.shape[0])
            out[keep] = fast
            return out
    out = np.zeros(P.shape[0])
    if n == 0:
        return out
    if n == 1:
        out[keep[0]] = float(np.prod(Q[0]))
        return out
    strict, twin, dominator = _dominance_flags(Q)
    # One representative per group of identical rows still covers space for the others.
    _, first = np.unique(Q, axis=0, return_index=True)
    rep = np.zeros(n, dtype=bool)
    rep[first] = True
    cover = np.flatnonzero(~strict & rep)
    contrib = np.zeros(n)
    clean = ~strict & ~twin
    if d in (2, 3) and (d == 2 or cover.size <= _GRID_MAX_POINTS):
        fast = _contrib2_clean(Q[cover]) if d == 2 else _contrib3_grid(Q[cover])
        contrib[cover] = fast
        redo = np.flatnonzero(clean & dominator)
    else:
        redo = np.flatnonzero(clean)
    contrib[~clean] = 0.0
    for i in redo:
        contrib[i] = _leave_one_out(Q, int(i))
    out[keep] = contrib
    return out


def delta_hv(front, candidate, *, ref=None) -> float:
    """``HV(front u {candidate}) - HV(front)``, computed as the candidate's exclusive volume.

    Evaluated as ``vol(box(c)) - HV({min(f, c)})`` (one clipped hypervolume,
    no subtraction of two large volumes).  ``front`` may be empty (n = 0).
    Complexity: one hypervolume of at most n points.  MILO §4.2 (admission).
    """
    c = as_array("candidate", candidate, ndim=1, allow_empty=False)
    F = as_array("front", front, ndim=2)
    d = c.shape[0]
    if F.shape[0] == 0:
        F = np.empty((0, d))
    if F.shape[1] != d:
        raise ValueError(f"candidate: has {d} coordinates but front rows have {F.shape[1]}")
    if ref is None:
        r = np.zeros(d)
    else:
        r = as_array("ref", ref, ndim=1)
        if r.shape[0] != d:
            raise ValueError(f"ref: has {r.shape[0]} coordinates but candidate has {d}")
    cq = c - r
    if not np.all(cq > 0):
        return 0.0
    clipped = np.minimum(F - r, cq)
    clipped = clipped[np.all(clipped > 0, axis=1)]
    return float(np.prod(cq)) - _hv_fast(clipped)
