"""OptimizerExecutor (``executor=optimizer``): one run of an optimizer program on one
EinsteinArena task (the instance-level track, DESIGN §4.5).

For one (program, task, rollout) it rebuilds the task's start
(:func:`~milo_ray.benchmarks.einstein.start_values`), scores it, opens a sandbox (the
run's ``sandbox`` factory; bwrap: no network, ``memory_mb``, the interpreter visible
read-only) and runs the program there with
:func:`~milo_ray.benchmarks.einstein.programs.run_program`: the program's files,
``start.npy``, the runner (:mod:`milo_ray.boundary.inside.optimizer_runner`) and the formulas it
gives the program (:mod:`milo_ray.kernels.autocorr_kit`; the building blocks,
:mod:`milo_ray.boundary.inside.optimizer_blocks`) go into the workspace, and the
runner calls ``optimize(start, seed=, deadline=)`` with ``deadline`` = its own start +
``budget_s`` and records every point the program publishes.

Stopping a program: the runner's watchdog saves the newest published point and exits at
``deadline + grace_s``; the sandbox's command is killed ``programs.KILL_MARGIN_S`` later
whatever happens (a program that never yields the interpreter), and then the point the
runner saved last (at most ``optimizer_runner.FLUSH_S`` old) counts. Either way
``timed_out=True``.

Grading (:func:`~milo_ray.benchmarks.einstein.programs.grade_program`): the final point (the returned one, else the last published one) must pass
:func:`~milo_ray.benchmarks.einstein.check`; its FFT score (the project's kernels, not the
runner's copy of the formulas) gives the reward :func:`~milo_ray.benchmarks.einstein.reward`
over the start's score. A program that fails to import, raises, returns something that is
not a vector, publishes nothing, dies (e.g. out of memory) or ends on an infeasible point
scores 0 with ``error_kind="harness"`` and the reason; a task whose metadata is unusable
scores 0 with ``error_kind="task"``. Only the sandbox itself failing raises (an
infrastructure failure, which the scheduler retries).

Warm spares (``warm_processes``): the rollout worker calls :meth:`OptimizerExecutor.aexecute`,
which takes a spare from a :class:`~milo_ray.boundary.harness_process.pool.WarmPool` -- a
sandbox opened and the runner started in it with numpy imported before the candidate is
known (:mod:`milo_ray.boundary.optimizer_process`) -- so a candidate pays for its
program and its upload, not for an interpreter starting. Each spare runs one candidate
and is closed with its sandbox; its replacement starts in the background. Without a
spare (warming off, a sandbox that cannot host a process, one that died before its job)
the rollout opens its own sandbox as :meth:`OptimizerExecutor.execute` does, which
always runs cold.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import time
from pathlib import Path
from typing import Any

from milo_ray.benchmarks.einstein.problems import PROBLEMS, score
from milo_ray.benchmarks.einstein.programs import (
    EXIT_FILE,
    grade_program,
    kill_after,
    read_run,
    run_program,
    runner_args,
    upload_program,
)
from milo_ray.benchmarks.einstein.starts import start_values
from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.execution.agent_executor import build_factory
from milo_ray.boundary.harness_process.pool import WarmPool, close_sandbox, parse_size
from milo_ray.boundary.optimizer_process import OptimizerProcess
from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.hostdirs import SANDBOX_HOME
from milo_ray.boundary.sandbox.interpreter import with_interpreter
from milo_ray.boundary.sandbox.leftovers import make_scratch
from milo_ray.harness.model import ENTRY_FILE

# The cache identity of this executor's rollouts: no model is involved (as the agent
# executor's oracle), so a run's results do not depend on the model group.
OPTIMIZER_MODEL_ID = "optimizer"
# Under the sandbox's HOME (/root), so HOME is the workdir itself and no writable home is
# mounted over /root: an interpreter installed under /root (pyenv, a user venv) stays visible.
WORKDIR = f"{SANDBOX_HOME}/optimizer"
# RLIMIT_FSIZE per file (storage_mb): bounds what a program printing without end writes.
_FILE_MB = 256
# One rollout is one sandbox slot, i.e. one core: BLAS/OpenMP pools stay single-threaded
# (they would also reserve address space per thread under an RLIMIT_AS memory limit).
_THREAD_ENV = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


class OptimizerExecutor:
    """Executor protocol implementation for optimizer programs.

    sandbox: the ``sandbox`` config (a ``_target_`` mapping or a built factory); the
        interpreter's prefixes and site-packages are added to its read-only host paths.
    memory_mb: the sandbox's memory limit (MB). grace_s: how long past its deadline a
        program may run before the runner stops it and keeps its last published point.
    scratch_dir: where per-rollout scratch directories go (None: the system temp dir);
        keep_scratch: keep them after the rollout (debugging a program).
    warm_processes: spares (sandboxed runners with numpy imported, each used for one
        candidate) kept ahead of need for :meth:`aexecute`: ``"auto"`` (as many as
        rollouts have been in flight at once), a number, or 0 (off). Only sandboxes that
        host a process and take its options when it starts (bwrap) have spares; under any
        other ``"auto"`` means 0.
    """

    model_id = OPTIMIZER_MODEL_ID

    def __init__(self, sandbox: Any = None, memory_mb: int = 2048, grace_s: float = 2.0,
                 scratch_dir: str | None = None, keep_scratch: bool = False,
                 warm_processes: int | str = "auto") -> None:
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 256:
            raise ValueError(f"executor.memory_mb={memory_mb!r}: give an integer >= 256 (numpy and scipy need ~200 MB)")
        if not isinstance(grace_s, (int, float)) or isinstance(grace_s, bool) or not 0 < grace_s < math.inf:
            raise ValueError(f"executor.grace_s={grace_s!r}: give a positive number of seconds")
        self.sandbox = with_interpreter(build_factory(sandbox))
        self.memory_mb = int(memory_mb)
        self.grace_s = float(grace_s)
        self.scratch_dir = scratch_dir
        self.keep_scratch = bool(keep_scratch)
        warm = parse_size(warm_processes)
        hosts = getattr(self.sandbox, "hosts_harness", False) and not getattr(self.sandbox, "binds_at_open", False)
        if warm and warm != "auto" and not hosts:
            raise ValueError(f"executor.warm_processes={warm_processes!r}: sandbox={self.sandbox.name} cannot hold a "
                             "warm runner (only bwrap can); set executor.warm_processes=0")
        self.pool = WarmPool(self.sandbox, warm if hosts else 0, scratch_dir,
                             process_factory=lambda sandbox, scratch: OptimizerProcess(sandbox, scratch, WORKDIR))

    # --- checks before a run starts -------------------------------------------------------
    def unsupported_tasks(self, tasks: list[Task]) -> list[str]:
        """One line per task this executor cannot run: not an einstein task, unusable
        metadata, or a sandbox that cannot open here."""
        problems = []
        for task in tasks:
            why = _task_problem(task) or self.sandbox.unsupported(self._spec(task))
            if why:
                problems.append(why if why.startswith("task ") else f"task {task.task_id}: {why}")
        return problems

    def _spec(self, task: Task) -> Any:
        return SandboxSpec(task_id=task.task_id, workdir=WORKDIR, allow_internet=False, memory_mb=self.memory_mb,
                           storage_mb=_FILE_MB, env=dict(_THREAD_ENV))

    # --- one rollout ----------------------------------------------------------------------
    def execute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        """One rollout in a sandbox of its own, opened now (cold: no spare)."""
        began = time.monotonic()
        why = _task_problem(task)
        if why:
            return _task_failure(harness, task, rollout_idx, why, began)
        problem, budget_s = task.metadata["problem"], float(task.metadata["budget_s"])
        start = start_values(task.metadata)
        start_score = score(problem, start)
        run = self._run_cold(harness, task, start, problem, seed, budget_s)
        return self._result(harness, task, rollout_idx, problem, start, start_score, run, began)

    async def aexecute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        """One rollout on a warm spare when there is one (see the module docstring)."""
        began = time.monotonic()
        why = _task_problem(task)
        if why:
            return _task_failure(harness, task, rollout_idx, why, began)
        problem, budget_s = task.metadata["problem"], float(task.metadata["budget_s"])
        # Off the event loop: a large start (a file, a refined construction) takes a while.
        start = await asyncio.to_thread(start_values, task.metadata)
        start_score = await asyncio.to_thread(score, problem, start)
        spec = self._spec(task)
        spare = None
        try:
            if self.pool.size:
                spare = await self.pool.take(spec)
            run = None
            if spare is not None:
                run = await self._run_warm(spare, harness, start, problem, seed, budget_s)
            if run is None:
                run = await asyncio.to_thread(self._run_cold, harness, task, start, problem, seed, budget_s)
        finally:
            if self.pool.size:
                self.pool.release(spec)
        return await asyncio.to_thread(self._result, harness, task, rollout_idx, problem, start, start_score, run,
                                       began)

    async def _run_warm(self, spare: Any, harness: Any, start: Any, problem: str, seed: int,
                        budget_s: float) -> Any:
        """Run the program on ``spare`` and close it; None when the spare died before it
        read its job (the rollout then runs cold: a spare's failure is not the program's)."""
        process = spare.process
        try:
            if not process.alive():
                return None
            await asyncio.to_thread(upload_program, spare.sandbox, WORKDIR, harness.files, start, with_runner=False)
            if not process.alive():
                return None
            argv = runner_args(ENTRY_FILE, problem, seed, budget_s, self.grace_s)
            oom_kills = getattr(spare.sandbox, "oom_kills", lambda: None)
            oom_before = oom_kills()
            code, killed = await process.run(argv, kill_after(budget_s, self.grace_s), EXIT_FILE)
            if not process.ready.is_set():
                return None  # it died importing, before it read the job: the program never ran
            oom_after = oom_kills()
            oom = None if oom_before is None or oom_after is None else max(0, oom_after - oom_before)
            return await asyncio.to_thread(read_run, spare.sandbox, WORKDIR, code, killed, process.tail("stdout"),
                                           process.tail("stderr"), oom_kills=oom)
        finally:
            await process.finish()
            await asyncio.to_thread(close_sandbox, spare.sandbox, None if self.keep_scratch else spare.scratch)

    def _run_cold(self, harness: Any, task: Task, start: Any, problem: str, seed: int, budget_s: float) -> Any:
        scratch = make_scratch(f"opt-{task.task_id}", self.scratch_dir)
        try:
            sandbox = self.sandbox.open(self._spec(task), scratch / "sandbox")
            try:
                run = run_program(sandbox, WORKDIR, harness.files, start, problem, seed, budget_s, self.grace_s)
            finally:
                sandbox.close()
        finally:
            if not self.keep_scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        return run

    def _result(self, harness: Any, task: Task, rollout_idx: int, problem: str, start: Any, start_score: float,
                run: Any, began: float) -> RolloutResult:
        graded = grade_program(problem, start, start_score, run, self.grace_s)
        return RolloutResult(harness.harness_id, task.task_id, rollout_idx, score=graded.reward,
                             latency_s=time.monotonic() - began, timed_out=graded.timed_out,
                             error_kind="harness" if graded.reason else None, error=graded.reason,
                             trace=graded.trace)


    def close(self) -> None:
        """Kill the spares not handed out and remove their sandboxes."""
        self.pool.close()


def _task_failure(harness: Any, task: Task, rollout_idx: int, why: str, began: float) -> RolloutResult:
    return RolloutResult(harness.harness_id, task.task_id, rollout_idx, score=0.0, error_kind="task", error=why,
                         latency_s=time.monotonic() - began, trace={"problem": task.metadata.get("problem"),
                                                                    "reason": why})



def _task_problem(task: Task) -> str | None:
    """Why ``task`` is not a runnable einstein task (naming the metadata field), or None."""
    meta = task.metadata or {}
    if meta.get("format") != "einstein":
        return f"task {task.task_id}: metadata.format={meta.get('format')!r}, executor=optimizer runs einstein tasks"
    if meta.get("problem") not in PROBLEMS:
        return f"task {task.task_id}: metadata.problem={meta.get('problem')!r}, expected one of {PROBLEMS}"
    budget = meta.get("budget_s")
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not 0 < budget < math.inf:
        return f"task {task.task_id}: metadata.budget_s={budget!r}, expected a positive number of seconds"
    try:
        start_values(meta)
    except (ValueError, KeyError, TypeError) as exc:
        return f"task {task.task_id}: metadata.start: {exc}"
    return None
