"""Evaluation metrics over a score matrix and their task-clustered intervals (MILO §5.2; DESIGN §4.4).

``S`` is (n_tasks, k): ``S[i, j]`` in [0, 1] scores attempt ``j`` on task ``i``
(fraction of tests passed; 1 is a full solve).

* ``pass@k = mean_i 1[max_j S_ij = 1]``
* ``PR@k   = mean_{i,j} S_ij``
* ``RR@k   = mean_{i,j} 1[S_ij = 1]``

``clustered_ci`` treats tasks as clusters: it reduces each task to its own
value of the chosen statistic (``v_i`` = row max indicator, row mean, or row
mean of full solves), whose plain mean equals the statistic because every task
has the same k attempts, and returns the Student-t interval
``mean +- t_{(1+level)/2, N-1} * sd(v) / sqrt(N)`` with ``sd`` the sample
standard deviation (ddof = 1).  This is the cluster-robust standard error for
balanced clusters: attempts on the same task are correlated, so they are never
counted as independent observations.  The interval is clipped to [0, 1], the
range every statistic lives in.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from milo_ray.kernels._validate import as_array, as_scalar, check_range

__all__ = ["pass_at_k", "pr_at_k", "rr_at_k", "per_task", "clustered_ci", "STATISTICS"]

STATISTICS = ("pass", "pr", "rr")


def _scores(S) -> np.ndarray:
    S = as_array("S", S, ndim=2)
    if S.shape[0] == 0 or S.shape[1] == 0:
        raise ValueError(f"S: needs at least one task and one attempt, got shape {S.shape}")
    check_range("S", S, low=0.0, high=1.0)
    return S


def per_task(S, *, statistic: str = "pr") -> np.ndarray:
    """Per-task values ``v_i`` whose mean is the chosen statistic (``"pass"``, ``"pr"`` or ``"rr"``). O(n k)."""
    S = _scores(S)
    if statistic == "pass":
        return (S.max(axis=1) == 1.0).astype(np.float64)
    if statistic == "pr":
        return S.mean(axis=1)
    if statistic == "rr":
        return (S == 1.0).mean(axis=1)
    raise ValueError(f"statistic: expected one of {STATISTICS}, got {statistic!r}")


def pass_at_k(S) -> float:
    """Fraction of tasks solved fully in at least one of the k attempts. O(n k). MILO §5.2."""
    return float(per_task(S, statistic="pass").mean())


def pr_at_k(S) -> float:
    """Pass rate: mean partial-credit score over all tasks and attempts. O(n k). MILO §5.2."""
    return float(per_task(S, statistic="pr").mean())


def rr_at_k(S) -> float:
    """Resolution rate: fraction of all attempts that are full solves. O(n k). MILO §5.2."""
    return float(per_task(S, statistic="rr").mean())


def clustered_ci(S, *, level: float = 0.95, statistic: str = "pr") -> tuple[float, float, float]:
    """``(mean, low, high)``: task-clustered Student-t interval for pass@k, PR@k or RR@k.

    See the module docstring for the estimator.  Needs at least two tasks
    (one cluster has no spread to estimate).  O(n k).  MILO §5.2.
    """
    level = as_scalar("level", level, low=0.0, strict_low=True)
    if not level < 1.0:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    v = per_task(S, statistic=statistic)
    n = v.shape[0]
    if n < 2:
        raise ValueError(f"S: a task-clustered interval needs at least 2 tasks, got {n}")
    mean = float(v.mean())
    half = float(stats.t.ppf(0.5 + level / 2.0, df=n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)
