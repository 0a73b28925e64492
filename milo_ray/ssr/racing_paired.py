"""Paired successive rejects: a racing rule that removes children on their paired
differences to the current leader over the shared tasks, on a fixed rejection schedule,
and earlier when the evidence is strong.

Successive rejects (Audibert & Bubeck, 2010) removes one arm per phase until one is
left. In a race every survivor runs the same batch, so the natural statistic is the
paired one: per task, the child's mean reward minus the leader's, task difficulty
cancelling. The rule ranks the challengers by the paired t statistic of that difference
(a child behind by a little on every task is rejected before one behind by the same
amount on a few tasks), not by its raw mean.
"""

from __future__ import annotations

import numpy as np

from milo_ray.ssr.racing_view import RuleDecision, StageView, paired_t, t_critical


def rejects_keep(m: int, stages: int, stage: int) -> int:
    """Children kept after stage ``stage`` of ``stages``: the M − 1 rejections spread
    evenly over the first K − 1 stages, n_r = max(1, M − ⌈r·(M−1)/(K−1)⌉), so the last
    stage races one child against the parent (K = 1: no stage is followed by a decision)."""
    if stages <= 1:
        return m
    return max(1, m - -(-stage * (m - 1) // (stages - 1)))


class PairedSuccessiveRejects:
    """After stage r keep at most :func:`rejects_keep` children: the leader (the top-ranked
    child) and the challengers with the highest paired t statistic against it. Any
    challenger whose paired difference is significantly negative (one-sided paired t at
    ``alpha``, from ``min_tasks`` tasks on) goes at once, whatever the quota. The race
    never stops early: with one child left, the remaining stages compare it with the
    parent, which is what the replacement decision needs."""

    name = "paired_rejects"

    def __init__(self, alpha: float = 0.05, min_tasks: int = 10) -> None:
        if not 0.0 < float(alpha) < 0.5:
            raise ValueError(f"method.racing: paired_rejects alpha must be in (0, 0.5), got {alpha}")
        if int(min_tasks) < 2:
            raise ValueError(f"method.racing: paired_rejects min_tasks must be >= 2, got {min_tasks}")
        self.alpha, self.min_tasks = float(alpha), int(min_tasks)

    def keep(self, *, generated: int, stages: int, stage: int, active: int) -> int:
        return rejects_keep(generated, stages, stage)

    def after_stage(self, view: StageView) -> RuleDecision:
        quota = min(len(view.ranked), rejects_keep(view.generated, view.stages, view.stage))
        if len(view.ranked) < 2:
            return RuleDecision(view.ranked)
        n = len(view.tasks)
        leader, rest = view.ranked[0], view.ranked[1:]
        if n >= 2:
            t = paired_t(np.stack([view.per_task[c] - view.per_task[leader] for c in rest]))
        else:  # one task: no spread to standardize by, rank by the difference itself
            t = np.array([float(view.per_task[c][0] - view.per_task[leader][0]) for c in rest])
        if n >= self.min_tasks:
            significant = t < -t_critical(self.alpha, n)
        else:
            significant = np.zeros(len(rest), dtype=bool)
        # Stable sort on −t keeps the race's ranking among equal statistics.
        order = [rest[i] for i in np.argsort(-t, kind="stable") if not significant[i]]
        return RuleDecision((leader, *order[: quota - 1]))
