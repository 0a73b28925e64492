"""An executor wrapper that injects infrastructure faults: each attempt of a rollout
raises :class:`InjectedInfraError` with probability ``rate`` and otherwise runs the
wrapped executor unchanged. The scheduler must retry every such fault (it is raised, not
returned: an infrastructure failure, never a score) and store each rollout once.

The decision is a hash of (seed, request seed, harness, task, rollout index, attempt
number in this process), so a retry draws afresh and a run is reproducible. Used by the
load soak (``scripts/soak.py``).

    {"_target_": "milo_ray.testing.faulty_executor.FaultInjectingExecutor",
     "inner": {"_target_": "milo_ray.benchmarks.surrogate_executor.SurrogateExecutor", ...},
     "rate": 0.05}
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from typing import Any

from milo_ray.core.tasks import Task


class InjectedInfraError(RuntimeError):
    """An injected infrastructure fault (a lost sandbox, a dropped connection)."""


class FaultInjectingExecutor:
    def __init__(self, inner: Any, rate: float = 0.05, seed: int = 0) -> None:
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"FaultInjectingExecutor: rate={rate} must be in [0, 1)")
        from milo_ray.execution.workers import build_executor

        self.inner = build_executor(inner)
        self.rate = float(rate)
        self.seed = int(seed)
        self.model_id = getattr(self.inner, "model_id", None)
        self._attempts: Counter[tuple] = Counter()
        self._lock = threading.Lock()
        self.faults = 0

    def _fault(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> bool:
        key = (harness.harness_id, task.task_id, int(rollout_idx), int(seed))
        with self._lock:
            self._attempts[key] += 1
            attempt = self._attempts[key]
        raw = f"{self.seed}|{seed}|{key[0]}|{key[1]}|{rollout_idx}|{attempt}".encode()
        draw = int.from_bytes(hashlib.sha256(raw).digest()[:8], "little") / 2**64
        if draw < self.rate:
            self.faults += 1
            return True
        return False

    def execute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> Any:
        if self._fault(harness, task, rollout_idx, seed):
            raise InjectedInfraError(f"injected infrastructure fault on {task.task_id}#{rollout_idx}")
        return self.inner.execute(harness, task, rollout_idx, seed)

    async def aexecute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> Any:
        if self._fault(harness, task, rollout_idx, seed):
            raise InjectedInfraError(f"injected infrastructure fault on {task.task_id}#{rollout_idx}")
        inner = getattr(self.inner, "aexecute", None)
        if callable(inner):
            return await inner(harness, task, rollout_idx, seed)
        return self.inner.execute(harness, task, rollout_idx, seed)
