"""The three EinsteinArena problems of the instance-level track (MILO App. E; DESIGN §4.5):
exact scores, feasibility, the published anchors, and the reward of a run.

All three are minimizations. A construction is feasible when its score is defined
(:mod:`milo_ray.kernels.autocorr` raises naming the violated constraint otherwise);
:func:`check` turns that into a one-line reason, :func:`score` scores a feasible one
(FFT, float64), and :func:`reward` maps an optimizer's verified score to its task
reward: the normalized gain over the start.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from milo_ray.kernels import autocorr

PROBLEMS = autocorr.PROBLEMS

_SCORERS = {
    "first_autocorrelation": autocorr.first_autocorrelation,
    "third_autocorrelation": autocorr.third_autocorrelation,
    "erdos_minimum_overlap": autocorr.erdos_overlap,
}

# Published bounds (lower is better): papers/000 Table 13 and App. E. None: not published.
ANCHORS: dict[str, dict[str, float | None]] = {
    "first_autocorrelation": {"alphaevolve": 1.5052939684, "ttt_discover": 1.5028629,
                              "arena_prior": 1.5027436492, "milo_paper": 1.5027435984},
    "third_autocorrelation": {"alphaevolve": 1.4556427954, "ttt_discover": None,
                              "arena_prior": 1.4508066395, "milo_paper": 1.4488860143},
    "erdos_minimum_overlap": {"alphaevolve": 0.3809230351, "ttt_discover": 0.3808753,
                              "arena_prior": 0.3808585749, "milo_paper": 0.3808567744},
}

# The reward's scale: a gain of this fraction of the start's score earns reward 1. The
# records of App. E improve AlphaEvolve's constructions by 0.01-0.5%; a random start
# improves by tens of percent. A logarithmic map keeps both visible in [0, 1].
FULL_GAIN = 0.5
SMALLEST_GAIN = 1e-6


def problem_name(problem: Any) -> str:
    if problem not in _SCORERS:
        raise ValueError(f"problem: expected one of {PROBLEMS}, got {problem!r}")
    return str(problem)


def score(problem: str, values: Any) -> float:
    """The score (FFT, float64) of a feasible construction; ValueError naming the
    violated constraint otherwise."""
    return float(_SCORERS[problem_name(problem)](np.asarray(values, dtype=np.float64)))


def check(problem: str, values: Any) -> str | None:
    """None when ``values`` is a feasible construction of ``problem`` with a finite
    score, else a one-line reason."""
    try:
        h = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        return f"not a vector of numbers: {e}"[:300]
    if h.ndim != 1 or h.size < 2:
        return f"expected a 1-D vector of at least 2 step heights, got shape {h.shape}"
    if not np.all(np.isfinite(h)):
        return "non-finite heights (nan or inf)"
    try:
        s = score(problem, h)
    except ValueError as e:
        return str(e).splitlines()[0][:300]
    if not math.isfinite(s):
        return f"score is {s}"
    return None


def reward(start_score: float, new_score: float) -> float:
    """The task reward of reaching ``new_score`` from ``start_score`` (lower is better):
    0 when not strictly better, else the relative gain g = (start - new) / start on a
    log scale from ``SMALLEST_GAIN`` (reward 0) to ``FULL_GAIN`` (reward 1). Monotone:
    a lower score never earns less."""
    if not (math.isfinite(start_score) and math.isfinite(new_score)) or start_score <= 0:
        return 0.0
    gain = (start_score - new_score) / start_score
    if gain <= SMALLEST_GAIN:
        return 0.0
    r = math.log(gain / SMALLEST_GAIN) / math.log(FULL_GAIN / SMALLEST_GAIN)
    return float(min(1.0, max(0.0, r)))
