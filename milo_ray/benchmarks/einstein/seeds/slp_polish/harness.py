"""Seed optimizer ``slp_polish``: the smoothed-max L-BFGS ladder, then sequential
linear programming (SLP) on the exact max.

Stages: ``upsample`` (refine the start by an integer factor: same score, more
freedom), ``ladder`` (L-BFGS on the log-sum-exp smoothed max, hot -> cold),
``polish`` (cold L-BFGS from the best point), ``restarts``, ``slp`` (until the stage's time is up:
linearize the per-shift values at the best point on the shifts within ``slp_band`` of
the maximum, and solve the linear program "minimize t subject to every linearized
value <= t, the heights' sum kept, the problem's bounds, |step| <= r" with HiGHS;
the exact score of the step decides: a better point is kept and r grows, a worse one
shrinks r). The smoothed max trades accuracy for smoothness: near an optimum the
maximum is attained at hundreds of shifts at once, where a smoothed gradient moves
all of them a little and none exactly; the linear program balances them exactly.
On long grids the program's size is capped: a random subset of ``slp_max_vars``
heights moves per step, against the ``slp_max_rows`` largest shifts.
``restarts`` (before ``slp``): jittered warm restarts of the ladder, the jitter
adapting to success.
Every hand-off goes through the ratchet: a point is kept and published only when it
is feasible and its exact (FFT) score is strictly below the best so far.
"""

import time

import numpy as np
from scipy.optimize import linprog

# Given by the runner as module globals (the problem's formulas and the building blocks;
# see the seeds' README): ERDOS, FIRST, best, conv, normalize, offer, run_stages and the
# stages stage_upsample, stage_ladder, stage_polish, stage_restarts (ratchet_upsample's,
# reading their settings from CONFIG); stage_slp is this program's own.

CONFIG = {
    "upsample_factor": 8,     # integer refinement of the start (1: keep the grid)
    "max_points": 4800,       # no refinement beyond this many grid points
    "t_hot": 1e-3,            # hottest ladder temperature, relative to the current score
    "t_cold": 1e-6,           # coldest ladder temperature, relative to the current score
    "rungs": 5,               # temperatures of the ladder
    "t_polish": 3e-7,         # first polishing temperature, relative to the current score
    "polish_cool": 0.3,       # polishing temperature factor after a run that did not improve
    "polish_floor": 1e-9,     # polishing stops below this relative temperature
    "polish_maxiter": 400,    # L-BFGS iterations per polishing run
    "lbfgs_maxiter": 1500,    # L-BFGS iterations per ladder rung
    "lbfgs_memory": 10,       # L-BFGS correction pairs
    "erdos_sum_weight": 100.0,  # Erdős: penalty on (sum h - n/2)^2 / n inside L-BFGS
    "restart_t_hot": 1e-4,    # a restart's ladder starts at this temperature
    "restart_rungs": 3,       # temperatures of a restart's ladder
    "restart_seconds": 4.0,   # time of one restart (capped by the stage's time)
    "jitter": 3e-3,           # initial relative jitter of a restart
    "jitter_min": 1e-5,       # the jitter never shrinks below this
    "jitter_shrink": 0.7,     # jitter factor after a restart that did not improve
    "jitter_grow": 1.5,       # jitter factor after a restart that improved
    "restart_ladder_share": 0.7,  # share of a restart's time its ladder gets (the rest: polishing)
    "slp_band": 1e-4,         # SLP rows: shifts within this relative distance of the maximum ...
    "slp_max_rows": 800,      # ... at most this many (the largest)
    "slp_max_vars": 600,      # SLP columns: all heights up to this many, else a random subset
    "slp_radius": 1e-3,       # first trust radius (Erdős: absolute; else relative to the mean height)
    "slp_radius_min": 1e-7,   # below this the radius starts over from slp_radius
    "slp_grow": 1.5,          # radius factor after an improving step
    "slp_shrink": 0.5,        # radius factor after a step that did not improve
    "slp_lp_seconds": 5.0,    # time limit of one linear program
    "margin_s": 0.05,         # return this long before the deadline at least ...
    "margin_frac": 0.02,      # ... or this fraction of the budget
}

STAGES = ["upsample", "ladder", "polish", "restarts", "slp"]


def optimize(values, *, seed, deadline):
    """Run STAGES in order from ``values`` with the runner's ``run_stages`` (each stage an
    equal share of the time left); returns the best verified point before ``deadline``."""
    return run_stages(values, seed=seed, deadline=deadline, stages=STAGES,
                      margin_s=CONFIG["margin_s"], margin_frac=CONFIG["margin_frac"])


# ---------------------------------------------------------------- sequential linear programming


def shift_jacobian(h, rows, cols, problem):
    """d v_k / d h_j of the per-shift values for shifts ``rows`` and heights ``cols``
    (first/third: of the raw autoconvolution sum_j h_j h_(k-j), whose sum of heights the
    step keeps; Erdős: of 2/n corr(h, 1 - h)), a dense len(rows) x len(cols) array."""
    n = h.shape[0]
    lag = rows[:, None] - cols[None, :]
    inside = (lag >= 0) & (lag < n)
    if problem != ERDOS:
        return 2.0 * np.where(inside, h[np.clip(lag, 0, n - 1)], 0.0)
    # v_k = 2/n sum_j h_j g_(k-j), g = reverse(1 - h): h enters directly and through g.
    g = (1.0 - h)[::-1]
    jac = np.where(inside, g[np.clip(lag, 0, n - 1)], 0.0)
    mirror = rows[:, None] + cols[None, :] - (n - 1)
    jac -= np.where((mirror >= 0) & (mirror < n), h[np.clip(mirror, 0, n - 1)], 0.0)
    return (2.0 / n) * jac


def slp_step(h, radius, rng, problem, time_limit):
    """One linear program at ``h``; returns the stepped point (not yet verified) or
    None when HiGHS found no solution within ``time_limit`` seconds."""
    n = h.shape[0]
    v = conv(h, (1.0 - h)[::-1]) * (2.0 / n) if problem == ERDOS else conv(h, h)
    top = float(v.max())
    rows = np.nonzero(v >= top - CONFIG["slp_band"] * abs(top))[0]
    if rows.shape[0] > CONFIG["slp_max_rows"]:
        rows = np.argsort(v)[-int(CONFIG["slp_max_rows"]):]
    m = int(CONFIG["slp_max_vars"])
    cols = np.arange(n) if n <= m else np.sort(rng.choice(n, size=m, replace=False))
    jac = shift_jacobian(h, rows, cols, problem)
    k = cols.shape[0]
    # Variables: the step on the chosen heights, then t. Minimize t subject to
    # v_rows + jac @ step <= t and sum(step) = 0 (the sum is the normalization of the
    # first/third scores and Erdős's constraint).
    cost = np.zeros(k + 1)
    cost[-1] = 1.0
    a_ub = np.hstack([jac, -np.ones((rows.shape[0], 1))])
    a_eq = np.ones((1, k + 1))
    a_eq[0, -1] = 0.0
    hc = h[cols]
    lower, upper = np.full(k, -radius), np.full(k, radius)
    if problem == FIRST:
        lower = np.maximum(lower, -hc)
    elif problem == ERDOS:
        lower, upper = np.maximum(lower, -hc), np.minimum(upper, 1.0 - hc)
    bounds = np.vstack([np.column_stack([lower, upper]), [[-np.inf, np.inf]]])
    res = linprog(cost, A_ub=a_ub, b_ub=-v[rows], A_eq=a_eq, b_eq=[0.0], bounds=bounds, method="highs",
                  options={"time_limit": float(time_limit)})
    if res.status != 0 or res.x is None:
        return None
    out = h.copy()
    out[cols] += res.x[:k]
    return out


def stage_slp(h, rng, deadline, problem):
    """Trust-region SLP from the best point until ``deadline``: each step is scored
    exactly and kept only if strictly better (the ratchet); the radius grows after a
    kept step and shrinks after a rejected one, starting over when it gets tiny."""
    radius = CONFIG["slp_radius"]
    while True:
        left = deadline - time.monotonic()
        if left <= 0.0:
            break
        x = normalize(best(), problem)
        out = slp_step(x, radius, rng, problem, min(CONFIG["slp_lp_seconds"], left))
        if out is not None and offer(out, problem):
            radius *= CONFIG["slp_grow"]
        else:
            radius *= CONFIG["slp_shrink"]
            if radius < CONFIG["slp_radius_min"]:
                radius = CONFIG["slp_radius"]
    return best()
