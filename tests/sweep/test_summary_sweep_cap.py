"""The sweep summary names the jobs the sweep's spend cap (hydra.launcher.max_usd) stopped:
the runs whose run_budget_exhausted event says the sweep's ledger refused (scope sweep), not
their own run budget."""

from __future__ import annotations

import shutil

import pandas as pd

from milo_ray.store.parquet import ParquetRunStore
from milo_ray.sweep.jobs import JobOutcome
from milo_ray.sweep.summary import write_summary


def _job(num: int, run_dir) -> JobOutcome:
    return JobOutcome(num=num, overrides=(f"run.seed={num}",), run_dir=str(run_dir), status="SUCCEEDED", exit_code=0)


def _exhausted(run_dir, scope: str) -> None:
    store = ParquetRunStore(run_dir)
    try:
        reason = ("the sweep's USD budget is spent ($1.000000 of hydra.launcher.max_usd=$1)" if scope == "sweep"
                  else "the run's USD budget is spent ($1.000000 of run.budget.cost_usd=$1)")
        store.event("run_budget_exhausted", {"reason": reason, "scope": scope})
        store.flush()
    finally:
        store.close()


def test_the_summary_names_the_jobs_the_sweep_cap_stopped_and_only_them(shared_runs, tmp_path):
    for n in range(3):
        shutil.copytree(shared_runs / "eval", tmp_path / str(n))
    _exhausted(tmp_path / "0", "sweep")
    _exhausted(tmp_path / "2", "run")  # stopped by its own run budget: not the sweep's doing
    paths = write_summary(tmp_path, [_job(n, tmp_path / str(n)) for n in range(3)])
    frame = pd.read_parquet(paths["parquet"])
    assert list(frame["stopped_by_sweep_cap"]) == [True, False, False]
    md = paths["markdown"].read_text()
    assert "Stopped by the sweep's spend cap (hydra.launcher.max_usd): job 0 (run.seed=0)." in md
    assert "job 2" not in md.split("Stopped by the sweep's spend cap")[1].splitlines()[0]


def test_without_a_sweep_stop_the_summary_says_nothing_of_the_cap(shared_runs, tmp_path):
    shutil.copytree(shared_runs / "eval", tmp_path / "0")
    paths = write_summary(tmp_path, [_job(0, tmp_path / "0")])
    assert list(pd.read_parquet(paths["parquet"])["stopped_by_sweep_cap"]) == [False]
    assert "spend cap" not in paths["markdown"].read_text()
