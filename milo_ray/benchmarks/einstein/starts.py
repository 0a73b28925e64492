"""Starting constructions, rebuilt deterministically from a task's ``start`` spec.

A spec is ``{"base": ..., "n": ..., "perturb": ..., "seed": ...}``:

* ``base``: ``alphaevolve`` (the published construction, ``milo_ray/data/
  alphaevolve_constructions.json``, refined to ``n`` points), ``constant`` (the flat
  function) or ``random`` (uniform heights, seeded);
* ``n``: grid points. An AlphaEvolve start is refined by repeating each height, which
  keeps the step function, and so its score, exactly; ``n`` must then be a multiple of
  the published length;
* ``perturb``: relative multiplicative noise (0: none), seeded, then projected back to
  the problem's constraints;
* ``seed``: the noise seed.

Workers call :func:`start_values` from a task's metadata, so nothing large travels with
a task.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import numpy as np

from milo_ray.benchmarks.einstein.problems import problem_name

BASES = ("alphaevolve", "constant", "random")


@lru_cache(maxsize=None)
def published(problem: str) -> tuple[float, ...]:
    """AlphaEvolve's published construction of ``problem`` (source: google-deepmind/
    alphaevolve_results, Apache-2.0; see milo_ray/data/README.md)."""
    data = json.loads((resources.files("milo_ray") / "data" / "alphaevolve_constructions.json").read_text())
    return tuple(float(x) for x in data[problem_name(problem)])


def refine(values: Any, factor: int) -> np.ndarray:
    """The same step function on ``factor`` times as many points (each height repeated):
    every problem's score is unchanged."""
    if int(factor) < 1:
        raise ValueError(f"refine: factor={factor} must be >= 1")
    return np.repeat(np.asarray(values, dtype=np.float64), int(factor))


def project(problem: str, h: np.ndarray) -> np.ndarray:
    """The nearest feasible construction in the simple sense each problem needs:
    heights >= 0 (first), unchanged (third), heights in [0, 1] with sum n/2 (Erdős, by
    bisection on a shift)."""
    problem = problem_name(problem)
    h = np.asarray(h, dtype=np.float64).copy()
    if problem == "first_autocorrelation":
        return np.maximum(h, 0.0)
    if problem == "third_autocorrelation":
        return h
    target = h.size / 2.0
    lo, hi = -1.0 - h.max(), 1.0 - h.min()
    for _ in range(200):  # sum(clip(h + c, 0, 1)) is monotone in c
        mid = (lo + hi) / 2.0
        if np.clip(h + mid, 0.0, 1.0).sum() < target:
            lo = mid
        else:
            hi = mid
    out = np.clip(h + (lo + hi) / 2.0, 0.0, 1.0)
    # The bisection leaves a residual ~1e-12 * n: spread it over the interior heights.
    inner = (out > 0.0) & (out < 1.0)
    if inner.any():
        out[inner] += (target - out.sum()) / inner.sum()
    return np.clip(out, 0.0, 1.0)


def start_values(spec_or_metadata: Mapping[str, Any], problem: str | None = None) -> np.ndarray:
    """The start of a task: ``spec_or_metadata`` is a task's metadata (with ``problem``
    and ``start``) or a bare start spec (then give ``problem``)."""
    meta = dict(spec_or_metadata)
    if "start" in meta:
        problem, spec = meta["problem"], dict(meta["start"])
    else:
        spec = meta
    if problem is None:
        raise ValueError("start_values: no problem (give task metadata or problem=)")
    problem = problem_name(problem)
    base, n = str(spec.get("base", "alphaevolve")), int(spec.get("n", 0))
    perturb, seed = float(spec.get("perturb", 0.0)), int(spec.get("seed", 0))
    rng = np.random.default_rng(seed)
    if base == "alphaevolve":
        pub = np.asarray(published(problem))
        n = n or pub.size
        if n % pub.size:
            raise ValueError(f"start.n={n}: an alphaevolve start refines the published {pub.size} points, so n must "
                             f"be a multiple of {pub.size}")
        h = refine(pub, n // pub.size)
    elif base == "constant":
        if n < 2:
            raise ValueError(f"start.n={n}: give at least 2 grid points")
        h = np.full(n, 0.5 if problem == "erdos_minimum_overlap" else 1.0)
    elif base == "random":
        if n < 2:
            raise ValueError(f"start.n={n}: give at least 2 grid points")
        h = rng.uniform(0.0, 1.0, n) if problem != "third_autocorrelation" else rng.uniform(-0.2, 1.0, n)
        rng = np.random.default_rng(seed + 1)  # the noise below is independent of the draw
    else:
        raise ValueError(f"start.base={base!r}: choose one of {BASES}")
    if perturb < 0:
        raise ValueError(f"start.perturb={perturb}: must be >= 0")
    if perturb:
        h = h * (1.0 + perturb * rng.standard_normal(h.size))
    return project(problem, h)
