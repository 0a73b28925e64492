"""Seed optimizer ``lse_lbfgs``: the log-sum-exp smoothed max over shifts, minimized
with L-BFGS-B in stages of decreasing temperature, then polished cold.

Stages: ``ladder`` (hot -> cold L-BFGS rungs), ``polish`` (repeated cold L-BFGS runs
from the best verified point until the stage's time is up). Works for the three
problems: bounds h >= 0 (first), none (third), [0, 1] with the sum n/2 kept by
reparametrization (Erdős). Only strictly better, feasible, exactly (FFT) scored
points are published.
"""

import math
import time

import numpy as np
from scipy.optimize import Bounds, minimize

# Given by the runner as module globals (the problem's formulas, the ratchet and the
# stage driver; see the seeds' README): ERDOS, FIRST, best, best_score, offer, project,
# run_stages, smooth_value_grad.

CONFIG = {
    "t_hot": 1e-2,          # hottest rung's temperature, relative to the current score
    "t_cold": 1e-5,         # coldest rung's temperature, relative to the current score
    "rungs": 5,             # temperatures of the ladder
    "t_polish": 1e-6,       # first polishing temperature, relative to the current score
    "polish_cool": 0.3,     # polishing temperature factor after a run that did not improve
    "polish_floor": 1e-9,   # polishing stops below this relative temperature
    "polish_maxiter": 400,  # L-BFGS iterations per polishing run
    "lbfgs_maxiter": 2000,  # L-BFGS iterations per ladder rung
    "lbfgs_memory": 10,     # L-BFGS correction pairs
    "erdos_sum_weight": 100.0,  # Erdős: penalty on (sum h - n/2)^2 / n inside L-BFGS
    "margin_s": 0.05,       # return this long before the deadline at least ...
    "margin_frac": 0.02,    # ... or this fraction of the budget
}

STAGES = ["ladder", "polish"]


def optimize(values, *, seed, deadline):
    """Run STAGES in order from ``values`` with the runner's ``run_stages`` (each stage an
    equal share of the time left); returns the best verified point before ``deadline``."""
    return run_stages(values, seed=seed, deadline=deadline, stages=STAGES,
                      margin_s=CONFIG["margin_s"], margin_frac=CONFIG["margin_frac"])


# ---------------------------------------------------------------- L-BFGS on the smoothed max


class _OutOfTime(Exception):
    pass


def _normalize(h, problem):
    """First/third scores are scale-invariant: keep heights O(1) so step lengths and
    the optimizer's tolerances mean the same thing at every stage."""
    if problem == ERDOS:
        return h
    m = abs(float(np.mean(h)))
    return h / m if m > 0 else h


def lbfgs_smooth(h, temperature, problem, deadline, maxiter):
    """Minimize the smoothed max at ``temperature`` with L-BFGS-B from ``h``; returns
    the point of lowest objective seen (feasible after ``project``). Bounds: h >= 0
    (first), [0, 1] (Erdős). Erdős's sum n/2 is a quadratic penalty, not a
    reparametrization: a shift that restores the sum inside the optimizer would let
    heights leave [0, 1], where the smoothed value is lower than any feasible one,
    and the final projection would undo the gain. A uniform shift barely changes
    the Erdős score, so the projection after a penalized run costs little."""
    h = _normalize(np.asarray(h, dtype=np.float64), problem)
    n = h.shape[0]
    seen = {"h": h.copy(), "f": math.inf}
    weight = CONFIG["erdos_sum_weight"] / n

    def fun(x):
        if time.monotonic() >= deadline:
            raise _OutOfTime
        f, g = smooth_value_grad(x, temperature, problem)
        if problem == ERDOS:
            d = float(x.sum()) - n / 2.0
            f, g = f + 0.5 * weight * d * d, g + weight * d
        if f < seen["f"]:
            seen["h"], seen["f"] = x.copy(), f
        return f, g

    if problem == FIRST:
        bounds = Bounds(np.zeros(n), np.full(n, np.inf))
    elif problem == ERDOS:
        bounds = Bounds(np.zeros(n), np.ones(n))
    else:
        bounds = None
    try:
        minimize(fun, h, jac=True, method="L-BFGS-B", bounds=bounds,
                 options={"maxiter": int(CONFIG["lbfgs_maxiter"]) if maxiter is None else int(maxiter),
                          "maxcor": int(CONFIG["lbfgs_memory"]), "ftol": 1e-16, "gtol": 1e-14})
    except _OutOfTime:
        pass
    return seen["h"]


def temperature_ladder(h, rng, deadline, problem, t_hot, t_cold, rungs):
    """L-BFGS at temperatures from t_hot down to t_cold (geometric, relative to the
    current score: T is in score units). Each rung continues from the previous
    rung's point, so a hot rung may leave the basin; the ratchet keeps the best
    verified point. Each rung gets an equal share of the time left."""
    rungs = max(1, int(rungs))
    for i in range(rungs):
        now = time.monotonic()
        if now >= deadline:
            break
        frac = i / (rungs - 1) if rungs > 1 else 1.0
        t_rel = t_hot * (t_cold / t_hot) ** frac
        rung_deadline = now + (deadline - now) / (rungs - i)
        out = lbfgs_smooth(h, t_rel * best_score(), problem, rung_deadline, None)
        offer(out, problem)
        h = project(out, problem)
    return h


# ---------------------------------------------------------------- stages


def stage_ladder(h, rng, deadline, problem):
    return temperature_ladder(h, rng, deadline, problem, CONFIG["t_hot"], CONFIG["t_cold"], CONFIG["rungs"])


def stage_polish(h, rng, deadline, problem):
    """Cold L-BFGS restarted from the best point (a restart drops curvature pairs
    gathered far from it); after a run that did not improve, colder."""
    t_rel = CONFIG["t_polish"]
    while time.monotonic() < deadline and t_rel >= CONFIG["polish_floor"]:
        out = lbfgs_smooth(best(), t_rel * best_score(), problem, deadline, CONFIG["polish_maxiter"])
        if not offer(out, problem):
            t_rel *= CONFIG["polish_cool"]
    return best()
