"""Synthetic executors for tests and scheduler benchmarks (no model, no sandbox).

:class:`SleepExecutor` stands in for an I/O-bound rollout: it awaits
``asyncio.sleep`` for a configurable time, then returns a result. It can simulate the
two kinds of failure the scheduler must tell apart:

* harness failures (``fail_rate``): a *returned* result with ``error_kind="harness"``
  and score 0 -- a score, which the scheduler must never retry;
* infrastructure failures (``crash_rate``): the executor *raises*
  :class:`SimulatedInfraError`, which the scheduler retries.

Randomness comes from a generator seeded by (executor seed, request seed, harness,
task, rollout index, attempt number in this process), so a retried rollout draws a
fresh crash decision while runs stay reproducible. Each result's trace records how
many rollouts of the same harness (and in total) were running in this process when
it started, which lets tests check concurrency caps from the stored results.

:class:`BlockingSleepExecutor` offers only a blocking ``execute`` (``time.sleep``),
like a harness that does synchronous I/O; the scheduler must run it off the event loop.

Build either from config: ``{"_target_": "milo_ray.execution.fake.SleepExecutor", "seconds": 1.0}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task


class SimulatedInfraError(RuntimeError):
    """Raised by the fake executors to imitate a crashed sandbox or lost connection."""


class SleepExecutor:
    """Sleeps asynchronously, then reports a score.

    ``seconds``, ``fail_rate`` and ``crash_rate`` are defaults; a task's metadata keys
    ``sleep_s``, ``fail_rate`` and ``crash_rate`` override them for that task, so one
    executor can serve a mix of fast, slow, failing and crashing tasks.
    ``score`` is the score of a clean run (task metadata ``score`` overrides it, even
    with a value outside [0, 1], to imitate an executor that breaks its contract). ``input_tokens``/``output_tokens``/``cost_usd``
    are reported per rollout so budget caps can be exercised. ``trace=False`` returns no
    trace at all (what the overhead benchmark wants).
    """

    def __init__(
        self,
        seconds: float = 0.0,
        fail_rate: float = 0.0,
        crash_rate: float = 0.0,
        seed: int = 0,
        *,
        score: float = 1.0,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float = 0.0,
        trace: bool = True,
        model_id: str = "sleep",
    ) -> None:
        for name, rate in (("fail_rate", fail_rate), ("crash_rate", crash_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"SleepExecutor: {name}={rate} must be in [0, 1]")
        if seconds < 0:
            raise ValueError(f"SleepExecutor: seconds={seconds} must be >= 0")
        self.seconds = float(seconds)
        self.fail_rate = float(fail_rate)
        self.crash_rate = float(crash_rate)
        self.seed = int(seed)
        self.score = float(score)
        self.input_tokens = int(input_tokens)
        self.output_tokens = int(output_tokens)
        self.cost_usd = float(cost_usd)
        self.trace = bool(trace)
        self.model_id = model_id
        self._attempts: Counter[tuple] = Counter()
        self._running: Counter[str] = Counter()
        # execute() runs on several threads at once; the counters must not race.
        self._lock = threading.Lock()
        self.calls = 0

    # --- shared logic ---------------------------------------------------------------
    def _rng(self, harness_id: str, task_id: str, rollout_idx: int, seed: int) -> np.random.Generator:
        key = (harness_id, task_id, int(rollout_idx), int(seed))
        self._attempts[key] += 1
        raw = f"{self.seed}|{seed}|{harness_id}|{task_id}|{rollout_idx}|{self._attempts[key]}".encode()
        return np.random.default_rng(int.from_bytes(hashlib.sha256(raw).digest()[:8], "little"))

    def _duration(self, task: Task) -> float:
        return float(task.metadata.get("sleep_s", self.seconds))

    def _begin(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> tuple[np.random.Generator, dict]:
        with self._lock:
            self.calls += 1
            rng = self._rng(harness.harness_id, task.task_id, rollout_idx, seed)
            crash_rate = float(task.metadata.get("crash_rate", self.crash_rate))
            if crash_rate and rng.random() < crash_rate:
                raise SimulatedInfraError(f"simulated infrastructure crash on {task.task_id}#{rollout_idx}")
            self._running[harness.harness_id] += 1
            self._running["__total__"] += 1
            seen = {
                "in_flight_same_harness": self._running[harness.harness_id],
                "in_flight_total": self._running["__total__"],
            }
        return rng, seen

    def _end(self, harness: Any, task: Task, rollout_idx: int, rng, seen: dict, t0: float) -> RolloutResult:
        self._release(harness)
        fail_rate = float(task.metadata.get("fail_rate", self.fail_rate))
        failed = bool(fail_rate and rng.random() < fail_rate)
        trace = None
        if self.trace:
            trace = {
                "trajectory": {"steps": [{"action": "sleep", "seconds": self._duration(task)}], **seen},
                "ctrf": {"results": {"summary": {"tests": 1, "passed": 0 if failed else 1}}},
            }
        return RolloutResult(
            harness_id=harness.harness_id,
            task_id=task.task_id,
            rollout_idx=rollout_idx,
            score=0.0 if failed else task.metadata.get("score", self.score),
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=self.cost_usd,
            latency_s=time.monotonic() - t0,
            error_kind="harness" if failed else None,
            error="simulated harness failure" if failed else None,
            trace=trace,
        )

    def _release(self, harness: Any) -> None:
        with self._lock:
            self._running[harness.harness_id] -= 1
            self._running["__total__"] -= 1

    # --- executor protocol ----------------------------------------------------------
    async def aexecute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        t0 = time.monotonic()
        rng, seen = self._begin(harness, task, rollout_idx, seed)
        try:
            duration = self._duration(task)
            if duration > 0:
                await asyncio.sleep(duration)
        except BaseException:
            # Cancelled by the scheduler's time cap: keep the in-flight counters honest.
            self._release(harness)
            raise
        return self._end(harness, task, rollout_idx, rng, seen, t0)

    def execute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        t0 = time.monotonic()
        rng, seen = self._begin(harness, task, rollout_idx, seed)
        duration = self._duration(task)
        if duration > 0:
            time.sleep(duration)
        return self._end(harness, task, rollout_idx, rng, seen, t0)


class BlockingSleepExecutor(SleepExecutor):
    """Same as :class:`SleepExecutor` but only offers the blocking ``execute``."""

    aexecute = None  # type: ignore[assignment]
