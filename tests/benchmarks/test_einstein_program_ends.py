"""A runner that dies is described by what was observed: its exit code, the signal its
parent saw, the OOM kills its memory cgroup counted. "out of memory" only on the
counter's word, "killed by signal N" only when a signal was seen (real bwrap sandboxes,
through the optimizer executor)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from milo_ray.core.tasks import Task
from milo_ray.execution.optimizer_executor import OptimizerExecutor
from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.boundary.sandbox.process import ProcessEnd
from milo_ray.harness.model import Harness

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")

MEMORY_MB = 256


def _task() -> Task:
    meta = {"format": "einstein", "problem": "first_autocorrelation", "start": {"base": "random", "n": 64, "seed": 0},
            "budget_s": 5.0}
    return Task("first_autocorrelation-t", "train", "", time_cap_s=6.0, token_cap=0, metadata=meta)


def _program(body: str) -> Harness:
    return Harness.from_source("import os, signal, subprocess, time\nimport numpy as np\n" + textwrap.dedent(body))


def _run(body: str, *, cgroups: bool = True):
    executor = OptimizerExecutor(sandbox=BwrapSandboxFactory(command_timeout_s=60, cgroups=cgroups),
                                 memory_mb=MEMORY_MB, grace_s=0.5)
    r = executor.execute(_program(body), _task(), 0, 0)
    assert r.score == 0.0 and r.error_kind == "harness" and not r.timed_out
    return r.error


def _memory_cgroup(scratch: Path) -> bool:
    with BwrapSandboxFactory(command_timeout_s=10).open(SandboxSpec(task_id="probe", memory_mb=MEMORY_MB), scratch) as sb:
        return sb.limits.memory is not None and "cgroup" in sb.limits.memory


def test_an_exit_code_is_named_as_an_exit_code():
    error = _run('''
    def optimize(values, *, seed, deadline):
        print("giving up here", file=__import__("sys").stderr, flush=True)
        os._exit(3)
    ''')
    assert "the runner died before saving a result: exited with code 3" in error
    assert "giving up here" in error  # the stderr tail
    assert "memory" not in error and "signal" not in error


def test_a_sigkill_from_outside_is_named_as_a_signal_not_as_memory():
    error = _run('''
    def optimize(values, *, seed, deadline):
        subprocess.run(["kill", "-9", str(os.getpid())])
        time.sleep(30)
    ''')
    assert "killed by signal 9 (SIGKILL)" in error
    assert "memory" not in error and "exited with code" not in error


def test_exceeding_the_memory_cgroup_is_named_out_of_memory_from_its_counter(tmp_path):
    if not _memory_cgroup(tmp_path):
        pytest.skip("no memory cgroup on this machine: nothing counts OOM kills")
    error = _run('''
    def optimize(values, *, seed, deadline):
        hog = np.ones(2048 * 1024 * 1024 // 8)
        return values
    ''')
    assert "out of memory: the sandbox's memory cgroup counted" in error and "oom_kill" in error
    assert "killed by signal 9 (SIGKILL)" in error


def test_without_a_memory_counter_a_failed_allocation_is_never_called_out_of_memory_by_the_sandbox():
    # The RLIMIT_AS fallback: the allocation fails inside the program, which says so itself.
    error = _run('''
    def optimize(values, *, seed, deadline):
        hog = np.ones(2048 * 1024 * 1024 // 8)
        return values
    ''', cgroups=False)
    assert "MemoryError" in error and "memory cgroup" not in error


@pytest.mark.parametrize("end,expected", [
    (ProcessEnd(exit_code=3), "exited with code 3"),
    (ProcessEnd(exit_code=137), "exited with code 137"),  # a number, not a signal: nobody saw one
    (ProcessEnd(signal=9), "killed by signal 9 (SIGKILL)"),
    (ProcessEnd(signal=9, oom_kills=1),
     "out of memory: the sandbox's memory cgroup counted 1 OOM kill (its oom_kill counter); killed by signal 9 (SIGKILL)"),
    (ProcessEnd(signal=9, oom_kills=0), "killed by signal 9 (SIGKILL)"),
    (ProcessEnd(timeout_s=4.5, oom_kills=2),
     "killed by the sandbox's timeout after 4.5 s; out of memory: the sandbox's memory cgroup counted 2 OOM kills "
     "(its oom_kill counter)"),
    (ProcessEnd(), "ended without an exit status anyone observed"),
    (ProcessEnd(exit_code=1, stderr_tail="a\n\nTraceback\nValueError: bad\n"),
     "exited with code 1; stderr ends: a | Traceback | ValueError: bad"),
])
def test_a_process_end_names_only_what_was_observed(end, expected):
    assert end.describe() == expected
