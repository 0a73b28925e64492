"""The contract between the scheduler and whatever runs one rollout.

It sits in the bottom layer because executors live on several layers (the surrogate's in
``benchmarks``, the real ones in ``execution``) and all of them implement it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task


# The harness file that exposes ``build_agent(model, backend)``: the harness model checks
# for it, and the harness process inside a sandbox imports it.
ENTRY_FILE = "harness.py"


class HarnessLike(Protocol):
    harness_id: str
    files: dict[str, str]


@runtime_checkable
class Executor(Protocol):
    """Runs one harness on one task.

    Implementations are constructed from config (``_target_``) inside worker
    processes, so their constructor arguments must be picklable. ``execute`` may be a
    plain function (the scheduler offloads it to a thread so it cannot stall other
    rollouts) or may be accompanied by ``async def aexecute`` with the same
    signature, which the scheduler prefers. It must honour ``task.time_cap_s``
    (stop and grade the state reached, ``timed_out=True``) and must return a result
    for harness or task failures rather than raise; raising signals an
    infrastructure failure, which the scheduler retries.
    """

    model_id: str

    def execute(self, harness: HarnessLike, task: Task, rollout_idx: int, seed: int) -> RolloutResult: ...
