"""Seed optimizer ``subgradient``: projected subgradient descent on the max itself.

A step moves against the gradient of the shifts at (or within a relative tolerance
of) the maximum, averaged; the step length is relative to the heights' scale and
decays as 1 / (1 + it / decay_iters); every step is projected back to the feasible
set. Stages: ``descent`` (large steps) and ``fine_descent`` (small steps from the
best point). Only strictly better, feasible, exactly (FFT) scored points are
published.
"""

import time

import numpy as np

# Given by the runner as module globals (the problem's formulas, the ratchet and the
# stage driver; see the seeds' README): ERDOS, best, offer, project, run_stages,
# shift_values, weighted_grad.

CONFIG = {
    "step": 3e-2,           # descent: first step, relative to the mean |height|
    "fine_step": 3e-3,      # fine_descent: first step, relative to the mean |height|
    "decay_iters": 200,     # the step halves after this many iterations
    "active_tol": 1e-4,     # shifts within this relative distance of the max are active
    "offer_every": 5,       # iterations between two offers to the ratchet
    "patience": 300,        # iterations without a new best before returning to the best
    "margin_s": 0.05,       # return this long before the deadline at least ...
    "margin_frac": 0.02,    # ... or this fraction of the budget
}

STAGES = ["descent", "fine_descent"]


def optimize(values, *, seed, deadline):
    """Run STAGES in order from ``values`` with the runner's ``run_stages`` (each stage an
    equal share of the time left); returns the best verified point before ``deadline``."""
    return run_stages(values, seed=seed, deadline=deadline, stages=STAGES,
                      margin_s=CONFIG["margin_s"], margin_frac=CONFIG["margin_frac"])


# ---------------------------------------------------------------- stages


def _subgradient(h, problem):
    """Average gradient of the active shifts (a subgradient of the max)."""
    v = shift_values(h, problem)
    top = float(v.max())
    active = v >= top - CONFIG["active_tol"] * abs(top)
    p = active / float(active.sum())
    g = weighted_grad(h, p, v, problem)
    if problem == ERDOS:
        g = g - g.mean()  # stay on sum h = n/2 before the projection
    return g


def _descend(h, deadline, problem, step0):
    h = best()
    it = since_best = 0
    while time.monotonic() < deadline:
        g = _subgradient(h, problem)
        gnorm = float(np.sqrt(np.mean(g * g)))
        if gnorm == 0.0:
            break
        scale = float(np.mean(np.abs(h)))
        step = step0 * scale / (1.0 + it / CONFIG["decay_iters"]) / gnorm
        h = project(h - step * g, problem)
        it += 1
        if it % int(CONFIG["offer_every"]) == 0:
            if offer(h, problem):
                since_best = 0
            else:
                since_best += int(CONFIG["offer_every"])
            if since_best >= CONFIG["patience"]:
                h, since_best = best(), 0
    offer(h, problem)
    return best()


def stage_descent(h, rng, deadline, problem):
    return _descend(h, deadline, problem, CONFIG["step"])


def stage_fine_descent(h, rng, deadline, problem):
    return _descend(h, deadline, problem, CONFIG["fine_step"])
