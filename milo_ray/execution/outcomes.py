"""What one attempt of a rollout becomes on the driver: a result to record, or a retry.

Plain functions and one small policy, no Ray (the scheduler calls them):

* :func:`attempt_error` -- whether a worker's :class:`~milo_ray.execution.workers.Outcome`
  is an infrastructure failure: the executor raised, or returned something outside its
  contract (which is treated like a raise);
* :class:`RetryPolicy` -- an infrastructure failure (that, or a lost worker or node) is
  retried after an exponential backoff, up to ``max_retries`` times per rollout and
  ``max_harness_retries`` times per harness over the run (so a harness that could provoke
  infrastructure failures cannot make the run re-roll its rollouts without end); after
  that it is recorded (:func:`infra_result`, ``error_kind="infra"``). Harness and task
  failures are results, i.e. scores, and never come here;
* :func:`timed_out_result` -- the result of a rollout the worker cancelled at its time cap;
* :func:`fill_bookkeeping` -- the fields the driver, the store's single writer, sets on
  every result whatever the executor put there.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.core.tasks import Task

if TYPE_CHECKING:  # workers.py imports Ray; this module needs only the type
    from milo_ray.execution.workers import Outcome


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` retries of an infrastructure failure, the n-th after
    ``backoff_s * 2**(n-1)`` seconds (so a flapping node is not hammered);
    ``max_harness_retries`` retries of all the rollouts of one harness together, over
    the run (None: no bound but the per-rollout one)."""

    max_retries: int = 3
    backoff_s: float = 0.5
    max_harness_retries: int | None = 10
    # Retries granted so far per harness (the policy's only state; it never shrinks).
    granted: Counter = field(default_factory=Counter, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"RolloutScheduler: max_retries={self.max_retries!r} must be an integer >= 0")
        if self.backoff_s < 0:
            raise ValueError(f"RolloutScheduler: retry_backoff_s={self.backoff_s!r} must be >= 0")
        h = self.max_harness_retries
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 0):
            raise ValueError(f"RolloutScheduler: max_harness_retries={h!r} must be an integer >= 0 or None")

    def backoff(self, attempts: int, harness_id: str | None = None) -> float | None:
        """Seconds to wait before retrying a rollout (of ``harness_id``) whose
        ``attempts``-th attempt failed, or None when it has used its retries or its harness
        has used the run's (then it is recorded as an infra failure). A retry granted is
        counted against its harness."""
        if attempts > self.max_retries or self.harness_spent(harness_id):
            return None
        if harness_id is not None:
            self.granted[harness_id] += 1
        return self.backoff_s * (2 ** (attempts - 1))

    def harness_spent(self, harness_id: str | None) -> bool:
        """Whether ``harness_id`` has used the retries the run allows one harness."""
        limit = self.max_harness_retries
        return harness_id is not None and limit is not None and self.granted[harness_id] >= limit


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


def infra_result(request: RolloutRequest, attempts: int, error: str,
                 policy: RetryPolicy | None = None) -> RolloutResult:
    if policy is not None and attempts <= policy.max_retries and policy.harness_spent(request.harness_id):
        error = (f"{error}; not retried: this harness's rollouts used the run's {policy.max_harness_retries} "
                 "infrastructure retries (max_harness_retries)")
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
