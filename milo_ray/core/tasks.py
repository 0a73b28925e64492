"""The task value type: what a benchmark hands a method and an executor runs.

A :class:`Task` is small, frozen and picklable: it crosses Ray process boundaries with
every rollout. Tasks are not stored; a run rebuilds them from its benchmark config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from milo_ray.core.task_format import TaskFormat


@dataclass(frozen=True)
class Task:
    """One benchmark task.

    ``metadata`` holds benchmark-specific, JSON-serializable facts (for the surrogate:
    latent difficulty, failure-mode propensities, hidden-test count); executors read
    it, methods must not rely on it.

    ``time_cap_s`` bounds the agent's work; ``grading_cap_s`` is the wall time a real
    rollout needs on top of it to set up its sandbox and run the task's verifier (0 for
    simulated tasks). The worker cancels a rollout past ``time_cap_s * grace + grading_cap_s``.

    ``format`` is the :class:`~milo_ray.core.task_format.TaskFormat` that sets up and
    grades a real task (Harbor, SWE, einstein-agent); None for tasks whose executor
    grades them itself (the surrogate, the instance-level optimizer track). It travels
    with the task when the task is pickled to a worker (by its class, which is importable
    wherever milo_ray is), so a worker never resolves a format by name.
    """

    task_id: str
    split: str
    instruction: str
    time_cap_s: float
    token_cap: int
    metadata: dict[str, Any] = field(default_factory=dict)
    grading_cap_s: float = 0.0
    format: "TaskFormat | None" = field(default=None, compare=False, repr=False)
