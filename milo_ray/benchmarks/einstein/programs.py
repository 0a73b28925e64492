"""Running one optimizer program in an open sandbox and grading what it left behind.

Both ways the instance-level track runs a program use this: the optimizer executor
(``executor=optimizer``, a program that is the harness) and the einstein-agent format's
verifier (a program an agent wrote). :func:`run_program` uploads the program, its start,
the runner (:mod:`milo_ray.boundary.inside.optimizer_runner`) and the formulas the runner gives
the program (:mod:`milo_ray.kernels.autocorr_kit`), runs the runner and reads back how it
ended; :func:`grade_program` checks and scores the final point with the project's kernels
(not the runner's copy of the formulas).
"""

from __future__ import annotations

import io
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from milo_ray.benchmarks.einstein.problems import check, reward, score
from milo_ray.boundary.inside import optimizer_runner as runner
from milo_ray.boundary.optimizer_process import RUNNER_FILE, TAIL_BYTES, runner_files
from milo_ray.boundary.sandbox.process import ProcessEnd, waited
from milo_ray.core.executor import ENTRY_FILE

START_FILE = "start.npy"
# Where the runner's parent (process.EXIT_WAITER) records how the runner ended.
EXIT_FILE = "exit.json"
# After the runner's own deadline + grace: time for its startup (interpreter and numpy
# import before its clock starts) and its last save, before the hard kill.
KILL_MARGIN_S = 3.0
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
    end: ProcessEnd | None = None  # how the runner's process ended, as observed


def run_program(sandbox: Any, workdir: str, files: Mapping[str, str | bytes], start: np.ndarray, problem: str,
                seed: int, budget_s: float, grace_s: float, *, entry: str = ENTRY_FILE,
                python: str = sys.executable) -> ProgramRun:
    """Run the optimizer program ``files`` (relative path -> text or bytes; ``entry`` defines
    ``optimize``) on ``start`` in ``workdir`` of an open ``sandbox``, through the runner,
    with ``python`` as the interpreter; read back how it ended, its last saved point and
    its score trajectory. Only the sandbox failing raises."""
    upload_program(sandbox, workdir, files, start, with_runner=True)
    argv = waited(python, EXIT_FILE, [python, RUNNER_FILE, *runner_args(entry, problem, seed, budget_s, grace_s)])
    # The workdir as the command's shell sees it (the local sandbox has no view of its own).
    shell_path = getattr(sandbox, "shell_path", None)
    here = f"cd {shlex.quote(shell_path(workdir) if shell_path else workdir)} && "
    command = here + " ".join(shlex.quote(a) for a in argv) + " >stdout.log 2>stderr.log"
    timeout = kill_after(budget_s, grace_s)
    oom_kills = getattr(sandbox, "oom_kills", lambda: None)
    oom_before = oom_kills()
    ran = time.monotonic()
    response = sandbox.execute(command, timeout=timeout)
    oom_after = oom_kills()
    # 124 is also what a program's own os._exit(124) reads: only past the timeout is it the kill.
    hard_killed = response.exit_code == 124 and time.monotonic() - ran >= timeout - 0.5
    tails = sandbox.execute(here + f"tail -c {TAIL_BYTES} stdout.log; printf '\\n%s\\n' {_TAIL_MARK}; "
                            f"tail -c {TAIL_BYTES} stderr.log", timeout=30)
    stdout_tail, _, stderr_tail = tails.output.partition(f"\n{_TAIL_MARK}\n")
    oom = None if oom_before is None or oom_after is None else max(0, oom_after - oom_before)
    return read_run(sandbox, workdir, response.exit_code, hard_killed, stdout_tail, stderr_tail, oom_kills=oom)


def upload_program(sandbox: Any, workdir: str, files: Mapping[str, str | bytes], start: np.ndarray, *,
                   with_runner: bool) -> None:
    """Put the program ``files``, its start and (``with_runner``) the runner's files into
    ``workdir``; the runner's files go last, so a program file of the same name never
    replaces them. Only the sandbox failing raises."""
    buf = io.BytesIO()
    np.save(buf, start, allow_pickle=False)
    uploads = [(f"{workdir}/{rel}", text.encode() if isinstance(text, str) else text) for rel, text in files.items()]
    uploads += [(f"{workdir}/{START_FILE}", buf.getvalue())]
    if with_runner:
        uploads += [(f"{workdir}/{name}", content) for name, content in runner_files().items()]
    _check_transfers("upload", sandbox.upload_files(uploads))


def runner_args(entry: str, problem: str, seed: int, budget_s: float, grace_s: float) -> list[str]:
    """The runner's arguments after its own file name (see :mod:`optimizer_runner`)."""
    return [entry, START_FILE, problem, str(int(seed)), repr(float(budget_s)), repr(grace_s)]


def kill_after(budget_s: float, grace_s: float) -> float:
    """Seconds after the runner starts at which its process is killed whatever it does."""
    return budget_s + grace_s + KILL_MARGIN_S


def read_run(sandbox: Any, workdir: str, exit_code: int | None, hard_killed: bool, stdout_tail: str,
             stderr_tail: str, *, oom_kills: int | None = None) -> ProgramRun:
    """How a runner that has ended left ``workdir``: its status, last saved point and
    score trajectory, and how its process ended (``exit_code``: the sandbox command's;
    ``oom_kills``: the OOM kills the sandbox counted during it, None: no counter)."""
    names = (runner.STATUS_FILE, runner.BEST_FILE, runner.TRAJECTORY_FILE, EXIT_FILE)
    got = {Path(r.path).name: r for r in sandbox.download_files([f"{workdir}/{n}" for n in names])}
    status = _json_file(got[runner.STATUS_FILE])
    run = ProgramRun(status=str(status.get("status", "killed")) if isinstance(status, dict) else "killed",
                     error=status.get("error") if isinstance(status, dict) else None,
                     exit_code=exit_code, hard_killed=hard_killed,
                     stdout_tail=stdout_tail, stderr_tail=stderr_tail)
    run.end = _observed_end(_json_file(got[EXIT_FILE]), exit_code, oom_kills, stderr_tail)
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

    timed_out = run.status == "timeout" or (run.status == "killed" and run.hard_killed)
    reason = None
    if run.status == "crashed":
        reason = f"the program failed: {run.error}"
    elif run.status == "killed" and not run.hard_killed:
        end = run.end or ProcessEnd(exit_code=run.exit_code, stderr_tail=run.stderr_tail)
        reason = f"the runner died before saving a result: {end.describe()}"
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


def _check_transfers(what: str, responses: list[Any]) -> None:
    errors = [f"{r.path}: {r.error}" for r in responses if getattr(r, "error", None)]
    if errors:  # the sandbox cannot hold the workspace: infrastructure, retried
        raise RuntimeError(f"sandbox {what} failed: {'; '.join(errors[:3])}")


def _observed_end(recorded: Any, command_exit: int | None, oom_kills: int | None, stderr_tail: str) -> ProcessEnd:
    """How the runner ended: what its waiter recorded (its exit code, or the signal that
    killed it), else the sandbox command's exit code (a number a shell or bwrap may have
    made of a signal, so reported as a number, never as a signal)."""
    exit_code, sig = command_exit, None
    if isinstance(recorded, dict):
        code, got_sig = recorded.get("exit_code"), recorded.get("signal")
        if isinstance(got_sig, int) and not isinstance(got_sig, bool) and 0 < got_sig < 128:
            exit_code, sig = None, got_sig
        elif isinstance(code, int) and not isinstance(code, bool):
            exit_code = code
    return ProcessEnd(exit_code=exit_code, signal=sig, oom_kills=oom_kills, stderr_tail=stderr_tail)


def _json_file(response: Any) -> Any:
    if response.content is None:
        return None
    try:
        return json.loads(response.content)
    except ValueError:
        return None
