"""OptimizerExecutor (``executor=optimizer``): one run of an optimizer program on one
EinsteinArena task (the instance-level track, DESIGN §4.5).

For one (program, task, rollout) it rebuilds the task's start
(:func:`~milo_ray.benchmarks.einstein.start_values`), scores it, opens a sandbox (the
run's ``sandbox`` factory; bwrap: no network, ``memory_mb``, the interpreter visible
read-only) and runs the program there with
:func:`~milo_ray.benchmarks.einstein.programs.run_program`: the program's files,
``start.npy``, the runner (:mod:`milo_ray.execution.optimizer_runner`) and the formulas it
gives the program (:mod:`milo_ray.kernels.autocorr_kit`; the building blocks,
:mod:`milo_ray.execution.optimizer_blocks`) go into the workspace, and the
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

Only ``execute`` is provided: the rollout waits on one subprocess, and the worker runs a
blocking ``execute`` on its own thread pool sized to its slots.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

from milo_ray.benchmarks.einstein.problems import PROBLEMS, score
from milo_ray.benchmarks.einstein.programs import grade_program, run_program
from milo_ray.benchmarks.einstein.starts import start_values
from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.execution.agent_executor import build_factory
from milo_ray.execution.sandbox.base import SandboxSpec
from milo_ray.execution.sandbox.hostdirs import SANDBOX_HOME
from milo_ray.execution.sandbox.interpreter import with_interpreter
from milo_ray.execution.sandbox.leftovers import make_scratch

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
    """

    model_id = OPTIMIZER_MODEL_ID

    def __init__(self, sandbox: Any = None, memory_mb: int = 2048, grace_s: float = 2.0,
                 scratch_dir: str | None = None, keep_scratch: bool = False) -> None:
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 256:
            raise ValueError(f"executor.memory_mb={memory_mb!r}: give an integer >= 256 (numpy and scipy need ~200 MB)")
        if not isinstance(grace_s, (int, float)) or isinstance(grace_s, bool) or not 0 < grace_s < math.inf:
            raise ValueError(f"executor.grace_s={grace_s!r}: give a positive number of seconds")
        self.sandbox = with_interpreter(build_factory(sandbox))
        self.memory_mb = int(memory_mb)
        self.grace_s = float(grace_s)
        self.scratch_dir = scratch_dir
        self.keep_scratch = bool(keep_scratch)

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
        began = time.monotonic()
        why = _task_problem(task)
        if why:
            return RolloutResult(harness.harness_id, task.task_id, rollout_idx, score=0.0, error_kind="task",
                                 error=why, latency_s=time.monotonic() - began,
                                 trace={"problem": task.metadata.get("problem"), "reason": why})
        meta = task.metadata
        problem, budget_s = meta["problem"], float(meta["budget_s"])
        start = start_values(meta)
        start_score = score(problem, start)
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
        graded = grade_program(problem, start, start_score, run, self.grace_s)
        return RolloutResult(harness.harness_id, task.task_id, rollout_idx, score=graded.reward,
                             latency_s=time.monotonic() - began, timed_out=graded.timed_out,
                             error_kind="harness" if graded.reason else None, error=graded.reason,
                             trace=graded.trace)


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
