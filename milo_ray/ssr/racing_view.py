"""The racing-rule protocol's types (SSR §4.3): what a rule sees after a stage
(:class:`StageView`), what it returns (:class:`RuleDecision`), the :class:`RacingRule`
protocol, and the paired t statistic the paired rules share. Kept apart from the rules
themselves (:mod:`milo_ray.ssr.racing_rules` and the ``racing_*`` modules) so every rule
module builds on it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class StageView:
    """What a racing rule sees after a completed stage: the children still racing,
    ranked best first (higher cumulative score, fewer diff lines, lower index), and
    every runner's per-task mean reward over P_r (``per_task[h][j]`` is harness ``h`` on
    ``tasks[j]``), so a rule can test paired differences without re-running anything.
    ``prior``: earlier harnesses' per-task mean rewards on the same ``tasks`` (earlier
    races' matrices of the same pool; NaN where a harness never ran a task), for rules
    that fit a model of the whole matrix; empty when the race was given none."""

    stage: int
    stages: int
    generated: int
    ranked: tuple[str, ...]
    parent_id: str
    tasks: tuple[str, ...]
    per_task: Mapping[str, np.ndarray]
    scores: Mapping[str, float]
    prior: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleDecision:
    """The children that keep racing (a subset of the ranked ones, at least one) and
    whether the race stops here (the remaining stages are not run)."""

    keep: tuple[str, ...]
    stop: bool = False


@runtime_checkable
class RacingRule(Protocol):
    """Decides after every stage but the last which children keep racing and whether
    the race stops early. The parent is never among the children: it always runs."""

    name: str

    def after_stage(self, view: StageView) -> RuleDecision:
        """The decision after completed stage ``view.stage`` < ``view.stages``."""
        ...


def paired_t(diffs: np.ndarray) -> np.ndarray:
    """One-sample t statistics of paired differences along the last axis (n ≥ 2 tasks).

    A zero standard deviation gives ±inf by the sign of the mean (every task agrees) and
    0 for a zero mean. Vectorized: the audit calls it on (replays × candidates × tasks)."""
    d = np.asarray(diffs, dtype=float)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    sd = d.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / np.sqrt(n))
    tied = np.where(mean > 0, np.inf, np.where(mean < 0, -np.inf, 0.0))
    return np.where(sd > 0, t, tied)


def t_critical(alpha: float, n: int) -> float:
    """One-sided critical value t_{1−α, n−1}."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(1.0 - alpha, n - 1))
