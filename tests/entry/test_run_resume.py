"""The entry point end to end: an eval run writes Parquet, and a run killed with
SIGKILL resumes without re-running or losing finished rollouts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

# A cluster, containers or whole command-line runs: the slow suite (pytest -m slow; .ci/run runs it).
pytestmark = pytest.mark.slow

ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
EVAL_ARGS = ["method=eval", "method.k=8", "method.split=test", "benchmark=surrogate_swepro",
             "run.progress=false", "run.report=false", "execution.num_cpus=2"]


def _run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "milo_ray.run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV)


def _rollouts(run_dir: Path) -> list[tuple]:
    return duckdb.sql(
        f"select cache_key, score, output_tokens from '{run_dir}/rollouts/*.parquet' order by cache_key"
    ).fetchall()


@pytest.mark.slow
def test_sigkilled_run_resumes_without_rerunning_or_losing_rollouts(tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "milo_ray.run", *EVAL_ARGS, f"run.dir={killed}"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if list((killed / "rollouts").glob("*.parquet")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be interrupted; make it longer"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _rollouts(killed)
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["status"] == "running"
    total = 5 * 100 * 8
    assert 0 < len(before) < total

    resumed = _run([f"run.resume={killed}", "run.progress=false", "run.report=false"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _rollouts(killed)
    keys = [row[0] for row in after]
    assert len(keys) == len(set(keys)) == total, "every rollout exactly once"
    assert set(before) <= set(after), "nothing stored before the kill was lost or changed"
    assert json.loads((killed / "manifest.json").read_text())["status"] == "finished"
    # run.log keeps both sessions: the killed one opened and never closed, the resumed one
    # appended after it, opened and closed.
    log = (killed / "run.log").read_text()
    assert [m.group(1) for m in re.finditer(r"session (\d+) of run \S+ started \((new run|resumed)\)", log)] == [
        "1", "2"] and "(new run)" in log and "(resumed)" in log
    assert re.findall(r"session (\d+) ended: status (\w+)", log) == [("2", "finished")]

    fresh = tmp_path / "fresh"
    straight = _run([*EVAL_ARGS, f"run.dir={fresh}"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert _rollouts(fresh) == after, "a resumed run records exactly what an uninterrupted run records"
