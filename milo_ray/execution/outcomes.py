"""What one attempt of a rollout becomes on the driver: a result to record, or a retry.

Plain functions and one small policy, no Ray (the scheduler calls them):

* :func:`attempt_error` -- whether a worker's :class:`~milo_ray.execution.workers.Outcome`
  is an infrastructure failure: the executor raised, or returned something outside its
  contract (which is treated like a raise);
* :class:`RetryPolicy` -- an infrastructure failure (that, or a lost worker or node) is
  retried after an exponential backoff, up to ``max_retries`` times; after that it is
  recorded (:func:`infra_result`, ``error_kind="infra"``). Harness and task failures are
  results, i.e. scores, and never come here;
* :func:`timed_out_result` -- the result of a rollout the worker cancelled at its time cap;
* :func:`fill_bookkeeping` -- the fields the driver, the store's single writer, sets on
  every result whatever the executor put there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.core.tasks import Task

if TYPE_CHECKING:  # workers.py imports Ray; this module needs only the type
    from milo_ray.execution.workers import Outcome


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` retries of an infrastructure failure, the n-th after
    ``backoff_s * 2**(n-1)`` seconds (so a flapping node is not hammered)."""

    max_retries: int = 3
    backoff_s: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"RolloutScheduler: max_retries={self.max_retries!r} must be an integer >= 0")
        if self.backoff_s < 0:
            raise ValueError(f"RolloutScheduler: retry_backoff_s={self.backoff_s!r} must be >= 0")

    def backoff(self, attempts: int) -> float | None:
        """Seconds to wait before retrying a rollout whose ``attempts``-th attempt failed,
        or None when it has used its retries (then it is recorded as an infra failure)."""
        if attempts > self.max_retries:
            return None
        return self.backoff_s * (2 ** (attempts - 1))


def attempt_error(outcome: Outcome) -> str | None:
    """The infrastructure error of this attempt, or None when it produced a result (or
    was capped, which is the harness's failure, not the infrastructure's)."""
    if outcome.infra_error is not None or outcome.capped:
        return outcome.infra_error
    bad = outcome.result.problem() if isinstance(outcome.result, RolloutResult) else "not a RolloutResult"
    return None if bad is None else f"executor returned an invalid result: {bad}"


def timed_out_result(request: RolloutRequest, task: Task, outcome: Outcome, time_cap_grace: float) -> RolloutResult:
    return RolloutResult(
        harness_id=request.harness_id,
        task_id=request.task_id,
        rollout_idx=request.rollout_idx,
        score=0.0,
        latency_s=outcome.finished_at - outcome.started_at,
        timed_out=True,
        error=f"cancelled past the time cap ({task.time_cap_s:g} s x grace {time_cap_grace:g})",
    )


def infra_result(request: RolloutRequest, attempts: int, error: str) -> RolloutResult:
    return RolloutResult(
        harness_id=request.harness_id,
        task_id=request.task_id,
        rollout_idx=request.rollout_idx,
        score=0.0,
        error_kind="infra",
        error=f"infrastructure failure after {attempts} attempts: {error}",
    )


def fill_bookkeeping(
    result: RolloutResult,
    request: RolloutRequest,
    *,
    run_id: str,
    split: str,
    node: str,
    started: float,
    finished: float,
    cache_key: str,
    attempts: int,
    budgeted: bool,
    usd_per_mtok: tuple[float, float] | None,
) -> RolloutResult:
    """Set the driver's fields on ``result`` (in place, and return it). The identity
    fields come from the request, not from the executor, so a result is always filed
    under the rollout that was asked for. ``usd_per_mtok`` prices a result whose
    executor reported no cost of its own."""
    r = request
    result.harness_id, result.task_id, result.rollout_idx = r.harness_id, r.task_id, r.rollout_idx
    result.run_id = run_id
    result.method, result.round, result.stage = r.method, r.round, r.stage
    result.split = split
    result.node = node
    result.started_at, result.finished_at = started, finished
    result.cache_key = cache_key
    result.attempts = attempts
    result.budgeted = budgeted
    if not result.latency_s:
        result.latency_s = max(finished - started, 0.0)
    if usd_per_mtok is not None and not result.cost_usd:
        p_in, p_out = usd_per_mtok
        result.cost_usd = (result.input_tokens * p_in + result.output_tokens * p_out) / 1e6
    return result
