"""AgentExecutor (``executor=deepagents``): one real rollout of a harness on a task.

For one (harness, task, rollout) it opens a sandbox holding the task's workspace, imports
the harness in this worker process (never in the driver), builds the solver model from
the ``model`` config, calls ``build_agent(model, sandbox)`` and runs the agent on the task
instruction; then the task's own verifier grades the workspace in the same sandbox, and
the sandbox is closed. With ``agent: oracle`` the task's reference solution runs instead
of an agent (no model, no tokens): a task suite is validated before money is spent.

Caps, each recorded in the trajectory's ``final.status``:

* the task's agent time (``task.time_cap_s``) bounds the whole agent run -- deepagents
  has none of its own. When it hits, the run is cancelled, every process in the sandbox is
  killed, and the workspace is graded as it stands (``timed_out=True``);
* ``recursion_limit`` bounds the agent's graph steps (``step_cap``);
* ``task.token_cap`` bounds the tokens of the run's model calls (``token_cap``);
* the sandbox bounds every command (its per-command timeout and output cap).

Failures: a harness that does not import, whose ``build_agent`` raises, or whose agent
crashes is a harness failure (``error_kind="harness"``; a crashed agent's workspace is
still graded); a verifier that produces no reward is a task failure (``"task"``). A model
endpoint that keeps failing after the model's own retries (429, 5xx, connection errors,
timeouts) raises :class:`~milo_ray.execution.types.InfraFailure` out of :meth:`aexecute`
with the calls the attempt made: an infrastructure failure, which the scheduler retries
and finally records as ``"infra"``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from milo_ray.execution.types import InfraFailure, RolloutResult, Task

log = logging.getLogger(__name__)

AGENTS = ("harness", "oracle")
# Recorded for the oracle "model": no model is called.
ORACLE_MODEL_ID = "oracle"


class AgentExecutor:
    """Executor protocol implementation that runs harnesses for real.

    model: the ``model`` config (``${model}``; a litellm ``solver`` is required unless
        ``agent`` is ``oracle``). sandbox: the ``sandbox`` config (a ``_target_`` mapping
        or a built :class:`~milo_ray.execution.sandbox.base.SandboxFactory`).
    agent: ``harness`` (run the harness's agent) or ``oracle`` (run each task's
        ``solution/solve.sh``). recursion_limit: the agent's graph-step cap.
    scratch_dir: where per-rollout scratch directories go (None: the system temp dir);
        keep_scratch: keep them after the rollout (for debugging a task or sandbox).
    """

    def __init__(self, model: Any = None, sandbox: Any = None, agent: str = "harness", recursion_limit: int = 150,
                 scratch_dir: str | None = None, keep_scratch: bool = False) -> None:
        from milo_ray.config import model_config

        if agent not in AGENTS:
            raise ValueError(f"executor.agent={agent!r}: choose one of {AGENTS}")
        if int(recursion_limit) < 1:
            raise ValueError(f"executor.recursion_limit={recursion_limit}: must be >= 1 graph steps")
        self.model = model_config(model)
        self.agent = agent
        self.preflight(self.model, None, {"agent": agent})
        self.model_id = ORACLE_MODEL_ID if agent == "oracle" else self.model.id
        self.sandbox = build_factory(sandbox)
        self.recursion_limit = int(recursion_limit)
        self.scratch_dir = scratch_dir
        self.keep_scratch = bool(keep_scratch)
        self._chat_model: Any = None

    # --- checks before a run starts -------------------------------------------------------
    @staticmethod
    def preflight(model: Any, benchmark: Any = None, executor: Mapping[str, Any] | None = None) -> None:
        """Refuse a model this executor cannot run before the run writes anything: the
        harness agent needs a litellm ``solver`` and its credentials (one line naming the
        missing environment variable)."""
        agent = (executor or {}).get("agent", "harness")
        if agent == "oracle":
            return
        solver = getattr(model, "solver", None)
        if not solver:
            raise ValueError("model.solver: executor=deepagents runs each harness against a real model; use "
                             "model=litellm model.solver=PROVIDER/NAME (or executor.agent=oracle to run the tasks' "
                             "reference solutions without a model)")
        from milo_ray.agents.llm import check_credentials

        check_credentials(model)

    def unsupported_tasks(self, tasks: list[Task]) -> list[str]:
        """One line per task this executor's sandbox cannot run (e.g. a Dockerfile with
        RUN steps under ``sandbox=bwrap``), or a task the oracle cannot solve."""
        from milo_ray.benchmarks.task_format import format_of

        problems = []
        for task in tasks:
            why = self.sandbox.unsupported(format_of(task).sandbox_spec(task))
            if why:
                problems.append(why)
            elif self.agent == "oracle" and not task.metadata.get("has_solution", True):
                problems.append(f"task {task.task_id}: no reference solution, so executor.agent=oracle cannot run it")
        return problems

    # --- one rollout ----------------------------------------------------------------------
    def execute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        return asyncio.run(self.aexecute(harness, task, rollout_idx, seed))

    async def aexecute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        from milo_ray.benchmarks.task_format import format_of

        fmt = format_of(task)
        spec = fmt.sandbox_spec(task)
        scratch = Path(tempfile.mkdtemp(prefix=f"milo-{task.task_id[:40]}-", dir=self.scratch_dir))
        try:
            sandbox = await asyncio.to_thread(self.sandbox.open, spec, scratch / "sandbox")
            try:
                run = await self._act(harness, task, sandbox, scratch)
                verdict = await asyncio.to_thread(fmt.verify, task, sandbox)
            finally:
                await asyncio.to_thread(sandbox.close)
        finally:
            if not self.keep_scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        return run.result(harness.harness_id, task, rollout_idx, verdict, self.model_id)

    async def _act(self, harness: Any, task: Task, sandbox: Any, scratch: Path) -> "_AgentRun":
        if self.agent == "oracle":
            started = time.time()
            error = await asyncio.to_thread(_solve, task, sandbox)
            return _AgentRun(status="oracle", seconds=time.time() - started, error=error,
                             error_kind="task" if error else None)
        from milo_ray.harness.loader import HarnessLoadError, load_harness

        try:
            module = load_harness(harness, scratch.parent / "milo-harnesses")
            agent = module.build_agent(self._model(), sandbox)
        except HarnessLoadError as exc:
            return _AgentRun(status="harness_error", error=str(exc), error_kind="harness")
        except Exception as exc:
            return _AgentRun(status="harness_error", error=f"build_agent raised {type(exc).__name__}: {exc}",
                             error_kind="harness")
        return await _run_agent(agent, task, sandbox, self.recursion_limit, self.model)

    def _model(self) -> Any:
        # One chat model per worker process: it holds the HTTP client and the rate limiter.
        if self._chat_model is None:
            from milo_ray.agents.llm import build_chat_model

            self._chat_model = build_chat_model(self.model)
        return self._chat_model


class _AgentRun:
    """How the agent part of a rollout went (before grading)."""

    def __init__(self, status: str, seconds: float = 0.0, error: str | None = None, error_kind: str | None = None,
                 recorder: Any = None, calls: list[dict[str, Any]] | None = None) -> None:
        from milo_ray.execution.trajectory import TrajectoryRecorder

        self.status, self.seconds, self.error, self.error_kind = status, seconds, error, error_kind
        self.recorder = recorder or TrajectoryRecorder()
        self.calls = calls or []

    def result(self, harness_id: str, task: Task, rollout_idx: int, verdict: Any, model_id: str) -> RolloutResult:
        from milo_ray.execution.trajectory import trajectory

        error_kind, error = self.error_kind, self.error
        if verdict.error:  # the verifier failing is the task's failure, whatever the agent did
            error_kind, error = "task", f"{error}; verifier: {verdict.error}" if error else verdict.error
        costs = [c["cost_usd"] for c in self.calls]
        cost = None if any(c is None for c in costs) else float(sum(costs))
        traj = trajectory(self.recorder, task_id=task.task_id, harness_id=harness_id, rollout_idx=rollout_idx,
                          model_id=model_id, status=self.status, agent_seconds=self.seconds, calls=self.calls,
                          error=self.error)
        trace = {"trajectory": traj, "ctrf": verdict.ctrf,
                 "verifier": {"score": verdict.score, "reward": verdict.reward, "error": verdict.error,
                              "seconds": round(verdict.seconds, 3), "output": verdict.output,
                              "details": verdict.details}}
        return RolloutResult(harness_id, task.task_id, rollout_idx, score=float(verdict.score),
                             input_tokens=traj["final"]["input_tokens"], output_tokens=traj["final"]["output_tokens"],
                             cost_usd=cost, latency_s=float(self.seconds), timed_out=self.status == "timeout",
                             error_kind=error_kind, error=error, trace=trace)


async def _run_agent(agent: Any, task: Task, sandbox: Any, recursion_limit: int, model: Any) -> _AgentRun:
    """Run ``agent`` on the task under the time, step and token caps; keep every message
    seen so far whatever stops it."""
    from langgraph.errors import GraphRecursionError

    from milo_ray.agents.solver_calls import SolverCallRecorder
    from milo_ray.execution.trajectory import TrajectoryRecorder

    recorder, calls = TrajectoryRecorder(), SolverCallRecorder(model)
    status, error, error_kind = "completed", None, None
    token_cap = int(task.token_cap) if task.token_cap and task.token_cap > 0 else None

    async def consume() -> str:
        config = {"recursion_limit": recursion_limit, "callbacks": [calls]}
        inputs = {"messages": [{"role": "user", "content": task.instruction}]}
        async for state in agent.astream(inputs, config=config, stream_mode="values"):
            recorder.observe(state)
            if token_cap is not None and calls.tokens() >= token_cap:
                return "token_cap"
        return "completed"

    started = time.time()
    cap = task.time_cap_s if task.time_cap_s and task.time_cap_s > 0 else None
    try:
        status = await asyncio.wait_for(consume(), timeout=cap)
    except asyncio.TimeoutError:
        status = "timeout"
    except GraphRecursionError:
        status = "step_cap"
    except Exception as exc:
        if is_endpoint_error(exc):
            # The model endpoint failed past its retries: infrastructure, retried by the
            # scheduler, which also records the calls this attempt made.
            raise InfraFailure(f"model endpoint: {type(exc).__name__}: {exc}", calls.as_dicts()) from exc
        status, error_kind = "harness_error", "harness"
        error = f"the agent raised {type(exc).__name__}: {exc}"
    seconds = time.time() - started
    if status != "completed":
        # Whatever the agent started is still running in the sandbox (a cancelled tool
        # call's command goes on in its thread): stop it before grading.
        await asyncio.to_thread(sandbox.interrupt)
    return _AgentRun(status=status, seconds=seconds, error=error, error_kind=error_kind, recorder=recorder,
                     calls=calls.as_dicts())


def _solve(task: Task, sandbox: Any) -> str | None:
    from milo_ray.benchmarks.task_format import format_of

    return format_of(task).solve(task, sandbox)


def is_endpoint_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the model endpoint failing (litellm/openai/httpx errors: rate
    limits, server errors, timeouts, refused connections, bad credentials) rather than
    the harness's own code."""
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("litellm", "openai", "httpx", "httpcore"):
            return True
    return False


def build_factory(sandbox: Any) -> Any:
    if sandbox is None:
        raise ValueError("executor.sandbox: missing; choose a sandbox (sandbox=bwrap, sandbox=docker or sandbox=local)")
    if isinstance(sandbox, Mapping) or type(sandbox).__name__ == "DictConfig":
        from hydra.utils import instantiate

        sandbox = instantiate(sandbox)
    for name in ("open", "unsupported"):
        if not callable(getattr(sandbox, name, None)):
            raise TypeError(f"executor.sandbox built {type(sandbox).__name__}, which has no {name}(); point "
                            "_target_ at a SandboxFactory (milo_ray.execution.sandbox.base)")
    return sandbox
