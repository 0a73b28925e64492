"""executor=optimizer on warm spares: a candidate runs in a bwrap sandbox and an interpreter
started before it was known, each spare serves one candidate and is discarded, nothing of
one candidate reaches the next, the program's budget starts when its job does, and the
runner imports scipy only for a program that uses it (checked in the sandboxed process's
``sys.modules``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from milo_ray.boundary.optimizer_process import runner_files
from milo_ray.core.tasks import Task
from milo_ray.boundary.inside import optimizer_runner
from milo_ray.execution.optimizer_executor import OptimizerExecutor
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.harness.model import Harness

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")

BUDGET_S = 1.0
GRACE_S = 0.5
# Guards against a hang, not a performance bound.
GIVE_UP_S = 60


def task(problem: str = "first_autocorrelation", budget_s: float = BUDGET_S) -> Task:
    metadata = {"format": "einstein", "problem": problem, "start": {"base": "random", "n": 64, "seed": 0},
                "budget_s": budget_s}
    return Task(f"{problem}-t", "train", "", time_cap_s=budget_s + GRACE_S, token_cap=0, metadata=metadata)


def program(body: str) -> Harness:
    return Harness.from_source("import os, sys, time\nimport numpy as np\n" + textwrap.dedent(body))


def executor(**kw) -> OptimizerExecutor:
    return OptimizerExecutor(sandbox=BwrapSandboxFactory(command_timeout_s=60), grace_s=GRACE_S, **kw)


def run_warm(harnesses: list[Harness], warm: int | str = 1, before=None,
             t: Task | None = None) -> tuple[list, list, OptimizerExecutor]:
    """Run ``harnesses`` one after the other through ``aexecute`` on one event loop (as a
    rollout worker does); returns the results, the spares handed out, the executor.
    ``before(ex)``: awaited first (e.g. to prepare a spare)."""
    ex = executor(warm_processes=warm)
    t = t or task()
    taken = []
    take = ex.pool.take

    async def recording_take(spec):
        spare = await take(spec)
        if spare is not None:
            taken.append(spare)
        return spare

    ex.pool.take = recording_take

    async def go():
        try:
            # Spares start ahead of the first candidate (as a worker's first rollouts start them).
            ex.pool.refill(ex._spec(t))
            if before is not None:
                await before(ex)
            return [await asyncio.wait_for(ex.aexecute(h, t, 0, i), GIVE_UP_S) for i, h in enumerate(harnesses)]
        finally:
            await ex.pool.aclose()

    return asyncio.run(go()), taken, ex


async def ready_spare(ex: OptimizerExecutor):
    """Start one spare for the test task's shape and wait until its imports are done."""
    ex.pool.refill(ex._spec(task()))
    for _ in range(GIVE_UP_S * 20):
        spares = [s for v in ex.pool._spares.values() for s in v]
        if spares and spares[0].process.ready.is_set():
            return spares[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no spare became ready")


# The runner's writer saves a published point (scoring it: the trajectory) within
# FLUSH_S; the program waits for that save, so the scoring has run when it looks.
NO_SCIPY = '''
def optimize(values, *, seed, deadline):
    publish(values)
    while not os.path.exists("trajectory.jsonl") and time.monotonic() < deadline + 5:
        time.sleep(0.01)
    print("SCORED", os.path.exists("trajectory.jsonl"))
    print("SCIPY", sorted(m for m in sys.modules if m == "scipy" or m.startswith("scipy.")))
    return values
'''


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_program_that_does_not_use_scipy_never_imports_it(warm):
    if warm:
        (r,), taken, _ = run_warm([program(NO_SCIPY)])
        assert len(taken) == 1
    else:
        r = executor(warm_processes=0).execute(program(NO_SCIPY), task(), 0, 0)
    assert r.error is None, r.trace.get("stderr_tail")
    out = r.trace["stdout_tail"]
    assert "SCORED True" in out and "SCIPY []" in out, out


USES_SCIPY = '''
from scipy.optimize import minimize

def optimize(values, *, seed, deadline):
    h = lbfgs_smooth(values, 0.01, PROBLEM, deadline, maxiter=50, memory=10, erdos_sum_weight=1.0)
    # and scipy called by the program itself
    assert minimize(lambda x: float((x ** 2).sum()), np.ones(3), method="L-BFGS-B").fun < 1e-6
    print("SCIPY LOADED", "scipy.optimize" in sys.modules, "scipy.fft" in sys.modules)
    return project(h, PROBLEM)
'''


def test_a_program_that_uses_scipy_still_runs_on_a_spare():
    # A budget that covers importing scipy on a loaded machine (the program returns early).
    (r,), taken, _ = run_warm([program(USES_SCIPY)], t=task(budget_s=20.0))
    assert len(taken) == 1
    assert r.error is None, r.trace.get("stderr_tail")
    assert r.score > 0 and r.trace["score"] < r.trace["start_score"]
    assert "SCIPY LOADED True True" in r.trace["stdout_tail"]


# Leaves a mark everywhere a program can write or hold state, and reports the marks it
# finds (none, in a fresh sandbox and interpreter).
MARKS = '''
import tempfile

def optimize(values, *, seed, deadline):
    places = {"workdir": "mark.txt", "tmp": os.path.join(tempfile.gettempdir(), "mark.txt"),
              "home": os.path.expanduser("~/.mark")}
    seen = [name for name, path in places.items() if os.path.exists(path)]
    seen += ["numpy"] if hasattr(np, "_candidate_mark") else []
    seen += ["environ"] if "CANDIDATE_MARK" in os.environ else []
    seen += ["modules"] if "candidate_mark" in sys.modules else []
    for path in places.values():
        with open(path, "w") as fh:
            fh.write("x")
    np._candidate_mark = True
    os.environ["CANDIDATE_MARK"] = "1"
    sys.modules["candidate_mark"] = sys
    print("SEEN", seen)
    return values
'''


def test_a_candidate_sees_nothing_of_the_candidates_before_it():
    results, taken, _ = run_warm([program(MARKS)] * 3)
    assert len(taken) == 3
    for r in results:
        assert r.error is None, r.trace.get("stderr_tail")
        assert "SEEN []" in r.trace["stdout_tail"], r.trace["stdout_tail"]


def test_a_spare_runs_one_candidate_and_is_discarded_with_its_sandbox():
    results, taken, ex = run_warm([program(MARKS)] * 3, warm=2)
    assert ex.pool.handed_out == 3 and len({id(s) for s in taken}) == 3
    assert len({s.sandbox.id for s in taken}) == 3
    for spare in taken:
        assert spare.process.job_sent and spare.process.proc.returncode is not None
        assert not spare.process.alive()
        assert not spare.scratch.exists()
        with pytest.raises(RuntimeError, match="closed"):
            spare.sandbox.execute("true")


def test_a_spares_idle_time_does_not_count_against_the_programs_budget():
    """The spare waits longer than the budget before its job: the program still gets its
    whole budget (the runner's clock starts with the job, not with its imports)."""
    body = '''
    def optimize(values, *, seed, deadline):
        print("LEFT", deadline - time.monotonic() > 0.5 * %r)
        return values
    ''' % BUDGET_S

    async def idle(ex):
        await ready_spare(ex)
        await asyncio.sleep(BUDGET_S + GRACE_S)

    (r,), taken, _ = run_warm([program(body)], before=idle)
    assert len(taken) == 1 and r.error is None
    assert "LEFT True" in r.trace["stdout_tail"]


def test_a_spare_that_died_before_its_job_costs_the_candidate_nothing():
    async def kill_it(ex):
        spare = await ready_spare(ex)
        spare.process.kill()
        await spare.process.proc.wait()

    (r,), taken, ex = run_warm([program(NO_SCIPY)], before=kill_it)
    assert taken == [] and ex.pool.handed_out == 0  # the dead one was discarded: the rollout ran cold
    assert r.error is None and "SCORED True" in r.trace["stdout_tail"]


def test_a_spare_that_dies_importing_after_it_was_taken_costs_the_candidate_nothing(monkeypatch):
    """A spare taken while still importing that dies before it reads its job: the program
    never ran there, so the rollout runs cold instead of scoring the spare's failure."""
    from milo_ray.boundary import optimizer_process

    monkeypatch.setattr(optimizer_process, "_BOOT", "import sys, time; time.sleep(1); sys.exit(3)")
    (r,), taken, _ = run_warm([program(NO_SCIPY)])
    assert len(taken) == 1 and taken[0].process.job_sent
    assert r.error is None and "SCORED True" in r.trace["stdout_tail"]


def test_a_crash_on_a_spare_scores_zero_with_its_traceback_and_output():
    body = '''
    def optimize(values, *, seed, deadline):
        print("some output")
        raise ValueError("deep inside")
    '''
    (r,), taken, _ = run_warm([program(body)])
    assert len(taken) == 1
    assert r.score == 0.0 and r.error_kind == "harness" and "ValueError: deep inside" in r.error
    assert "some output" in r.trace["stdout_tail"]
    assert "Traceback" in r.trace["stderr_tail"] and optimizer_runner.READY not in r.trace["stdout_tail"]


def test_a_program_ignoring_its_deadline_on_a_spare_is_stopped_and_graded_on_its_last_point():
    body = '''
    def optimize(values, *, seed, deadline):
        h = values.copy()
        h[0] *= 0.5
        publish(h)
        while True:
            time.sleep(0.01)
    '''
    (r,), taken, _ = run_warm([program(body)])
    assert len(taken) == 1
    assert r.timed_out and r.error is None and r.trace["status"] == "timeout"
    assert r.trace["values"] is not None


@pytest.mark.slow  # waits out the budget, the grace and the kill margin
def test_a_program_holding_the_interpreter_on_a_spare_is_killed_and_its_saved_point_counts():
    # A catastrophic regex never releases the GIL: only the host's kill of the spare ends it.
    body = '''
    import re
    def optimize(values, *, seed, deadline):
        publish(np.maximum(values, values.mean()))   # better than the start
        time.sleep(0.6)   # the writer saves it meanwhile
        re.match(r"(a+)+$", "a" * 64 + "b")
        return values
    '''
    (r,), taken, _ = run_warm([program(body)])
    assert len(taken) == 1
    assert r.timed_out and r.error is None and r.trace["status"] == "killed"
    assert r.trace["values"] is not None and r.score > 0


def test_a_warm_runner_runs_one_job_then_exits(tmp_path):
    """The runner's serve() reads one job: a second line on its stdin is never run."""
    for name, content in runner_files().items():
        (tmp_path / name).write_bytes(content)
    for i in (1, 2):
        (tmp_path / f"p{i}.py").write_text(f"def optimize(values, *, seed, deadline):\n"
                                           f"    open('ran{i}', 'w').close()\n    return values\n")
    import numpy as np

    np.save(tmp_path / "start.npy", np.ones(8))
    jobs = "".join(json.dumps({"argv": [f"p{i}.py", "start.npy", "first_autocorrelation", "0", "1.0", "0.5"],
                               "exit_file": "exit.json"}) + "\n" for i in (1, 2))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, '.'); "
                          "import optimizer_runner as r; sys.exit(r.serve())"], input=jobs, cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=GIVE_UP_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == optimizer_runner.READY
    assert (tmp_path / "ran1").exists() and not (tmp_path / "ran2").exists()
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "returned"
    assert json.loads((tmp_path / "exit.json").read_text()) == {"exit_code": 0}


@pytest.mark.parametrize("end,described", [("os._exit(9)", "exited with code 9"),
                                           ("os.kill(os.getpid(), 9)", "killed by signal 9")])
def test_a_runner_dying_on_a_spare_is_described_by_what_its_waiter_saw(end, described):
    body = f'''
    def optimize(values, *, seed, deadline):
        {end}
    '''
    (r,), taken, _ = run_warm([program(body)])
    assert len(taken) == 1
    assert r.score == 0.0 and r.error_kind == "harness" and not r.timed_out
    assert r.error.startswith("the runner died before saving a result: ") and described in r.error, r.error
