"""Seed optimizer ``lse_adam``: Adam on the log-sum-exp smoothed max over shifts.

The temperature follows a geometric schedule from hot to cold over the stage's
time (relative to the current score: T is in score units), the learning rate
follows it down; every step is projected back to the feasible set. Stages:
``anneal`` (hot -> cold), ``cold`` (a cold run from the best point) and ``fine``
(a colder run with tiny steps, which is what moves a near-optimal start).
Only strictly better, feasible, exactly (FFT) scored points are published.
"""

import time

import numpy as np

# Given by the runner as module globals (the problem's formulas, the ratchet and the
# stage driver; see the seeds' README): ERDOS, best, best_score, offer, project,
# run_stages, smooth_value_grad.

CONFIG = {
    "t_hot": 1e-2,          # anneal: first temperature, relative to the current score
    "t_cold": 1e-5,         # anneal: last temperature; cold: its temperature
    "lr_hot": 1e-2,         # anneal: first learning rate, relative to the mean |height|
    "lr_cold": 1e-4,        # anneal: last learning rate; cold: its learning rate
    "t_fine": 1e-6,         # fine: temperature (polishing a near-optimal point)
    "lr_fine": 1e-6,        # fine: learning rate
    "beta1": 0.9,           # Adam first-moment decay
    "beta2": 0.999,         # Adam second-moment decay
    "offer_every": 10,      # iterations between two offers to the ratchet
    "margin_s": 0.05,       # return this long before the deadline at least ...
    "margin_frac": 0.02,    # ... or this fraction of the budget
}

STAGES = ["anneal", "cold", "fine"]


def optimize(values, *, seed, deadline):
    """Run STAGES in order from ``values`` with the runner's ``run_stages`` (each stage an
    equal share of the time left); returns the best verified point before ``deadline``."""
    return run_stages(values, seed=seed, deadline=deadline, stages=STAGES,
                      margin_s=CONFIG["margin_s"], margin_frac=CONFIG["margin_frac"])


# ---------------------------------------------------------------- stages


def _adam(h, deadline, problem, t0, t1, lr0, lr1):
    """Adam with temperature and learning rate moving geometrically from (t0, lr0)
    to (t1, lr1) as the stage's time runs out."""
    start = time.monotonic()
    span = max(deadline - start, 1e-9)
    m = np.zeros_like(h)
    v = np.zeros_like(h)
    b1, b2 = CONFIG["beta1"], CONFIG["beta2"]
    scale = float(np.mean(np.abs(h))) or 1.0
    it = 0
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        frac = min(1.0, (now - start) / span)
        temperature = t0 * (t1 / t0) ** frac * best_score()
        lr = lr0 * (lr1 / lr0) ** frac * scale
        _, g = smooth_value_grad(h, temperature, problem)
        if problem == ERDOS:
            g = g - g.mean()  # stay on sum h = n/2 before the projection
        it += 1
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = (m / (1 - b1 ** it)) / (np.sqrt(v / (1 - b2 ** it)) + 1e-12)
        h = project(h - lr * step, problem)
        if it % int(CONFIG["offer_every"]) == 0:
            offer(h, problem)
    offer(h, problem)
    return best()


def stage_anneal(h, rng, deadline, problem):
    return _adam(h, deadline, problem, CONFIG["t_hot"], CONFIG["t_cold"], CONFIG["lr_hot"], CONFIG["lr_cold"])


def stage_cold(h, rng, deadline, problem):
    return _adam(best(), deadline, problem, CONFIG["t_cold"], CONFIG["t_cold"], CONFIG["lr_cold"], CONFIG["lr_cold"])


def stage_fine(h, rng, deadline, problem):
    return _adam(best(), deadline, problem, CONFIG["t_fine"], CONFIG["t_fine"], CONFIG["lr_fine"], CONFIG["lr_fine"])
