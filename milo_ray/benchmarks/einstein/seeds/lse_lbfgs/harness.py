"""Seed optimizer ``lse_lbfgs``: the log-sum-exp smoothed max over shifts, minimized
with L-BFGS-B in stages of decreasing temperature, then polished cold.

Stages: ``ladder`` (hot -> cold L-BFGS rungs), ``polish`` (repeated cold L-BFGS runs
from the best verified point until the stage's time is up). Works for the three
problems: bounds h >= 0 (first), none (third), [0, 1] with the sum n/2 a penalty
(Erdős). The runner gives both (``temperature_ladder``, ``polish``); this program sets
their schedule. Only strictly better, feasible, exactly (FFT) scored
points are published.
"""

# Given by the runner as module globals (the building blocks; see the seeds' README):
# run_stages, stage_ladder, stage_polish.
# Every stage of STAGES is a given one, reading its settings from CONFIG: this program
# is its schedule.

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
