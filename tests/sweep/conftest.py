"""One Ray head with a dashboard for the sweep tests (started the way the launcher starts
its own), and a helper that runs a sweep through the entry point in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Tiny offline runs: the seed harness `minimal` evaluated once on the 20 validation tasks
# of surrogate_tb21, each rollout sleeping 0.2 s (so concurrency shows in the timestamps).
EVAL_TINY = ["method=eval", "method.k=1", "method.split=val", "method.names=[minimal]", "run.progress=false",
             "run.report=false", "executor._target_=sweep_fakes.SlowSurrogateExecutor", "+executor.sleep_s=0.2"]


def sweep_env() -> dict[str, str]:
    path = [str(REPO), str(HERE), *[p for p in [os.environ.get("PYTHONPATH")] if p]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def run_sweep(args: list[str], *, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m milo_ray.run -m hydra/launcher=ray_jobs ARGS`` in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "milo_ray.run", "-m", "hydra/launcher=ray_jobs", *args], cwd=cwd,
                          env=sweep_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def sweep_ray(tmp_path_factory):
    """A private Ray head with a dashboard on free ports (the launcher's own start_head),
    whose processes see the test fakes; yields its dashboard URL."""
    from milo_ray.sweep.local_ray import start_head

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = sweep_env()["PYTHONPATH"]  # the head's processes inherit it
    head = start_head(num_cpus=2, log_path=tmp_path_factory.mktemp("sweep-ray") / "head.log")
    try:
        yield head.dashboard_url
    finally:
        head.stop()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
