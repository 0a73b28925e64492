"""Leaderboard rows of a harness on a split: pass@k, PR@k, RR@k with task-clustered
95% intervals (DESIGN §4.4), tokens, seconds, the benchmark's ground truth when it has
one, and the console table every method prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from milo_ray.core.rollouts import RolloutResult
from milo_ray.harness.model import Harness
from milo_ray.kernels.metrics import clustered_ci, pass_at_k, pr_at_k, rr_at_k


@dataclass(frozen=True)
class HarnessScore:
    """One leaderboard row. CIs are (low, high) of the task-clustered 95% interval."""

    name: str
    harness_id: str
    n_tasks: int
    k: int
    pass_at_k: float
    pr_at_k: float
    pr_ci: tuple[float, float] | None  # None: fewer than 2 tasks, no interval
    rr_at_k: float
    rr_ci: tuple[float, float] | None
    mean_output_tokens: float
    mean_seconds: float
    timeouts: int
    errors: int
    true_score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def score_matrix(results: Iterable[RolloutResult], task_ids: Sequence[str], k: int) -> np.ndarray:
    """(n_tasks, k) scores in task order; a missing rollout counts as 0 (never silently dropped
    from the denominator)."""
    index = {t: i for i, t in enumerate(task_ids)}
    S = np.zeros((len(task_ids), k))
    for r in results:
        if r.task_id in index and r.rollout_idx < k:
            S[index[r.task_id], r.rollout_idx] = r.score
    return S


def summarize(name: str, harness: Harness, results: Sequence[RolloutResult], task_ids: Sequence[str], k: int,
              *, true_score: float | None = None) -> HarnessScore:
    S = score_matrix(results, task_ids, k)
    resolved = (S >= 1.0).astype(float)
    # One task has no spread to estimate an interval from: no interval, not a crash at
    # the end of a run that evaluated a one-task split.
    pr_ci = interval(S)
    rr_ci = interval(resolved)
    n = max(len(results), 1)
    return HarnessScore(
        name=name,
        harness_id=harness.harness_id,
        n_tasks=len(task_ids),
        k=k,
        pass_at_k=float(pass_at_k(S)),
        pr_at_k=float(pr_at_k(S)),
        pr_ci=pr_ci,
        rr_at_k=float(rr_at_k(S)),
        rr_ci=rr_ci,
        mean_output_tokens=sum(r.output_tokens for r in results) / n,
        mean_seconds=sum(r.latency_s for r in results) / n,
        timeouts=sum(r.timed_out for r in results),
        errors=sum(r.error_kind is not None for r in results),
        true_score=true_score,
    )


def interval(S: np.ndarray, *, statistic: str = "pr") -> tuple[float, float] | None:
    """The task-clustered 95% interval of ``statistic`` over the (n_tasks, k) scores
    ``S``; None with fewer than 2 tasks (one task has no spread to estimate)."""
    if S.shape[0] < 2:
        return None
    _, lo, hi = clustered_ci(S, statistic=statistic)
    return float(lo), float(hi)


def _with_ci(value: float, ci: tuple[float, float] | None) -> str:
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci is not None else f"{value:.3f} (1 task: no CI)"


def print_scores(title: str, rows: Sequence[HarnessScore]) -> None:
    """A rich table on the console (plain text when not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    # Token and second figures are means per rollout (the surrogate's are simulated);
    # timeouts and errors are rollout counts.
    for col in ("harness", "id", "pass@k", "PR@k [95% CI]", "RR@k [95% CI]", "out tokens/rollout", "s/rollout",
                "timeouts", "errors", "true score"):
        table.add_column(col, justify="left" if col in ("harness", "id") else "right")
    for r in rows:
        table.add_row(
            r.name, r.harness_id[:10], f"{r.pass_at_k:.3f}",
            _with_ci(r.pr_at_k, r.pr_ci), _with_ci(r.rr_at_k, r.rr_ci),
            f"{r.mean_output_tokens:,.0f}", f"{r.mean_seconds:,.1f}", str(r.timeouts), str(r.errors),
            "-" if r.true_score is None else f"{r.true_score:.3f}",
        )
    Console(width=160).print(table)
