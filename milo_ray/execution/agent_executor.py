"""AgentExecutor (``executor=deepagents``): one real rollout of a harness on a task.

For one (harness, task, rollout) it opens a sandbox holding the task's workspace and
starts the harness process inside it (:mod:`milo_ray.boundary.inside.harness_process`): the
harness is imported, ``build_agent(model, backend)`` called and the agent run there, as
an unprivileged user with the harness files and the interpreter read-only -- never in
this worker. The harness's chat model reaches the provider only through this worker's
model gateway (:mod:`milo_ray.boundary.gateway`), with a token issued for this rollout
on a socket of its own, the only gateway socket its sandbox is shown; the gateway holds
the key and records every call, so the rollout's tokens and USD are the gateway's. When
the agent is done its processes are killed, and the task's verifier grades the workspace
in a fresh sandbox (the task's tests and solution are never in the agent's).
With ``agent: oracle`` the task's reference solution runs instead of an agent (no model,
no tokens): a task suite is validated before money is spent.

Caps, each recorded in the trajectory's ``final.status``:

* the task's agent time (``task.time_cap_s``) bounds the agent run from the moment the
  harness process has built its agent; importing the harness and ``build_agent`` are
  bounded by ``startup_timeout_s``. When a cap hits, every process in the sandbox is
  killed and the workspace is graded as it stands (``timeout``, ``timed_out=True``);
* ``recursion_limit`` bounds the agent's graph steps (``step_cap``);
* ``task.token_cap`` bounds the tokens of the rollout's model calls, counted by the
  gateway: once reached the rollout ends (``token_cap``);
* ``max_model_calls`` bounds the number of model calls (``call_cap``);
* the run's token/USD budget (``run.budget.tokens`` / ``cost_usd``), counted across every
  worker of the run by :mod:`~milo_ray.boundary.gateway.run_budget`: once it is spent the
  gateway refuses the rollout's next call and the rollout ends (``run_budget``). Only a
  rollout the scheduler counts against the budget carries it (not a final evaluation);
* the sandbox bounds every command (its per-command timeout and output cap).

Failures: a harness that does not import, whose ``build_agent`` raises, whose agent
crashes, or whose process breaks the trajectory protocol is a harness failure
(``error_kind="harness"``; the workspace is still graded); a verifier that produces no
reward is a task failure (``"task"``). A model endpoint that keeps failing after the
gateway's retries (429, 5xx, connection errors, timeouts) raises
:class:`~milo_ray.core.rollouts.InfraFailure` out of :meth:`aexecute` with the calls
the attempt made: an infrastructure failure, which the scheduler retries (within its
bounds per rollout and per harness) and finally records as ``"infra"``. Only the gateway
says whether the endpoint failed: the rollout is an infrastructure failure when its agent
failed right after a call the gateway classed ``infra``; a request the provider refused as
sent (400, 401/403, 404, 413, 422) is the harness's, and what the harness process says
about itself (``endpoint_error``) is kept in the error text, never believed. Calls still in
flight when the agent ends are waited for and charged (:meth:`ModelGateway.settle`).

Keys: the executor reads its model's key from the secrets the driver hands it
(:meth:`set_secrets`, an actor-method argument of the rollout worker), else from this
process's environment (a run without Ray, where this is the driver).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from milo_ray.core.rollouts import InfraFailure, RolloutResult
from milo_ray.core.tasks import Task, format_of
from milo_ray.execution.grader import GraderUnavailable
from milo_ray.execution.task_episode import RunningEpisode, is_episodic, start_episode
from milo_ray.boundary.gateway.call_journal import current_attempt_journal
from milo_ray.boundary.gateway.run_budget import current_rollout_budget
from milo_ray.boundary.harness_process.host import HarnessProcess, gateway_dir_of, harness_binds, harness_dir_of
from milo_ray.boundary.harness_process.pool import WarmPool, parse_size
from milo_ray.boundary.sandbox.carried import CarriedDirs, carry_dirs
from milo_ray.boundary.sandbox.interpreter import with_interpreter
from milo_ray.boundary.sandbox.leftovers import make_scratch
from milo_ray.boundary.sandbox.runtime_code import write_harness
from milo_ray.boundary.trajectory import trajectory

log = logging.getLogger(__name__)

AGENTS = ("harness", "oracle")
# Recorded for the oracle "model": no model is called.
ORACLE_MODEL_ID = "oracle"


class AgentExecutor:
    """Executor protocol implementation that runs harnesses for real.

    model: the ``model`` config (``${model}``; a litellm ``solver`` is required unless
        ``agent`` is ``oracle``). sandbox: the ``sandbox`` config (a ``_target_`` mapping
        or a built :class:`~milo_ray.boundary.sandbox.base.SandboxFactory`).
    agent: ``harness`` (run the harness's agent) or ``oracle`` (run each task's
        ``solution/solve.sh``). recursion_limit: the agent's graph-step cap.
    max_model_calls: model calls one rollout may make (None: no cap; the task's token
        cap and time cap still bound it). startup_timeout_s: how long the harness's
        import and ``build_agent`` may take. warm_processes: harness processes kept
        started ahead per sandbox shape, so a rollout skips the interpreter's start and
        imports: a number, or ``"auto"`` for as many as rollouts in flight
        (:mod:`milo_ray.boundary.harness_process.pool`; 0: none).
    scratch_dir: where per-rollout scratch directories go (None: the system temp dir);
        keep_scratch: keep them after the rollout (for debugging a task or sandbox).
    """

    # Every model call goes through this executor's gateway, which charges the run's
    # budget counter call by call (the scheduler starts one for a run with a token/USD cap).
    meters_model_calls = True

    def __init__(self, model: Any = None, sandbox: Any = None, agent: str = "harness", recursion_limit: int = 150,
                 scratch_dir: str | None = None, keep_scratch: bool = False, max_model_calls: int | None = 500,
                 startup_timeout_s: float = 120.0, warm_processes: int | str = 0, grader: Any = None) -> None:
        from milo_ray.config.schemas import model_config
        from milo_ray.execution.grader import GraderSettings

        if agent not in AGENTS:
            raise ValueError(f"executor.agent={agent!r}: choose one of {AGENTS}")
        if int(recursion_limit) < 1:
            raise ValueError(f"executor.recursion_limit={recursion_limit}: must be >= 1 graph steps")
        if max_model_calls is not None and int(max_model_calls) < 1:
            raise ValueError(f"executor.max_model_calls={max_model_calls}: must be >= 1 calls or null (no cap)")
        if float(startup_timeout_s) <= 0:
            raise ValueError(f"executor.startup_timeout_s={startup_timeout_s}: must be > 0 seconds")
        self.model = model_config(model)
        self.agent = agent
        # The credentials are checked by preflight() in the driver; a rollout worker has
        # none in its environment (the driver hands them over with set_secrets()).
        _check_solver(self.model, agent)
        self.model_id = ORACLE_MODEL_ID if agent == "oracle" else self.model.id
        self.sandbox = build_factory(sandbox)
        if agent == "harness":
            # The harness process runs on this interpreter, shown read-only inside.
            self.sandbox = with_interpreter(self.sandbox)
        self.recursion_limit = int(recursion_limit)
        self.max_model_calls = None if max_model_calls is None else int(max_model_calls)
        self.startup_timeout_s = float(startup_timeout_s)
        self.scratch_dir = scratch_dir
        self.keep_scratch = bool(keep_scratch)
        # The grader role a format's verifier may call (executor.grader; None: none configured).
        self.grader = GraderSettings.of(grader)

        warm = parse_size(warm_processes)
        if warm == "auto" and getattr(self.sandbox, "binds_at_open", False):
            warm = 0  # "as many as help": none can under Docker (below)
        if warm and agent == "harness" and getattr(self.sandbox, "binds_at_open", False):
            raise ValueError(f"executor.warm_processes={warm_processes}: warm harness processes need "
                             "sandbox=bwrap (a container's mounts are fixed when it starts, before its rollout is "
                             "known); set executor.warm_processes=0 for sandbox=docker")

        self.pool = WarmPool(self.sandbox, warm if agent == "harness" else 0, scratch_dir)
        self._secrets: dict[str, str] | None = None
        self._gateway: Any = None
        self._gateway_starting: asyncio.Future | None = None
        self._gateway_dir: str | None = None

    # --- checks before a run starts -------------------------------------------------------
    @staticmethod
    def preflight(model: Any, benchmark: Any = None, executor: Mapping[str, Any] | None = None) -> None:
        """Refuse a model this executor cannot run before the run writes anything: the
        harness agent needs a litellm ``solver`` and its credentials (one line naming the
        missing environment variable)."""
        agent = (executor or {}).get("agent", "harness")
        _check_solver(model, agent)
        if agent == "oracle":
            return
        from milo_ray.llm.client import check_credentials

        check_credentials(model)

    def unsupported_tasks(self, tasks: list[Task]) -> list[str]:
        """One line per task this executor's sandbox cannot run (e.g. a Dockerfile with
        RUN steps under ``sandbox=bwrap``), or a task the oracle cannot solve."""

        problems = []
        for task in tasks:
            why = self.sandbox.unsupported(format_of(task).sandbox_spec(task))
            if why:
                problems.append(why)
            elif self.agent == "oracle" and not task.metadata.get("has_solution", True):
                problems.append(f"task {task.task_id}: no reference solution, so executor.agent=oracle cannot run it")
            elif self.agent == "harness" and not getattr(self.sandbox, "hosts_harness", False):
                problems.append(f"task {task.task_id}: sandbox={getattr(self.sandbox, 'name', '?')} cannot host the "
                                "harness process; use sandbox=bwrap or sandbox=docker")
            elif getattr(format_of(task), "uses_grader", False) and self.grader is None:
                problems.append(f"task {task.task_id}: its verifier needs a grader model; set "
                                "executor.grader.llm.model=PROVIDER/NAME (or executor.grader.scripted=true offline)")
        return problems

    # --- secrets and the gateway ----------------------------------------------------------
    def set_secrets(self, env: Mapping[str, str]) -> None:
        """The driver's key variables (name -> value), handed over as an argument: kept in
        this object and the gateway only, never in an environment."""
        self._secrets = dict(env)
        if self._gateway is not None:
            self._gateway.set_key(self._key())

    def _key(self) -> str | dict[str, str] | None:
        from milo_ray.llm.client import api_key, gateway_credentials

        env = self._secrets if self._secrets is not None else os.environ
        return gateway_credentials(self.model, api_key(self.model, env), env)

    async def gateway(self) -> Any:
        """This executor's gateway on the running loop (started on first use; a new loop,
        e.g. one ``asyncio.run`` per rollout, gets a new one)."""
        from milo_ray.boundary.gateway.server import ModelGateway

        loop = asyncio.get_running_loop()
        if self._gateway is not None and self._gateway.loop is loop:
            return self._gateway
        # Concurrent first rollouts wait for the one gateway being started.
        starting = self._gateway_starting
        if starting is None or starting.get_loop() is not loop:
            starting = self._gateway_starting = loop.create_future()
            try:
                if self._gateway_dir is None:
                    self._gateway_dir = tempfile.mkdtemp(prefix="milo-gateway-")  # 0700: this user only
                gw = ModelGateway(self.model, Path(self._gateway_dir) / f"gateway-{uuid.uuid4().hex[:12]}.sock")
                gw.set_key(self._key())
                await gw.start()
            except BaseException as exc:
                self._gateway_starting = None
                starting.set_exception(exc)
                raise
            self._gateway = gw
            starting.set_result(gw)
        return await asyncio.shield(starting)

    # --- one rollout ----------------------------------------------------------------------
    def execute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        return asyncio.run(self.aexecute(harness, task, rollout_idx, seed))

    async def aexecute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        fmt = format_of(task)
        spec = fmt.sandbox_spec(task)
        spare = None
        pooled = bool(self.pool.size and getattr(self.sandbox, "hosts_harness", False))
        try:
            if pooled:
                spare = await self.pool.take(spec)
            return await self._execute(harness, task, rollout_idx, fmt, spec, spare)
        finally:
            if pooled:
                self.pool.release(spec)

    async def _execute(self, harness: Any, task: Task, rollout_idx: int, fmt: Any, spec: Any,
                       spare: Any) -> RolloutResult:
        scratch = spare.scratch if spare else make_scratch("rollout", self.scratch_dir)
        label = f"{harness.harness_id}/{task.task_id}/{rollout_idx}"
        try:
            if spare is not None:
                sandbox = spare.sandbox
                await asyncio.to_thread(sandbox.dirs.add_files, spec.copy_in)
                await asyncio.to_thread(spare.process.assign, harness)
            else:
                binds = await self._binds_at_open(harness, scratch)
                sandbox = await asyncio.to_thread(self.sandbox.open, spec, scratch / "agent", **binds)
            try:
                await asyncio.to_thread(_make_carried_dirs, fmt, sandbox)
                run = await self._act(harness, task, sandbox, scratch, spare.process if spare else None, label=label)
            except BaseException:
                await asyncio.to_thread(sandbox.close)
                raise
            try:
                if run.episode is not None:  # the world judges; the sandbox holds nothing to grade
                    await asyncio.to_thread(sandbox.close)
                    verdict = await run.episode.verdict()
                else:
                    verdict = await self._grade(fmt, task, spec, sandbox, scratch, label)
            except GraderUnavailable as exc:  # the grader's endpoint, not the submission
                raise InfraFailure(f"grader model endpoint: {exc}", run.calls) from None
            except InfraFailure as exc:
                raise InfraFailure(str(exc), run.calls) from None
            _void_if_screened(fmt, task, run, verdict)
        finally:
            if not self.keep_scratch:
                await asyncio.to_thread(shutil.rmtree, scratch, True)
        return run.result(harness.harness_id, task, rollout_idx, verdict, self.model_id)

    async def _binds_at_open(self, harness: Any, scratch: Path) -> dict[str, Any]:
        """The ``open`` arguments of a sandbox that takes the harness process's read-only
        binds when it starts (Docker): the harness files are written first, and the
        process's gateway directory made, so that both exist to be mounted (the grant's
        socket is made in that directory later, before the job is sent)."""
        if self.agent != "harness" or not getattr(self.sandbox, "binds_at_open", False):
            return {}

        where = await asyncio.to_thread(write_harness, harness, harness_dir_of(scratch))
        gateway_dir = gateway_dir_of(scratch)
        gateway_dir.mkdir(mode=0o755, exist_ok=True)
        os.chmod(gateway_dir, 0o755)  # the container's user reaches its socket through it
        return {"readonly_binds": harness_binds(where, gateway_dir)}

    async def _grade(self, fmt: Any, task: Task, spec: Any, sandbox: Any, scratch: Path, label: str = "") -> Any:
        """Grade in a fresh sandbox on the agent's workspace, after every process of the
        agent's sandbox is dead (the fresh one shares nothing else with it: not its /tmp,
        its home, its /logs). bwrap: the workspace directory moves into a fresh sandbox;
        Docker: the agent's container is removed and a fresh one from the same image
        gets its workspace directory (as under bwrap). Any other sandbox (local) is graded in place once
        its processes are killed. What the format carries from the agent phase besides the
        workspace (``fmt.carried_dirs``: Harbor's /logs/agent and /logs/artifacts) is copied
        out by the host without following a link and shown read-only to the fresh sandbox
        (:mod:`~milo_ray.boundary.sandbox.carried`); the verdict's details keep what was
        carried and what was dropped (``carried``)."""
        fresh_for_grading = getattr(sandbox, "fresh_for_grading", None)
        if fresh_for_grading is not None:
            try:
                carried = await asyncio.to_thread(_carry, fmt, sandbox, scratch)
                fresh = await asyncio.to_thread(fresh_for_grading, **_binds_of(carried))
            except BaseException:
                await asyncio.to_thread(sandbox.close)
                raise
            try:
                return _noting(await asyncio.to_thread(self._verify, fmt, task, fresh, label), carried)
            finally:
                await asyncio.to_thread(fresh.close)
        workspace = getattr(sandbox, "workspace_dir", None)
        if workspace is None:
            try:
                await asyncio.to_thread(sandbox.interrupt)
                return await asyncio.to_thread(self._verify, fmt, task, sandbox, label)
            finally:
                await asyncio.to_thread(sandbox.close)
        await asyncio.to_thread(sandbox.close)
        carried = await asyncio.to_thread(_carry, fmt, sandbox, scratch)
        grade_root = scratch / "grade"
        grade_root.mkdir()
        os.rename(workspace, grade_root / "workspace")
        fresh = await asyncio.to_thread(self.sandbox.open, dataclasses.replace(spec, copy_in=()), grade_root,
                                        **_binds_of(carried))
        try:
            return _noting(await asyncio.to_thread(self._verify, fmt, task, fresh, label), carried)
        finally:
            await asyncio.to_thread(fresh.close)

    def _verify(self, fmt: Any, task: Task, sandbox: Any, label: str) -> Any:
        """The format's verdict; a format that asks for the grader role gets this rollout's
        grader (made here, after the agent's processes are dead, and only here), and its
        calls go with the verdict. Any other format is called as before."""
        grader = self._rollout_grader(fmt, task, label)
        if grader is None:
            return fmt.verify(task, sandbox)
        verdict = fmt.verify(task, sandbox, grader=grader)
        verdict.grader = grader.record()
        return verdict

    def _rollout_grader(self, fmt: Any, task: Task, label: str) -> Any:
        """This rollout's grader when ``fmt`` asks for the grader role (None otherwise)."""
        if not getattr(fmt, "uses_grader", False):
            return None
        if self.grader is None:
            raise ValueError(f"task {task.task_id}: its verifier needs a grader model; set "
                             "executor.grader.llm.model=PROVIDER/NAME (or executor.grader.scripted=true offline)")
        return self.grader.for_rollout(label, self._secrets)

    async def _episode(self, task: Task, socket: Path | None, *, oracle: bool, label: str) -> RunningEpisode:
        fmt = format_of(task)
        return await start_episode(fmt, task, socket=socket, oracle=oracle,
                                   grader=self._rollout_grader(fmt, task, label))

    async def _act(self, harness: Any, task: Task, sandbox: Any, scratch: Path, warm: Any = None,
                   label: str = "") -> "_AgentRun":
        if self.agent == "oracle" and is_episodic(format_of(task)):
            started = time.time()
            await asyncio.to_thread(sandbox.interrupt)
            episode = await self._episode(task, None, oracle=True, label=label)
            return _AgentRun(status="oracle", seconds=time.time() - started, episode=episode)
        if self.agent == "oracle":
            started = time.time()
            error = await asyncio.to_thread(_solve, task, sandbox)
            await asyncio.to_thread(sandbox.interrupt)
            return _AgentRun(status="oracle", seconds=time.time() - started, error=error,
                             error_kind="task" if error else None)

        if not getattr(self.sandbox, "hosts_harness", False):
            raise ValueError(f"sandbox={getattr(self.sandbox, 'name', '?')} cannot host the harness process "
                             "(executor.agent=harness); use sandbox=bwrap or sandbox=docker")

        gateway = await self.gateway()
        token_cap = int(task.token_cap) if task.token_cap and task.token_cap > 0 else None
        process = warm or HarnessProcess(sandbox, harness, scratch)
        # A task that is a live world serves its tools in this process's gateway directory.
        episode = None
        if is_episodic(format_of(task)):
            episode = await self._episode(task, process.task_tools_socket, oracle=False, label=label)
        try:
            agent_run = await self._run_harness(process, task, gateway, token_cap, episode is not None)
        except BaseException:
            if episode is not None:
                await episode.close()
            raise
        agent_run.episode = episode
        agent_run.warm = warm is not None
        return agent_run

    async def _run_harness(self, process: Any, task: Task, gateway: Any, token_cap: int | None,
                           task_tools: bool) -> "_AgentRun":
        harness = process.harness
        # The grant's own socket, in the one directory this process's sandbox is shown: a
        # token is worthless on any other socket (see boundary/harness_process/host.py).
        grant = await gateway.issue_bound(f"{harness.harness_id}/{task.task_id}", process.gateway_dir,
                                          token_cap=token_cap, call_cap=self.max_model_calls,
                                          run_budget=current_rollout_budget.get(),
                                          journal=current_attempt_journal.get())
        try:
            job = process.job(task, token=grant.token, recursion_limit=self.recursion_limit,
                              model=_inner_model(self.model), task_tools=task_tools)
            cap = task.time_cap_s if task.time_cap_s and task.time_cap_s > 0 else None
            run = await process.run(task, job=job, startup_timeout_s=self.startup_timeout_s, agent_cap_s=cap,
                                    stopped=grant.stopped)
        finally:
            gateway.end(grant)
            await gateway.settle(grant)
        calls = list(grant.calls)
        status, error, error_kind = run.status, run.error, None
        if status == "stopped" or (grant.stop_reason and status == "harness_error"):
            # The gateway ended it (or refused the call the agent then failed on).
            status, error = grant.stop_reason or "token_cap", None
        elif status == "harness_error":
            endpoint = grant.endpoint_failure()
            if endpoint is not None:
                raise InfraFailure(f"model endpoint: {endpoint}", calls)
            error_kind = "harness"
            if run.endpoint_error:  # the harness's own word, kept but never believed
                error = f"{error} (the harness reported a model-endpoint error; the gateway recorded none past " \
                        "its retries)"
        agent_run = _AgentRun(status=status, seconds=run.seconds, error=error, error_kind=error_kind, steps=run.steps,
                              calls=calls, stderr=run.stderr_tail)
        agent_run.gateway_failures = list(grant.failures)
        agent_run.startup_s = run.startup_s
        return agent_run


def _check_solver(model: Any, agent: str) -> None:
    if agent == "oracle":
        return
    solver = model.get("solver") if isinstance(model, Mapping) else getattr(model, "solver", None)
    if not solver:
        raise ValueError("model.solver: executor=deepagents runs each harness against a real model; use "
                         "model=litellm model.solver=PROVIDER/NAME (or executor.agent=oracle to run the tasks' "
                         "reference solutions without a model)")


def _inner_model(cfg: Any) -> dict[str, Any]:
    """The chat-model settings the harness process builds its model from: no key, no
    endpoint (the gateway has both), no retries (the gateway retries)."""
    from milo_ray.llm.client import gateway_client_timeout

    return {"solver": cfg.solver, "temperature": cfg.temperature, "max_tokens": cfg.max_output_tokens,
            "request_timeout": gateway_client_timeout(cfg)}


class _AgentRun:
    """How the agent part of a rollout went (before grading)."""

    def __init__(self, status: str, seconds: float = 0.0, error: str | None = None, error_kind: str | None = None,
                 steps: list[dict[str, Any]] | None = None, calls: list[dict[str, Any]] | None = None,
                 stderr: str = "", episode: Any = None) -> None:
        self.status, self.seconds, self.error, self.error_kind = status, seconds, error, error_kind
        self.steps = steps or []
        self.calls = calls or []
        self.stderr = stderr
        self.startup_s: float | None = None  # the harness process's launch (or job) to its agent built
        self.warm = False  # the harness process was started ahead (boundary/harness_process/pool.py)
        self.gateway_failures: list[dict[str, Any]] = []  # failed/refused calls, classed by the gateway
        self.episode = episode  # a live task world's (execution/task_episode.py), judged after the agent

    def result(self, harness_id: str, task: Task, rollout_idx: int, verdict: Any, model_id: str) -> RolloutResult:
        error_kind, error = self.error_kind, self.error
        if verdict.error:  # the verifier failing is the task's failure, whatever the agent did
            error_kind, error = "task", f"{error}; verifier: {verdict.error}" if error else verdict.error
        costs = [c["cost_usd"] for c in self.calls]
        cost = None if any(c is None for c in costs) else float(sum(costs))
        traj = trajectory(self.steps, task_id=task.task_id, harness_id=harness_id, rollout_idx=rollout_idx,
                          model_id=model_id, status=self.status, agent_seconds=self.seconds, calls=self.calls,
                          error=self.error)
        if self.stderr:
            traj["harness_stderr"] = self.stderr
        if self.gateway_failures:
            traj["gateway_failures"] = self.gateway_failures
        grader = getattr(verdict, "grader", None)
        if self.startup_s is not None:
            traj["startup_s"] = round(self.startup_s, 3)
            traj["warm_process"] = self.warm
        score = float(verdict.score)
        if self.status == "oracle" and self.error:
            # A reference solution that failed (a gold patch that does not apply, solve.sh
            # exiting non-zero) solved nothing: grading the untouched tree would give the
            # task the score of doing nothing, which can look almost right (0.8 of the tests
            # already pass). The verifier's view stays in the trace.
            score = 0.0
        trace = {"trajectory": traj, "ctrf": verdict.ctrf,
                 "verifier": {"score": verdict.score, "reward": verdict.reward, "error": verdict.error,
                              "seconds": round(verdict.seconds, 3), "output": verdict.output,
                              "details": verdict.details}}
        if grader is not None:  # the grader role's calls: recorded as role grader, not the solver's
            trace["grader"] = grader
        # An oracle run has no model, so no tool call of one to count.
        invalid = None if self.status == "oracle" else traj["final"]["invalid_tool_calls"]
        return RolloutResult(harness_id, task.task_id, rollout_idx, score=score,
                             input_tokens=traj["final"]["input_tokens"], output_tokens=traj["final"]["output_tokens"],
                             cost_usd=cost, latency_s=float(self.seconds), timed_out=self.status == "timeout",
                             error_kind=error_kind, error=error, invalid_tool_calls=invalid, trace=trace)


def _void_if_screened(fmt: Any, task: Task, run: _AgentRun, verdict: Any) -> None:
    """A format that screens the agent's trajectory (``screen``, e.g. PaperBench's
    blacklist) voids the attempt it objects to: score 0, its reason the rollout's error
    (the harness's: what its agent did), the verifier's own view kept in the details."""
    screen = getattr(fmt, "screen", None)
    if screen is None or run.status == "oracle":
        return
    reason = screen(task, run.steps)
    if not reason:
        return
    verdict.details = {**(verdict.details or {}), "voided": reason, "score_before_voiding": verdict.score}
    verdict.score = 0.0
    run.error_kind = "harness"
    run.error = f"{run.error}; void: {reason}" if run.error else f"void: {reason}"


def _carry(fmt: Any, sandbox: Any, scratch: Path) -> CarriedDirs | None:
    """The host's copies of the directories ``fmt`` carries from the agent's sandbox (its
    processes dead) to the grading one, in the rollout's scratch root: outside every tree
    a sandbox writes. None when the format carries nothing."""
    dirs = tuple(getattr(fmt, "carried_dirs", ()))
    return carry_dirs(sandbox, dirs, scratch / "carried") if dirs else None


def _make_carried_dirs(fmt: Any, sandbox: Any) -> None:
    """Make the directories ``fmt`` carries to the verifier inside the agent's sandbox, by
    the sandbox's own user, so the agent finds them as in the task's environment. Only in
    a sandbox with its own view of the task's paths (bwrap, Docker): the local sandbox's
    commands would make them on the host."""
    dirs = tuple(getattr(fmt, "carried_dirs", ()))
    if dirs and (hasattr(sandbox, "fresh_for_grading") or hasattr(sandbox, "workspace_dir")):
        sandbox.execute("mkdir -p " + " ".join(map(shlex.quote, dirs)))


def _binds_of(carried: CarriedDirs | None) -> dict[str, Any]:
    return {"readonly_binds": carried.binds} if carried is not None else {}


def _noting(verdict: Any, carried: CarriedDirs | None) -> Any:
    if carried is not None:
        verdict.details = {**(verdict.details or {}), "carried": carried.record()}
    return verdict


def _solve(task: Task, sandbox: Any) -> str | None:
    return format_of(task).solve(task, sandbox)


def build_factory(sandbox: Any) -> Any:
    if sandbox is None:
        raise ValueError("executor.sandbox: missing; choose a sandbox (sandbox=bwrap, sandbox=docker or sandbox=local)")
    if isinstance(sandbox, Mapping) or type(sandbox).__name__ == "DictConfig":
        from hydra.utils import instantiate

        sandbox = instantiate(sandbox)
    for name in ("open", "unsupported"):
        if not callable(getattr(sandbox, name, None)):
            raise TypeError(f"executor.sandbox built {type(sandbox).__name__}, which has no {name}(); point "
                            "_target_ at a SandboxFactory (milo_ray.boundary.sandbox.base)")
    return sandbox
