"""The ray_jobs launcher end to end: one Ray job per sweep point, each its own driver.

Each sweep runs through the entry point in a subprocess
(``python -m milo_ray.run -m hydra/launcher=ray_jobs ...``) against the module's Ray head
(``hydra.launcher.address``), except the crash test, which lets the launcher start and stop
its own head."""

from __future__ import annotations

import json
import re
import urllib.request

import pandas as pd
import pytest

from conftest import EVAL_TINY, run_sweep
from milo_ray import results

# A cluster, containers or whole command-line runs: the slow suite (pytest -m slow; .ci/run runs it).
pytestmark = pytest.mark.slow


def _jobs(url: str) -> list:
    """The jobs submitted to the head at ``url`` (not drivers that merely connected)."""
    from ray.job_submission import JobSubmissionClient, JobType

    return [j for j in JobSubmissionClient(url).list_jobs() if j.type == JobType.SUBMISSION]


def _peak_in_flight(rollouts: pd.DataFrame) -> int:
    """Most rollouts running at one instant, from their stored start and finish times."""
    edges = sorted([(t, 1) for t in rollouts["started_at"]] + [(t, -1) for t in rollouts["finished_at"]],
                   key=lambda e: (e[0], e[1]))  # a finish before a start at the same instant
    peak = level = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def test_a_bad_point_refuses_the_sweep_before_any_job_is_submitted(sweep_ray, tmp_path):
    before = len(_jobs(sweep_ray))
    sweep = tmp_path / "sweep"
    proc = run_sweep([*EVAL_TINY, "method.k=1,0", f"run.dir={sweep}", f"hydra.launcher.address={sweep_ray}"],
                     cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "sweep point 1 (" in errors[0] and "method.k=0" in errors[0], proc.stderr
    assert len(_jobs(sweep_ray)) == before  # nothing submitted, not even the good point 0
    assert not sweep.exists()  # no sweep directory, no job directories


def test_concurrent_jobs_overlap_each_with_its_own_execution_settings(sweep_ray, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_sweep([*EVAL_TINY, "execution.slots_per_node=1,3", f"run.dir={sweep}",
                      f"hydra.launcher.address={sweep_ray}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "at most 2 at once (one per CPU of the cluster)" in proc.stderr  # the head has 2 CPUs

    runs = results.find_runs(sweep)
    assert [r.name for r in runs] == ["0", "1"]
    loaded = [results.load_run(r) for r in runs]
    # Each job's driver ran its own execution settings: its manifest says so, and its
    # rollouts' timestamps show that many in flight at most (and at the peak).
    for res, slots in zip(loaded, (1, 3)):
        assert res.manifest["config"]["execution"]["slots_per_node"] == slots
        assert _peak_in_flight(res.rollouts) == slots
    # The two jobs ran at the same time: their rollouts' time spans overlap.
    spans = [(r.rollouts["started_at"].min(), r.rollouts["finished_at"].max()) for r in loaded]
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans

    summary = pd.read_parquet(sweep / "summary.parquet")
    assert list(summary["job"]) == [0, 1] and set(summary["status"]) == {"SUCCEEDED"}
    assert list(summary["run_status"]) == ["finished", "finished"]
    assert "execution.slots_per_node=3" in summary.loc[1, "overrides"]
    for (_, row), res in zip(summary.iterrows(), loaded):
        test = results.final_test(res).iloc[0]
        for col in ("pass_at_k", "pass_at_k_lo", "pass_at_k_hi", "pr_at_k", "pr_at_k_lo", "pr_at_k_hi", "rr_at_k",
                    "rr_at_k_lo", "rr_at_k_hi", "n_tasks", "k"):
            assert row[col] == pytest.approx(test[col]), col
    md = (sweep / "summary.md").read_text()
    assert "| 1 | " in md and "SUCCEEDED" in md and f"{summary.loc[0, 'pr_at_k']:.3f} [" in md
    assert (sweep / "comparison" / "comparison.html").is_file()


@pytest.mark.slow
def test_a_crashing_job_is_reported_while_the_others_finish(tmp_path):
    from ray._private.utils import read_ray_address

    recorded = read_ray_address()  # what `ray start` instances on this machine recorded before
    sweep = tmp_path / "sweep"
    proc = run_sweep([*EVAL_TINY, "method._target_=milo_ray.evaluation.EvalMethod,sweep_fakes.CrashingEval",
                      "execution.join_running=false", "execution.num_cpus=1", f"run.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "started a Ray head for the sweep" in proc.stderr
    assert "at most 1 at once (one per CPU of the cluster)" in proc.stderr  # the head execution.num_cpus sized
    assert "1 of 2 job(s) failed" in proc.stderr and "a bug in the sweep's crashing method" in proc.stderr

    summary = pd.read_parquet(sweep / "summary.parquet")
    ok, crashed = summary.iloc[0], summary.iloc[1]
    assert ok["status"] == "SUCCEEDED" and ok["run_status"] == "finished" and ok["pr_at_k"] > 0
    assert crashed["status"] == "FAILED" and crashed["exit_code"] == 1 and crashed["run_status"] == "failed"
    assert "a bug in the sweep's crashing method" in crashed["error"]
    md = (sweep / "summary.md").read_text()
    assert "## Failed jobs" in md and "RuntimeError: a bug in the sweep's crashing method" in md
    assert "RuntimeError" in (sweep / "logs" / "1.log").read_text()
    assert json.loads((sweep / "0" / "manifest.json").read_text())["status"] == "finished"
    # The head the launcher started (execution.join_running=false) is gone, and the address
    # record that `ray start` wrote for it is back to what it was.
    url = re.search(r"started a Ray head for the sweep, dashboard (http://\S+)", proc.stderr).group(1)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/api/version", timeout=5)
    assert read_ray_address() == recorded


@pytest.mark.slow
def test_a_sweep_joins_the_ray_running_here_and_leaves_it_running(sweep_ray, tmp_path):
    before = len(_jobs(sweep_ray))
    sweep = tmp_path / "sweep"
    # No address: the launcher joins the `ray start` head recorded on this machine (the
    # module's), as a run with execution.join_running=true joins it.
    proc = run_sweep([*EVAL_TINY, "run.seed=0", f"run.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"joined the Ray running on this machine, dashboard {sweep_ray}" in proc.stderr
    assert len(_jobs(sweep_ray)) == before + 1  # submitted there, and the head still answers
    assert pd.read_parquet(sweep / "summary.parquet")["status"].tolist() == ["SUCCEEDED"]
