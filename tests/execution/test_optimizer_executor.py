"""executor=optimizer: an optimizer program runs in the bwrap sandbox on a tiny EinsteinArena
task; whatever the program does, the rollout is a score (never an exception), and a
program stopped past its deadline is graded on its last published point."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from milo_ray.benchmarks.einstein import reward, score, start_values
from milo_ray.core.tasks import Task
from milo_ray.boundary.inside import optimizer_runner
from milo_ray.execution.optimizer_executor import OptimizerExecutor
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.harness.model import Harness
from milo_ray.kernels import autocorr

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")

BUDGET_S = 1.0
GRACE_S = 0.5


def task(problem: str = "first_autocorrelation", budget_s: float = BUDGET_S, **meta) -> Task:
    metadata = {"format": "einstein", "problem": problem, "start": {"base": "random", "n": 64, "seed": 0},
                "budget_s": budget_s, **meta}
    return Task(f"{problem}-t", "train", "", time_cap_s=budget_s + GRACE_S, token_cap=0, metadata=metadata)


def program(body: str) -> Harness:
    head = textwrap.dedent('''
        import time
        import numpy as np

        def publish(values):
            """Replaced by the runner."""
    ''')
    return Harness.from_source(head + textwrap.dedent(body))


@pytest.fixture(scope="module")
def executor() -> OptimizerExecutor:
    return OptimizerExecutor(sandbox=BwrapSandboxFactory(command_timeout_s=60), grace_s=GRACE_S)


# A ratchet: random multiplicative perturbations of the start, kept (and published) when
# the FFT score improves, until the deadline -- and at least 300 tries whatever the clock
# says (a few milliseconds): on a loaded machine the runner's start-up, which counts
# against the budget, can use up most of a 1 s budget before optimize is called.
RATCHET = '''
def score(h):
    n = h.size
    c = np.convolve(h, h)
    return 2 * n * c.max() / h.sum() ** 2

def optimize(values, *, seed, deadline):
    rng = np.random.default_rng(seed)
    best, best_s = values.copy(), score(values)
    tries = 0
    while tries < 300 or time.monotonic() < deadline:
        tries += 1
        cand = np.maximum(best * (1 + 0.05 * rng.standard_normal(best.size)), 0.0)
        s = score(cand)
        if s < best_s:
            best, best_s = cand, s
            publish(best)
    print("iterations done", PROBLEM)
    return best
'''


def test_an_improving_program_earns_the_reward_of_its_verified_point(executor):
    # 3 s, not 1: on a loaded machine the runner's start-up (counted against the budget)
    # can take a second or two, and a trajectory needs the program to outlast one flush interval.
    budget_s = 3.0
    t = task(budget_s=budget_s)
    r = executor.execute(program(RATCHET), t, 0, 7)
    start = start_values(t.metadata)
    assert r.error is None and r.error_kind is None and not r.timed_out
    tr = r.trace
    values = np.asarray(tr["values"])
    assert values.shape == start.shape
    assert tr["score"] == pytest.approx(autocorr.first_autocorrelation(values), rel=1e-12)
    assert tr["score"] < tr["start_score"] == pytest.approx(score("first_autocorrelation", start))
    assert r.score == pytest.approx(reward(tr["start_score"], tr["score"])) and r.score > 0
    # The trajectory: timestamps within the budget, scores non-increasing, ending at the final point.
    traj = tr["trajectory"]
    assert len(traj) >= 2 and tr["publishes"] >= len(traj)
    assert all(0 <= t_ <= budget_s + 0.5 for t_, _ in traj)
    assert all(b[1] <= a[1] for a, b in zip(traj, traj[1:]))
    assert traj[-1][1] == pytest.approx(tr["score"], rel=1e-9)
    assert "iterations done first_autocorrelation" in tr["stdout_tail"]  # PROBLEM was set
    assert 0 < r.latency_s < 10


# The same search written with only what the runner gives: the formulas, the ratchet and
# the stage driver (a program that defines no helper of its own).
GIVEN_ONLY = '''
CONFIG = {"margin_s": 0.05, "margin_frac": 0.02}
STAGES = ["jitter"]

def stage_jitter(h, rng, deadline, problem):
    while time.monotonic() < deadline:
        offer(best() * (1 + 0.05 * rng.standard_normal(h.size)), problem)
    return best()

def optimize(values, *, seed, deadline):
    print("start score", score(values, PROBLEM))
    return run_stages(values, seed=seed, deadline=deadline, stages=STAGES, margin_s=CONFIG["margin_s"],
                      margin_frac=CONFIG["margin_frac"])
'''


@pytest.mark.parametrize("problem", ["first_autocorrelation", "erdos_minimum_overlap"])
def test_a_program_using_only_the_given_helpers_runs_in_the_sandbox(executor, problem):
    t = task(problem, budget_s=3.0)  # the runner's imports (numpy, scipy.fft) count against the budget
    r = executor.execute(program(GIVEN_ONLY), t, 0, 7)
    assert r.error is None and r.score > 0, r.trace.get("stderr_tail")
    values = np.asarray(r.trace["values"])
    assert r.trace["score"] == pytest.approx(score(problem, values), rel=1e-12)
    assert r.trace["score"] < r.trace["start_score"]
    assert r.trace["publishes"] >= 1
    assert f"start score {r.trace['start_score']!r}" in r.trace["stdout_tail"]


def test_a_program_ignoring_its_deadline_is_stopped_and_graded_on_its_last_published_point(executor):
    body = '''
    def optimize(values, *, seed, deadline):
        better = np.maximum(values, values.mean())
        publish(better)
        while True:   # never returns; the point it would return is the start
            sum(range(1000))
        return values
    '''
    t = task()
    r = executor.execute(program(body), t, 0, 0)
    start = start_values(t.metadata)
    expected = np.maximum(start, start.mean())
    assert r.timed_out and r.error is None and r.trace["status"] == "timeout"
    assert np.array_equal(np.asarray(r.trace["values"]), expected)
    assert r.score == pytest.approx(reward(score("first_autocorrelation", start),
                                           score("first_autocorrelation", expected))) and r.score > 0
    assert r.latency_s < BUDGET_S + GRACE_S + 2.5  # stopped by the runner, not by the hard kill


def test_a_program_holding_the_interpreter_forever_is_killed_and_its_saved_point_counts(executor):
    # A catastrophic regex never releases the GIL: the runner's watchdog cannot run, the
    # executor's hard kill ends it, and the point the writer thread saved counts.
    body = '''
    import re
    def optimize(values, *, seed, deadline):
        better = np.maximum(values, values.mean())
        publish(better)
        time.sleep(0.6)   # the writer saves it meanwhile
        re.match(r"(a+)+$", "a" * 64 + "b")
        return values
    '''
    # 3 s: the regex must start before the deadline passes, also when a loaded machine's
    # start-up used the first second (else the watchdog stops it first: "timeout").
    t = task(budget_s=3.0)
    r = executor.execute(program(body), t, 0, 0)
    start = start_values(t.metadata)
    assert r.timed_out and r.error is None and r.trace["status"] == "killed"
    assert np.array_equal(np.asarray(r.trace["values"]), np.maximum(start, start.mean()))
    assert r.score > 0


@pytest.mark.parametrize("problem,body,reason", [
    ("first_autocorrelation", '''
    def optimize(values, *, seed, deadline):
        publish(values * 0.5)
        raise RuntimeError("boom in the optimizer")
    ''', "the program failed: RuntimeError: boom in the optimizer"),
    ("first_autocorrelation", '''
    import sys
    def optimize(values, *, seed, deadline):
        sys.stdout.buffer.write(bytes(range(256)) * 50)
        return "not numbers"
    ''', "not a vector of numbers"),
    ("first_autocorrelation", '''
    def optimize(values, *, seed, deadline):
        return np.stack([values, values])
    ''', "infeasible point: expected a 1-D vector"),
    ("first_autocorrelation", '''
    def optimize(values, *, seed, deadline):
        h = values.copy(); h[3] = -1.0
        return h
    ''', "infeasible point: h: first_autocorrelation needs heights >= 0"),
    ("erdos_minimum_overlap", '''
    def optimize(values, *, seed, deadline):
        return values * 0.9
    ''', "infeasible point: h: erdos_minimum_overlap needs sum(h) = n/2"),
    ("third_autocorrelation", '''
    def optimize(values, *, seed, deadline):
        return None
    ''', "published no point and returned none"),
    ("first_autocorrelation", '''
    import os
    def optimize(values, *, seed, deadline):
        publish(values)
        os._exit(9)
    ''', "the runner died before saving a result: exited with code 9"),
    ("first_autocorrelation", "def optimize(values:\n", "importing harness.py failed: SyntaxError"),
])
def test_a_failing_program_scores_zero_with_the_reason(executor, problem, body, reason):
    r = executor.execute(program(body), task(problem), 0, 0)
    assert r.score == 0.0 and r.error_kind == "harness" and not r.timed_out
    assert reason in r.error and r.trace["reason"] == r.error
    assert r.trace["values"] is None and r.trace["score"] is None
    assert r.trace["start_score"] > 0 and r.problem() is None


def test_a_crash_leaves_its_traceback_and_output_in_the_trace(executor):
    body = '''
    import sys
    def optimize(values, *, seed, deadline):
        print("garbage \\x00\\x01 out")
        raise ValueError("deep inside")
    '''
    r = executor.execute(program(body), task(), 0, 0)
    assert "garbage" in r.trace["stdout_tail"]
    assert "Traceback" in r.trace["stderr_tail"] and "ValueError: deep inside" in r.trace["stderr_tail"]


def test_the_program_has_no_network_and_cannot_write_outside_its_workspace(executor):
    body = '''
    import socket
    def optimize(values, *, seed, deadline):
        for what, act in [("net", lambda: socket.create_connection(("1.1.1.1", 53), timeout=1)),
                          ("write", lambda: open("/usr/pwned", "w")),
                          ("tmp-escape", lambda: open("/etc/pwned", "w"))]:
            try:
                act()
                print(what, "ALLOWED")
            except OSError as exc:
                print(what, "refused", type(exc).__name__)
        return values
    '''
    r = executor.execute(program(body), task(), 0, 0)
    out = r.trace["stdout_tail"]
    assert "ALLOWED" not in out and out.count("refused") == 3
    assert r.score == 0.0 and r.error_kind is None  # the start itself, feasible, no gain


def test_bad_task_metadata_is_a_task_failure_named_by_field(executor):
    r = executor.execute(program(RATCHET), task(budget_s=-1), 0, 0)
    assert r.error_kind == "task" and "metadata.budget_s" in r.error and r.score == 0.0
    bad = Task("x", "train", "", 1.0, 0, {"format": "harbor"})
    assert executor.unsupported_tasks([bad, task()]) == [
        "task x: metadata.format='harbor', executor=optimizer runs einstein tasks"]


@pytest.mark.parametrize("problem", autocorr.PROBLEMS)
def test_the_runners_scorer_agrees_with_the_kernels(problem):
    rng = np.random.default_rng(3)
    for n in (2, 7, 64, 1000, 4097):
        if problem == "erdos_minimum_overlap":
            from milo_ray.benchmarks.einstein.starts import project

            h = project(problem, rng.uniform(0, 1, n))
        else:
            h = rng.uniform(-0.2 if problem == "third_autocorrelation" else 0.0, 1.0, n)
        expected = score(problem, h)
        assert optimizer_runner.fft_score(problem, h) == pytest.approx(expected, rel=1e-9, abs=0)
    infeasible = {"first_autocorrelation": -np.ones(8), "third_autocorrelation": np.zeros(8),
                  "erdos_minimum_overlap": np.full(8, 0.9)}[problem]
    assert np.isnan(optimizer_runner.fft_score(problem, infeasible))


def test_the_config_builds_the_executor_without_a_model():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from milo_ray.boundary.sandbox.interpreter import interpreter_paths, under_any

    conf = Path(__file__).resolve().parents[2] / "conf"
    cfg = OmegaConf.create({"sandbox": OmegaConf.load(conf / "sandbox" / "bwrap.yaml"),
                            "model": {"id": "offline-surrogate"},
                            "executor": OmegaConf.load(conf / "executor" / "optimizer.yaml")})
    ex = instantiate(cfg.executor)
    assert isinstance(ex, OptimizerExecutor) and ex.model_id == "optimizer"
    assert all(under_any(p, ex.sandbox.host_readonly) for p in interpreter_paths())
