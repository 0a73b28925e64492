"""executor=optimizer under sandbox=local: the runner reaches its workdir through the
local sandbox's host path for it, so a program scores as it does under bwrap, and a
failure there is described by what was observed (no memory cgroup: never "out of
memory")."""

from __future__ import annotations

import shutil
import textwrap

import numpy as np
import pytest

from milo_ray.benchmarks.einstein import reward, score, start_values
from milo_ray.core.tasks import Task
from milo_ray.execution.optimizer_executor import OptimizerExecutor
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.boundary.sandbox.local import LocalSandboxFactory
from milo_ray.harness.model import Harness

# Deterministic whatever the clock: the score does not depend on how long it ran.
LIFT = '''
import numpy as np

def optimize(values, *, seed, deadline):
    better = np.maximum(values, values.mean())
    publish(better)
    return better
'''


def _task() -> Task:
    meta = {"format": "einstein", "problem": "first_autocorrelation", "start": {"base": "random", "n": 64, "seed": 0},
            "budget_s": 2.0}
    return Task("first_autocorrelation-t", "train", "", time_cap_s=3.0, token_cap=0, metadata=meta)


def _local(tmp_path) -> OptimizerExecutor:
    return OptimizerExecutor(sandbox=LocalSandboxFactory(command_timeout_s=60), grace_s=0.5,
                             scratch_dir=str(tmp_path))


def test_a_program_under_sandbox_local_scores_as_under_bwrap(tmp_path):
    t = _task()
    local = _local(tmp_path).execute(Harness.from_source(LIFT), t, 0, 0)
    start = start_values(t.metadata)
    expected = reward(score("first_autocorrelation", start),
                      score("first_autocorrelation", np.maximum(start, start.mean())))
    assert local.error is None and local.error_kind is None and not local.timed_out, local.error
    assert local.score == pytest.approx(expected) and local.score > 0
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed: compared with the kernels' score only")
    bwrap = OptimizerExecutor(sandbox=BwrapSandboxFactory(command_timeout_s=60), grace_s=0.5).execute(
        Harness.from_source(LIFT), t, 0, 0)
    assert bwrap.error is None and local.score == bwrap.score
    assert local.trace["values"] == bwrap.trace["values"]


def test_a_runner_that_exits_under_sandbox_local_is_named_by_its_exit_code(tmp_path):
    body = textwrap.dedent('''
    import os

    def optimize(values, *, seed, deadline):
        os._exit(3)
    ''')
    r = _local(tmp_path).execute(Harness.from_source(body), _task(), 0, 0)
    assert r.score == 0.0 and r.error_kind == "harness"
    assert "the runner died before saving a result: exited with code 3" in r.error
    assert "memory" not in r.error
