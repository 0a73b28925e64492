"""A successive-elimination bandit as a racing rule: a child leaves the race once an
anytime confidence bound says it is below the leader, under the race's shared batches.

Each stage adds the same tasks for every survivor (the shared-batch constraint), so a
bandit cannot pull one arm more than another; what remains of UCB-style allocation is
elimination (Even-Dar et al., 2006) with bounds that hold over every stage at once. The
statistic is the paired per-task difference to the leader, d_t ∈ [−1, 1], and the bound
the empirical Bernstein one (Maurer & Pontil, 2009): with probability ≥ 1 − δ′,
mean(d) ≥ E[d] − √(2·V·ln(2/δ′)/n) − 7·w·ln(2/δ′)/(3(n−1)), w = 2 the range of d and V
the sample variance. δ′ = δ / (M·r·(r+1)) union-bounds the M children and the stages
(Σ_r 1/(r(r+1)) = 1), so a truly better child is dropped with probability at most δ.

That guarantee is expensive: its range term 7·w·ln(2/δ′)/(3(n−1)) alone exceeds any gap
until n is in the hundreds, more tasks than a race holds. ``bound="gaussian"`` (the
default) keeps the union-bounded level but drops the range term, √(2·V·ln(1/δ′)/n): the
normal approximation to the mean of n paired differences, valid as n grows, not for
every n.
"""

from __future__ import annotations

import numpy as np

from milo_ray.ssr.racing_view import RuleDecision, StageView


BOUNDS = ("gaussian", "bernstein")


def bernstein_radius(d: np.ndarray, delta: float) -> np.ndarray:
    """The empirical Bernstein half-width of the mean of each row of ``d`` (values in
    [−1, 1], n ≥ 2 along the last axis) at level ``delta``."""
    n = d.shape[-1]
    var = d.var(axis=-1, ddof=1)
    log = np.log(2.0 / delta)
    return np.sqrt(2.0 * var * log / n) + 7.0 * 2.0 * log / (3.0 * (n - 1))


def gaussian_radius(d: np.ndarray, delta: float) -> np.ndarray:
    """The normal-approximation half-width √(2·V·ln(1/δ)/n) of each row's mean."""
    return np.sqrt(2.0 * d.var(axis=-1, ddof=1) * np.log(1.0 / delta) / d.shape[-1])


class SuccessiveEliminationBandit:
    """Drop every child whose paired difference to the leader is below zero by more than
    its anytime radius (``bound``: ``gaussian`` or ``bernstein``, see the module) at level
    ``delta``; stop when one child is left (its comparison with the parent is the
    decision's)."""

    name = "bandit"

    def __init__(self, delta: float = 0.1, bound: str = "gaussian") -> None:
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"method.racing: bandit delta must be in (0, 1), got {delta}")
        if bound not in BOUNDS:
            raise ValueError(f"method.racing: bandit bound={bound!r}; choose one of {list(BOUNDS)}")
        self.delta, self.bound = float(delta), bound

    def after_stage(self, view: StageView) -> RuleDecision:
        n = len(view.tasks)
        if n < 2 or len(view.ranked) < 2:
            return RuleDecision(view.ranked, stop=len(view.ranked) == 1)
        leader, rest = view.ranked[0], view.ranked[1:]
        d = np.stack([view.per_task[c] - view.per_task[leader] for c in rest])
        level = self.delta / (max(1, view.generated) * view.stage * (view.stage + 1))
        radius = bernstein_radius if self.bound == "bernstein" else gaussian_radius
        out = d.mean(axis=-1) + radius(d, level) < 0
        keep = (leader,) + tuple(c for c, o in zip(rest, out) if not o)
        return RuleDecision(keep, stop=len(keep) == 1)
