"""The sweep summary reads every job's run: a job whose run cannot be read is never a success."""

from __future__ import annotations

import shutil

import pandas as pd

from milo_ray.sweep.jobs import RUN_MISSING, JobOutcome
from milo_ray.sweep.launcher import SweepResult
from milo_ray.sweep.summary import write_summary

WORKER = "node w1 (10.0.0.2, worker, no longer alive)"


def _succeeded(num: int, run_dir, node: str | None = None) -> JobOutcome:
    return JobOutcome(num=num, overrides=(f"run.seed={num}",), run_dir=str(run_dir), status="SUCCEEDED", exit_code=0,
                      log_tail="run directory: x  (status: finished)", driver_node=node)


def test_a_succeeded_job_whose_run_cannot_be_read_is_run_missing(tmp_path):
    lost = _succeeded(0, tmp_path / "0", WORKER)
    paths = write_summary(tmp_path, [lost])
    assert lost.status == RUN_MISSING and not lost.ok
    assert SweepResult(outcomes=[lost]).failed == [lost]  # the sweep exits 1
    row = pd.read_parquet(paths["parquet"]).iloc[0]
    assert row["status"] == RUN_MISSING and row["driver_node"] == WORKER
    assert row["run_problem"].startswith(f"its run directory {tmp_path / '0'} does not exist on ")
    assert row["error"] == row["run_problem"] and row["run_problem"].endswith(f"its driver ran on {WORKER}")
    md = paths["markdown"].read_text()
    assert f"| 0 | run.seed=0 | - | {RUN_MISSING} |" in md and f"### job 0: {RUN_MISSING}" in md
    assert "No comparison page: no job's run can be read (Job 0 (run.seed=0) is not on this page" in md


def test_a_directory_without_a_manifest_is_not_a_run(tmp_path):
    (tmp_path / "0").mkdir()
    job = _succeeded(0, tmp_path / "0")
    write_summary(tmp_path, [job])
    assert job.status == RUN_MISSING and "has no manifest.json" in job.run_problem
    assert "its driver ran on a node Ray did not name" in job.run_problem


def test_the_comparison_page_names_the_jobs_whose_runs_are_missing(shared_runs, tmp_path):
    shutil.copytree(shared_runs / "eval", tmp_path / "0")
    found, lost = _succeeded(0, tmp_path / "0"), _succeeded(1, tmp_path / "1", WORKER)
    paths = write_summary(tmp_path, [found, lost])
    frame = pd.read_parquet(paths["parquet"])
    assert list(frame["status"]) == ["SUCCEEDED", RUN_MISSING]
    assert frame.loc[0, "run_status"] == "finished" and frame.loc[0, "pr_at_k"] > 0 and pd.isna(frame.loc[0, "run_problem"])
    html = paths["comparison"].read_text()
    assert "1 run(s)" in html and "Job 1 (run.seed=1) is not on this page: RUN_MISSING" in html
    assert "w1 (10.0.0.2, worker, no longer alive)" in html
