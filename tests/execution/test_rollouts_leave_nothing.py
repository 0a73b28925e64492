"""Nothing of a rollout outlives it: after optimizer rollouts in real bwrap sandboxes that
end every way a rollout ends (returned, crashed, timed out and hard-killed, killed from
outside mid-run), the number of per-sandbox cgroups and scratch directories this process
owns is back to what it was."""

from __future__ import annotations

import os
import shutil
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from milo_ray.core.tasks import Task
from milo_ray.execution.optimizer_executor import OptimizerExecutor
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.boundary.sandbox.cgroups import CGROUP_PREFIX, probe_cgroups
from milo_ray.boundary.sandbox.leftovers import SCRATCH_PREFIX, current_owner
from milo_ray.harness.model import Harness

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")]

BUDGET_S = 1.0

RETURNS = '''
def optimize(values, *, seed, deadline):
    return np.maximum(values, values.mean())
'''
CRASHES = '''
def optimize(values, *, seed, deadline):
    raise RuntimeError("harness crash")
'''
# Never releases the GIL: the runner's watchdog cannot stop it, the sandbox's timeout does.
HOLDS_THE_INTERPRETER = '''
import re
def optimize(values, *, seed, deadline):
    re.match(r"(a+)+$", "a" * 64 + "b")
'''
SLEEPS = '''
def optimize(values, *, seed, deadline):
    time.sleep(30)
'''


def _task() -> Task:
    meta = {"format": "einstein", "problem": "first_autocorrelation", "start": {"base": "random", "n": 64, "seed": 0},
            "budget_s": BUDGET_S}
    return Task("first_autocorrelation-t", "train", "", time_cap_s=BUDGET_S + 1, token_cap=0, metadata=meta)


def _program(body: str) -> Harness:
    return Harness.from_source("import time\nimport numpy as np\n" + textwrap.dedent(body))


def _own_cgroups() -> list[Path]:
    tag = CGROUP_PREFIX + current_owner().tag
    parents = set(probe_cgroups().parents.values())
    return [p / name for p in parents for name in os.listdir(p) if name.startswith(tag)]


def _own_scratch(scratch_dir: Path) -> list[str]:
    return [n for n in os.listdir(scratch_dir) if n.startswith(SCRATCH_PREFIX + current_owner().tag)]


def _kill_what_runs_in_a_sandbox(stop: threading.Event) -> None:
    """From outside, SIGKILL every process in this process's sandboxes' cgroups once, when
    one has been running for a second (the rollout is mid-run)."""
    first_seen = None
    while not stop.is_set():
        pids = set()
        for d in _own_cgroups():
            try:
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        if pids:
            first_seen = first_seen or time.monotonic()
            if time.monotonic() - first_seen > 1.0:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
        time.sleep(0.05)


def test_no_cgroup_or_scratch_directory_outlives_its_rollout(tmp_path):
    if not probe_cgroups().parents:
        pytest.skip("no cgroup can be created here: only scratch directories are counted")
    executor = OptimizerExecutor(sandbox=BwrapSandboxFactory(command_timeout_s=60), grace_s=0.5,
                                 scratch_dir=str(tmp_path))
    cgroups_before, scratch_before = len(_own_cgroups()), len(_own_scratch(tmp_path))

    ok = executor.execute(_program(RETURNS), _task(), 0, 0)
    assert ok.error is None and ok.score > 0
    crashed = executor.execute(_program(CRASHES), _task(), 0, 0)
    assert "harness crash" in crashed.error
    timed_out = executor.execute(_program(HOLDS_THE_INTERPRETER), _task(), 0, 0)
    assert timed_out.timed_out and timed_out.trace["status"] == "killed"

    stop = threading.Event()
    killer = threading.Thread(target=_kill_what_runs_in_a_sandbox, args=(stop,), daemon=True)
    killer.start()
    try:
        killed = executor.execute(_program(SLEEPS), _task(), 0, 0)
    finally:
        stop.set()
        killer.join()
    assert killed.score == 0.0 and killed.error_kind == "harness" and "the runner died" in killed.error

    assert len(_own_cgroups()) == cgroups_before
    assert len(_own_scratch(tmp_path)) == scratch_before
