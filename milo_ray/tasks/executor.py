"""The executor of a task check: the task's reference solution or a do-nothing agent,
chosen per rollout by the pseudo-harness the request names.

Both are graded by the task's own verifier in a fresh sandbox, exactly as a real rollout
is (:class:`~milo_ray.execution.agent_executor.AgentExecutor`, whose ``oracle`` agent this
is): the check measures the suite the way a run will see it. Running both kinds from one
executor lets a single scheduler batch carry every task's oracle and no-op rollouts, so
they share the workers and run in parallel.

A request names :data:`ORACLE` or :data:`DO_NOTHING` (two fixed harnesses, told apart by
their content hash; their source is never imported or run). No model is called.
"""

from __future__ import annotations

import asyncio
from typing import Any

from milo_ray.core.tasks import format_of
from milo_ray.execution.agent_executor import AgentExecutor, _AgentRun
from milo_ray.execution.task_episode import is_episodic
from milo_ray.harness.model import Harness

# The rollouts of a check carry these harness ids; the text says what they stand for
# (a reader of the rollouts table sees it in the harness source).
ORACLE = Harness.from_source("# task check: the task's reference solution runs instead of an agent\n",
                             name="oracle")
DO_NOTHING = Harness.from_source("# task check: an agent that does nothing; the untouched workspace is graded\n",
                                 name="do-nothing")
CHECK_MODEL_ID = "task-check"


class CheckExecutor(AgentExecutor):
    """``AgentExecutor(agent="oracle")`` that leaves the workspace untouched for
    :data:`DO_NOTHING` requests. sandbox / scratch_dir / keep_scratch / grader: as for
    :class:`~milo_ray.execution.agent_executor.AgentExecutor`."""

    def __init__(self, sandbox: Any = None, scratch_dir: str | None = None, keep_scratch: bool = False,
                 grader: Any = None) -> None:
        super().__init__(model=None, sandbox=sandbox, agent="oracle", scratch_dir=scratch_dir,
                         keep_scratch=keep_scratch, warm_processes=0, grader=grader)
        self.model_id = CHECK_MODEL_ID

    async def _act(self, harness: Any, task: Any, sandbox: Any, scratch: Any, warm: Any = None,
                   label: str = "") -> _AgentRun:
        if harness.harness_id == DO_NOTHING.harness_id:
            await asyncio.to_thread(sandbox.interrupt)
            # A live task world is started and judged with no action taken.
            episode = (await self._episode(task, None, oracle=False, label=label)
                       if is_episodic(format_of(task)) else None)
            return _AgentRun(status="do-nothing", episode=episode)
        if harness.harness_id != ORACLE.harness_id:
            raise ValueError(f"harness {harness.harness_id}: a task check runs only its oracle and do-nothing "
                             "pseudo-harnesses (milo_ray.tasks.executor)")
        return await super()._act(harness, task, sandbox, scratch, warm, label=label)
