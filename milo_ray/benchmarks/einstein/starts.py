"""Starting constructions, rebuilt deterministically from a task's ``start`` spec.

A spec is ``{"base": ..., "n": ..., "perturb": ..., "seed": ...}``:

* ``base``: ``alphaevolve`` (the published construction, ``milo_ray/data/
  alphaevolve_constructions.json``, refined to ``n`` points), ``constant`` (the flat
  function), ``random`` (uniform heights, seeded) or ``file`` (a construction stored at
  ``path``: what ``python -m milo_ray.einstein best`` wrote, so a run can start where an
  earlier one ended; ``digest`` pins its content, see :func:`construction_digest`);
* ``n``: grid points. An AlphaEvolve start is refined by repeating each height, which
  keeps the step function, and so its score, exactly; ``n`` must then be a multiple of
  the published length;
* ``perturb``: relative multiplicative noise (0: none), seeded, then projected back to
  the problem's constraints;
* ``seed``: the noise seed.

Workers call :func:`start_values` from a task's metadata, so nothing large travels with
a task. A ``file`` start's construction travels as content: the benchmark packs it on the
driver (:func:`ship_construction`, into ``spec["files"]``) and a worker reads the copy its
node unpacked (:mod:`milo_ray.boundary.shipping`), never the driver's path.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from importlib import resources
from typing import Any, Mapping

import numpy as np

from milo_ray.benchmarks.einstein.problems import problem_name
from milo_ray.boundary.shipping import ShippedTree

BASES = ("alphaevolve", "constant", "random", "file")


@lru_cache(maxsize=None)
def published(problem: str) -> tuple[float, ...]:
    """AlphaEvolve's published construction of ``problem`` (source: google-deepmind/
    alphaevolve_results, Apache-2.0; see milo_ray/data/README.md)."""
    data = json.loads((resources.files("milo_ray") / "data" / "alphaevolve_constructions.json").read_text())
    return tuple(float(x) for x in data[problem_name(problem)])


def load_construction(path: str | Path, problem: str) -> np.ndarray:
    """The heights stored at ``path``: a JSON object ``{"problem", "values", ...}`` (the
    records command's ``<problem>.json``) or a bare JSON list. ``ValueError`` names the
    path when it is missing, unreadable, of another problem or not a vector of numbers."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"start.path={str(path)!r}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ValueError(f"start.path={str(path)!r}: not JSON ({exc})") from None
    if isinstance(data, dict):
        if data.get("problem", problem) != problem:
            raise ValueError(f"start.path={str(path)!r}: holds a construction of {data.get('problem')!r}, not of "
                             f"{problem!r}")
        data = data.get("values")
    try:
        h = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        h = np.empty(0)
    if h.ndim != 1 or h.size < 2 or not np.isfinite(h).all():
        raise ValueError(f"start.path={str(path)!r}: expected a list of at least 2 finite heights (or an object "
                         "with one under \"values\")")
    return h


CONSTRUCTION_FILE = "construction.json"


def ship_construction(path: str | Path) -> Any:
    """A ``file`` start's construction packed for the nodes that run its tasks (the
    ``files`` of its spec)."""

    return ShippedTree.pack({CONSTRUCTION_FILE: path}, origin=str(path))


def construction_digest(values: Any) -> str:
    """A short content hash of a construction (its float64 bytes): a ``file`` start's
    task id and the check that the file still holds what the run started from."""
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float64).tobytes()).hexdigest()[:16]


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
    elif base == "file":
        files = spec.get("files")
        stored = load_construction(spec["path"] if files is None else files.local_path() / CONSTRUCTION_FILE, problem)
        digest = spec.get("digest")
        if digest and construction_digest(stored) != digest:
            raise ValueError(f"start.path={spec['path']!r}: the file changed since this run's tasks were built from "
                             f"it (content {construction_digest(stored)}, expected {digest}); restore it or start "
                             "a new run")
        n = n or stored.size
        if n % stored.size:
            raise ValueError(f"start.n={n}: a file start refines its {stored.size} points, so n must be a multiple "
                             f"of {stored.size}")
        h = refine(stored, n // stored.size)
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
