"""Seed optimizer ``ratchet_upsample``: a multi-stage program around one ratchet.

Stages: ``upsample`` (refine the start by an integer factor, each height repeated:
the step function, and so the score, is unchanged, but there are more degrees of
freedom), ``ladder`` (L-BFGS on the log-sum-exp smoothed max, hot -> cold),
``polish`` (cold L-BFGS from the best point), ``restarts`` (until the stage's time
is up: jitter the best point, run a short ladder from a warm temperature, polish;
the jitter shrinks after a failed restart and grows back after a success). Every
hand-off goes through the ratchet: a point is kept and published only when it is
feasible and its exact (FFT) score is strictly below the best so far.
"""

# Given by the runner as module globals (the building blocks; see the seeds' README):
# run_stages, stage_ladder, stage_polish, stage_restarts, stage_upsample.
# Every stage of STAGES is a given one, reading its settings from CONFIG: this program
# is its schedule.

CONFIG = {
    "upsample_factor": 4,     # integer refinement of the start (1: keep the grid)
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
    "margin_s": 0.05,         # return this long before the deadline at least ...
    "margin_frac": 0.02,      # ... or this fraction of the budget
}

STAGES = ["upsample", "ladder", "polish", "restarts"]


def optimize(values, *, seed, deadline):
    """Run STAGES in order from ``values`` with the runner's ``run_stages`` (each stage an
    equal share of the time left); returns the best verified point before ``deadline``."""
    return run_stages(values, seed=seed, deadline=deadline, stages=STAGES,
                      margin_s=CONFIG["margin_s"], margin_frac=CONFIG["margin_frac"])
