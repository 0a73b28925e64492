"""The surrogate executor with wall-clock time per rollout, so a multi-node test can
lose a node while rollouts are in flight there. Scores are the surrogate's own (the
delay changes nothing stored but the timestamps)."""

from __future__ import annotations

import asyncio
from typing import Any

from milo_ray.benchmarks.surrogate_executor import SurrogateExecutor


class SlowSurrogate(SurrogateExecutor):
    def __init__(self, *args: Any, delay_s: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay_s = float(delay_s)

    async def aexecute(self, harness, task, rollout_idx: int, seed: int):
        await asyncio.sleep(self.delay_s)
        return self.execute(harness, task, rollout_idx, seed)
