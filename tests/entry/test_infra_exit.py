"""A run whose rollouts all fail as infrastructure says so: exit code 3 and manifest
status ``failed_infra``, never ``finished`` (a run in which nothing measured a harness
must not pass for a result)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from milo_ray.run import EXIT_INFRA, FAILED_INFRA, _infra_only

HERE = Path(__file__).resolve().parent


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def read(self, table):
        assert table == "rollouts"
        cols = {k: [r[k] for r in self.rows] for k in ("error_kind", "finished_at", "error")}
        return pa.table({"error_kind": pa.array(cols["error_kind"], pa.string()),
                         "finished_at": pa.array(cols["finished_at"], pa.float64()),
                         "error": pa.array(cols["error"], pa.string()), "score": [0.0] * len(self.rows)})


def test_only_a_session_of_nothing_but_infra_failures_is_flagged():
    infra = {"error_kind": "infra", "finished_at": 10.0, "error": "lost node\ntrace"}
    assert _infra_only(_Rows([]), 0.0) is None  # nothing ran: nothing to say
    assert "all 2 rollouts" in _infra_only(_Rows([infra, dict(infra)]), 0.0)
    assert _infra_only(_Rows([infra, {**infra, "error_kind": "task"}]), 0.0) is None  # a task failure is a score
    assert _infra_only(_Rows([infra, {**infra, "error_kind": None}]), 0.0) is None
    # A resumed session is judged on its own rollouts, not on an earlier session's.
    assert _infra_only(_Rows([{**infra, "error_kind": None, "finished_at": 1.0}, infra]), 5.0) is not None
    assert _infra_only(_Rows([infra]), 11.0) is None


@pytest.mark.slow  # a whole run in a child process: the slow suite (.ci/run runs it)
def test_a_run_whose_every_rollout_fails_as_infra_exits_3_with_status_failed_infra(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "milo_ray.run", "method=eval", "method.k=1", "method.names=[minimal]",
         "executor._target_=infra_executor.AlwaysInfra", "execution.max_retries=1", "run.progress=false",
         "execution.num_cpus=1", f"run.dir={run_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_INFRA, proc.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == FAILED_INFRA
    assert "failed as infrastructure" in proc.stderr and "cannot reach the task's files" in proc.stderr
    assert not (run_dir / "report").exists()  # no report passes it off as a finished run
