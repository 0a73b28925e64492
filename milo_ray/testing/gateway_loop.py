"""An executor whose rollouts are a harness loop calling the model forever through the
worker's real model gateway -- no sandbox, no harness process -- for tests of what the
gateway enforces across a run's workers (the run's budget) at the cost of a few seconds.

Each rollout gets a grant from this worker's :class:`~milo_ray.boundary.gateway.server.ModelGateway`
(with the rollout's share of the run's budget, as the real executor issues it), then posts
chat completions over the gateway's Unix socket until the gateway refuses one (or
``most_calls``), and returns a 0-score result whose tokens and USD are the grant's metered
calls and whose trajectory's ``final.status`` is the grant's stop reason.

    {"_target_": "milo_ray.testing.gateway_loop.GatewayLoopExecutor", "model": {...}}
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.boundary.gateway.call_journal import current_attempt_journal
from milo_ray.boundary.gateway.run_budget import current_rollout_budget


class GatewayLoopExecutor:
    # Its model calls go through the gateway, which charges the run's budget counter.
    meters_model_calls = True

    def __init__(self, model: Any, most_calls: int = 1000) -> None:
        self.model = dict(model)
        self.most_calls = int(most_calls)
        self._gateway: Any = None
        self._starting: asyncio.Lock | None = None
        self._secrets: dict[str, str] | None = None

    def set_secrets(self, env: dict[str, str]) -> None:
        """The driver's key variables (as the rollout worker hands them to any executor)."""
        self._secrets = dict(env)

    async def _gateway_on_loop(self) -> Any:
        from milo_ray.boundary.gateway.server import ModelGateway

        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._gateway is None:
                where = Path(tempfile.mkdtemp(prefix="milo-loop-gw-")) / f"{uuid.uuid4().hex[:8]}.sock"
                from milo_ray.llm.client import api_key

                gateway = ModelGateway(self.model, where)
                gateway.set_key(api_key(self.model, self._secrets if self._secrets is not None else os.environ))
                await gateway.start()
                self._gateway = gateway
        return self._gateway

    async def aexecute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        import aiohttp

        gateway = await self._gateway_on_loop()
        grant = gateway.issue(f"{harness.harness_id}/{task.task_id}", call_cap=self.most_calls,
                              run_budget=current_rollout_budget.get(), journal=current_attempt_journal.get())
        statuses: list[int] = []
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=gateway.socket_path)) as s:
                while grant.stop_reason is None:
                    async with s.post("http://gateway/v1/chat/completions",
                                      headers={"Authorization": f"Bearer {grant.token}"},
                                      json={"messages": [{"role": "user", "content": "again"}]}) as r:
                        statuses.append(r.status)
                        await r.read()
                        if r.status != 200:
                            break
        finally:
            gateway.end(grant)
        calls = list(grant.calls)
        prices = [c["cost_usd"] for c in calls]
        return RolloutResult(
            harness.harness_id, task.task_id, rollout_idx, score=0.0,
            input_tokens=sum(c["input_tokens"] for c in calls), output_tokens=sum(c["output_tokens"] for c in calls),
            cost_usd=None if any(p is None for p in prices) else float(sum(prices)),
            trace={"trajectory": {"final": {"status": grant.stop_reason or "completed", "model_calls": len(calls)},
                                  "calls": calls, "statuses": statuses}})
