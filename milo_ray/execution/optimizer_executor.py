"""OptimizerExecutor (``executor=optimizer``): one run of an optimizer program on one
EinsteinArena task (the instance-level track, DESIGN §4.5).

For one (program, task, rollout) it rebuilds the task's start
(:func:`~milo_ray.benchmarks.einstein.start_values`), scores it, opens a sandbox (the
run's ``sandbox`` factory; bwrap: no network, ``memory_mb``, the interpreter visible
read-only), writes the program's files, ``start.npy``, the runner
(:mod:`milo_ray.execution.optimizer_runner`) and what it gives the program (the formulas,
:mod:`milo_ray.kernels.autocorr_kit`; the building blocks,
:mod:`milo_ray.execution.optimizer_blocks`) into the workspace and runs the runner,
which calls ``optimize(start, seed=, deadline=)`` with ``deadline`` = its own start +
``budget_s`` and records every point the program publishes.

Stopping a program: the runner's watchdog saves the newest published point and exits at
``deadline + grace_s``; the executor kills the sandbox's command ``_KILL_MARGIN_S`` later
whatever happens (a program that never yields the interpreter), and then the point the
runner saved last (at most ``optimizer_runner.FLUSH_S`` old) counts. Either way
``timed_out=True``.

Grading: the final point (the returned one, else the last published one) must pass
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

import io
import json
import math
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from milo_ray.execution import optimizer_runner as runner
from milo_ray.execution.sandbox.hostdirs import SANDBOX_HOME
from milo_ray.execution.sandbox.interpreter import with_interpreter
from milo_ray.execution.types import RolloutResult, Task
from milo_ray.harness.model import ENTRY_FILE

# The cache identity of this executor's rollouts: no model is involved (as the agent
# executor's oracle), so a run's results do not depend on the model group.
OPTIMIZER_MODEL_ID = "optimizer"
# Under the sandbox's HOME (/root), so HOME is the workdir itself and no writable home is
# mounted over /root: an interpreter installed under /root (pyenv, a user venv) stays visible.
WORKDIR = f"{SANDBOX_HOME}/optimizer"
RUNNER_FILE = "optimizer_runner.py"
START_FILE = "start.npy"
# After the runner's own deadline + grace: time for its startup (interpreter and numpy
# import before its clock starts) and its last save, before the hard kill.
_KILL_MARGIN_S = 3.0
# Bytes of the program's stdout and stderr kept in the trace.
_TAIL_BYTES = 4000
# RLIMIT_FSIZE per file (storage_mb): bounds what a program printing without end writes.
_FILE_MB = 256
# One rollout is one sandbox slot, i.e. one core: BLAS/OpenMP pools stay single-threaded
# (they would also reserve address space per thread under an RLIMIT_AS memory limit).
_THREAD_ENV = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
_TAIL_MARK = "=====milo-optimizer-stderr====="


@dataclass
class ProgramRun:
    """What one sandboxed run of an optimizer program left behind (see :func:`run_program`)."""

    status: str  # returned | timeout | crashed | killed (no status.json: ended from outside)
    error: str | None
    exit_code: int | None
    hard_killed: bool
    values: np.ndarray | None = None
    values_error: str | None = None
    trajectory: list[list[float | None]] = field(default_factory=list)
    publishes: int = 0
    stdout_tail: str = ""
    stderr_tail: str = ""


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
        from milo_ray.execution.agent_executor import build_factory

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
        from milo_ray.execution.sandbox.base import SandboxSpec

        return SandboxSpec(task_id=task.task_id, workdir=WORKDIR, allow_internet=False, memory_mb=self.memory_mb,
                           storage_mb=_FILE_MB, env=dict(_THREAD_ENV))

    # --- one rollout ----------------------------------------------------------------------
    def execute(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        from milo_ray.benchmarks.einstein import score, start_values

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
        scratch = Path(tempfile.mkdtemp(prefix=f"milo-opt-{task.task_id[:40]}-", dir=self.scratch_dir))
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


def runner_files(runner_name: str = RUNNER_FILE) -> dict[str, bytes]:
    """The files a program runs with, uploaded beside it (file name -> content): the
    runner as ``runner_name``, and the formulas and the building blocks it gives the
    program under the names it imports them by."""
    return {runner_name: Path(runner.__file__).read_bytes(), runner.KIT_FILE: Path(runner.kit.__file__).read_bytes(),
            runner.BLOCKS_FILE: Path(runner.blocks.__file__).read_bytes()}


def run_program(sandbox: Any, workdir: str, files: Mapping[str, str | bytes], start: np.ndarray, problem: str,
                seed: int, budget_s: float, grace_s: float, *, entry: str = ENTRY_FILE,
                python: str = sys.executable) -> ProgramRun:
    """Run the optimizer program ``files`` (relative path -> text or bytes; ``entry`` defines
    ``optimize``) on ``start`` in ``workdir`` of an open ``sandbox``, through the runner,
    with ``python`` as the interpreter; read back how it ended, its last saved point and
    its score trajectory. Only the sandbox failing raises."""
    buf = io.BytesIO()
    np.save(buf, start, allow_pickle=False)
    uploads = [(f"{workdir}/{rel}", text.encode() if isinstance(text, str) else text) for rel, text in files.items()]
    uploads += [(f"{workdir}/{START_FILE}", buf.getvalue())]
    uploads += [(f"{workdir}/{name}", content) for name, content in runner_files().items()]
    _check_transfers("upload", sandbox.upload_files(uploads))
    argv = [python, RUNNER_FILE, entry, START_FILE, problem, str(int(seed)), repr(float(budget_s)), repr(grace_s)]
    here = f"cd {shlex.quote(workdir)} && "
    command = here + " ".join(shlex.quote(a) for a in argv) + " >stdout.log 2>stderr.log"
    timeout = budget_s + grace_s + _KILL_MARGIN_S
    ran = time.monotonic()
    response = sandbox.execute(command, timeout=timeout)
    # 124 is also what a program's own os._exit(124) reads: only past the timeout is it the kill.
    hard_killed = response.exit_code == 124 and time.monotonic() - ran >= timeout - 0.5
    tails = sandbox.execute(here + f"tail -c {_TAIL_BYTES} stdout.log; printf '\\n%s\\n' {_TAIL_MARK}; "
                            f"tail -c {_TAIL_BYTES} stderr.log", timeout=30)
    stdout_tail, _, stderr_tail = tails.output.partition(f"\n{_TAIL_MARK}\n")
    names = (runner.STATUS_FILE, runner.BEST_FILE, runner.TRAJECTORY_FILE)
    got = {Path(r.path).name: r for r in sandbox.download_files([f"{workdir}/{n}" for n in names])}
    status = _json_file(got[runner.STATUS_FILE])
    run = ProgramRun(status=str(status.get("status", "killed")) if isinstance(status, dict) else "killed",
                     error=status.get("error") if isinstance(status, dict) else None,
                     exit_code=response.exit_code, hard_killed=hard_killed,
                     stdout_tail=stdout_tail, stderr_tail=stderr_tail)
    best = got[runner.BEST_FILE]
    if best.content is not None:
        try:
            run.values = np.load(io.BytesIO(best.content), allow_pickle=False)
        except Exception as exc:
            run.values_error = f"the saved point is unreadable: {type(exc).__name__}: {exc}"[:300]
    traj = got[runner.TRAJECTORY_FILE]
    if traj.content is not None:
        for line in traj.content.decode("utf-8", "replace").splitlines():
            try:
                t, s, count = json.loads(line)
            except (ValueError, TypeError):
                continue  # a line cut by the kill
            run.trajectory.append([float(t), float(s) if math.isfinite(s) else None])
            run.publishes = int(count)
    return run


@dataclass
class ProgramGrade:
    """A program run graded: ``reward`` (0 when ``reason`` says why it earns nothing),
    whether it was stopped past its deadline, and the trace (problem, start and final
    scores, trajectory, the final point)."""

    reward: float
    reason: str | None
    timed_out: bool
    trace: dict[str, Any]


def grade_program(problem: str, start: np.ndarray, start_score: float, run: ProgramRun,
                  grace_s: float) -> ProgramGrade:
    """Check and score the final point of ``run`` with the project's kernels."""
    from milo_ray.benchmarks.einstein import check, reward, score

    timed_out = run.status == "timeout" or (run.status == "killed" and run.hard_killed)
    reason = None
    if run.status == "crashed":
        reason = f"the program failed: {run.error}"
    elif run.status == "killed" and not run.hard_killed:
        reason = (f"the runner died (exit code {run.exit_code}) before saving a result; out of memory "
                  f"(memory_mb) or killed by a signal")
    elif run.values_error:
        reason = run.values_error
    elif run.values is None:
        reason = "the program published no point and returned none"
    else:
        infeasible = check(problem, run.values)
        if infeasible:
            reason = f"infeasible point: {infeasible}"
    final = None if reason else score(problem, run.values)
    trace = {"problem": problem, "n": int(start.size), "start_score": start_score, "score": final,
             "reason": reason, "status": run.status, "trajectory": run.trajectory, "publishes": run.publishes,
             "values": None if reason else [float(x) for x in run.values],
             "stdout_tail": run.stdout_tail, "stderr_tail": run.stderr_tail}
    if timed_out:
        trace["stopped"] = (f"still running {grace_s:g} s past its deadline: stopped, its last published point "
                            "graded")
    return ProgramGrade(reward=0.0 if reason else reward(start_score, final), reason=reason, timed_out=timed_out,
                        trace=trace)


def _task_problem(task: Task) -> str | None:
    """Why ``task`` is not a runnable einstein task (naming the metadata field), or None."""
    from milo_ray.benchmarks.einstein import start_values
    from milo_ray.benchmarks.einstein.problems import PROBLEMS

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


def _check_transfers(what: str, responses: list[Any]) -> None:
    errors = [f"{r.path}: {r.error}" for r in responses if getattr(r, "error", None)]
    if errors:  # the sandbox cannot hold the workspace: infrastructure, retried
        raise RuntimeError(f"sandbox {what} failed: {'; '.join(errors[:3])}")


def _json_file(response: Any) -> Any:
    if response.content is None:
        return None
    try:
        return json.loads(response.content)
    except ValueError:
        return None
