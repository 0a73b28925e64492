"""Racing rules (SSR §4.3 and beyond): who keeps racing after a stage, as small objects.

A :class:`RacingRule` sees a completed stage (:class:`StageView`: the surviving children
ranked, every runner's per-task mean rewards over the tasks raced) and returns a
:class:`RuleDecision` (who stays, whether the race stops early). The race
(:mod:`milo_ray.ssr.racing`) applies it, and alone owns the batches, the budget gate and
the protected parent, so a rule can never spend, re-run or drop the parent. Chosen by
``method.racing`` (:data:`RACING_RULES`).
"""

from __future__ import annotations

import numpy as np

from milo_ray.search.strategy import Choice
from milo_ray.ssr.racing_bandit import SuccessiveEliminationBandit
from milo_ray.ssr.racing_lowrank import LowRankRacing
from milo_ray.ssr.racing_paired import PairedSuccessiveRejects
# The protocol's types live in racing_view so that every rule module can build on them.
from milo_ray.ssr.racing_view import RacingRule, RuleDecision, StageView, paired_t, t_critical

__all__ = ["RACING_RULES", "GeometricHalving", "LowRankRacing", "NoElimination", "PairedElimination",
           "PairedSuccessiveRejects", "RacingRule", "RuleDecision", "StageView", "SuccessiveEliminationBandit",
           "SuccessiveHalving", "keep_count", "paired_t", "t_critical"]


def keep_count(m: int, k: int, r: int) -> int:
    """n_r = max(1, M − round(r·M/K)) children kept after stage r.

    ``round`` is the arithmetic one, halves up, in exact integer arithmetic — not
    Python's ``round`` (halves to even), which would make the removals depend on the
    parity of ⌊r·M/K⌋: M=5, K=2 keeps 2 after stage 1 here (2.5 → 3 removed) where
    banker's rounding would keep 3; M=2, K=4 keeps 1 (0.5 → 1) where it would keep 2.
    The paper's cases have no half: M=4, K=2 → 4/2 and M=12, K=2 → 12/6.
    """
    return max(1, m - (2 * r * m + k) // (2 * k))


class SuccessiveHalving:
    """n_r = max(1, M − round(r·M/K)) (:func:`keep_count`): M is the children
    *generated*, so an invalid child counts as eliminated before the first stage."""

    name = "successive_halving"

    def keep(self, *, generated: int, stages: int, stage: int, active: int) -> int:
        return keep_count(generated, stages, stage)

    def after_stage(self, view: StageView) -> RuleDecision:
        n = self.keep(generated=view.generated, stages=view.stages, stage=view.stage, active=len(view.ranked))
        return RuleDecision(view.ranked[:n])


class GeometricHalving:
    """The K-stage halving schedule: n_r = max(1, ⌈M / 2^r⌉) children after stage r
    (M = 12: 6, 3, 2, 1), so with K = ⌈log2 M⌉ + 1 stages each stage halves the field
    and the last compares one or two survivors with the parent. Against the paper's
    linear quota (:class:`SuccessiveHalving`, 12 → 6 over K = 2) it spends less on
    stage 1 and more on the leaders."""

    name = "halving"

    def keep(self, *, generated: int, stages: int, stage: int, active: int) -> int:
        return max(1, -(-generated // (2 ** stage)))

    def after_stage(self, view: StageView) -> RuleDecision:
        n = self.keep(generated=view.generated, stages=view.stages, stage=view.stage, active=len(view.ranked))
        return RuleDecision(view.ranked[:n])


class NoElimination:
    """Every child runs every stage (the uniform-allocation ablation / audit baseline)."""

    name = "uniform"

    def after_stage(self, view: StageView) -> RuleDecision:
        return RuleDecision(view.ranked)


class PairedElimination:
    """Eliminate the children whose paired difference to the leader is significantly
    negative; stop as soon as one child is left.

    After every stage, the leader is the top-ranked child; for every other child c the
    per-task differences d_t = mean_i r(c, t, i) − mean_i r(leader, t, i) over the tasks
    raced so far (each task a block of R rollouts of both, so task difficulty cancels)
    give a one-sided paired t statistic, and c is dropped when it is below
    −t_{1−α, n−1}. Nothing is tested before ``min_tasks`` tasks. The race then runs its
    further stages on the survivors only, until one is left (``settled``), the stages
    run out, or the budget gate refuses a stage. Each look is a test at ``alpha``;
    over many stages the chance of dropping a truly better child grows, which is why
    near-ties stay in the race rather than being settled early.
    """

    name = "paired"

    def __init__(self, alpha: float = 0.05, min_tasks: int = 10) -> None:
        if not 0.0 < float(alpha) < 0.5:
            raise ValueError(f"method.racing: paired alpha must be in (0, 0.5), got {alpha}")
        if int(min_tasks) < 2:
            raise ValueError(f"method.racing: paired min_tasks must be >= 2, got {min_tasks}")
        self.alpha, self.min_tasks = float(alpha), int(min_tasks)

    def after_stage(self, view: StageView) -> RuleDecision:
        n = len(view.tasks)
        if n < self.min_tasks or len(view.ranked) < 2:
            return RuleDecision(view.ranked, stop=len(view.ranked) == 1)
        leader = view.per_task[view.ranked[0]]
        rest = view.ranked[1:]
        t = paired_t(np.stack([view.per_task[c] - leader for c in rest]))
        worse = t < -t_critical(self.alpha, n)
        keep = (view.ranked[0],) + tuple(c for c, w in zip(rest, worse) if not w)
        return RuleDecision(keep, stop=len(keep) == 1)


RACING_RULES: Choice[RacingRule] = Choice(
    "racing rule", {"successive_halving": SuccessiveHalving, "uniform": NoElimination, "halving": GeometricHalving,
                    "paired": PairedElimination, "paired_rejects": PairedSuccessiveRejects,
                    "bandit": SuccessiveEliminationBandit, "lowrank": LowRankRacing}, RacingRule)
