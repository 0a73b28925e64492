"""The instance-level figure of the run report, on a small finished milo_einstein run:
it is drawn, and each step line is the running minimum of the verified scores the
rollout traces hold, at the rollouts' finish times, against the published anchors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest

from milo_ray.benchmarks.einstein.problems import ANCHORS
from milo_ray.report.einstein_figures import figures
from milo_ray.results import load_run
from milo_ray.store import open_run

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "entry" / "cli_jobs.py"
PROBLEM = "first_autocorrelation"
EINSTEIN_SMALL = ["+experiment=milo_einstein", f"benchmark.problem={PROBLEM}", "benchmark.budget_s=1",
                  "benchmark.grace_s=1", "run.time_limit_s=null", "method.search_size=2", "method.val_size=1",
                  "method.max_rounds=1", "method.num_islands=2", "run.progress=false", "run.report=false", "execution.num_cpus=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("einstein-figures")
    jobs, out = root / "jobs.json", root / "out.json"
    jobs.write_text(json.dumps({"einstein": [*EINSTEIN_SMALL, f"run.dir={root / 'einstein'}"]}))
    proc = subprocess.run([sys.executable, str(RUNNER), str(jobs), str(out)], cwd=root, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert out.exists() and json.loads(out.read_text())["einstein"]["code"] == 0, proc.stderr[-3000:]
    res = load_run(root / "einstein")
    return res, figures(res)


def _artists(fig, prefix):
    return {a.get_gid(): a for a in fig.findobj(lambda a: str(a.get_gid()).startswith(prefix))}


def _verified(res) -> dict[str, list[tuple[float, float]]]:
    """island label -> [(finish time since the run started, verified score)], read with
    duckdb and the run store, independently of the report code."""
    store = open_run(res.run_dir)
    rows = duckdb.sql(f"""
        select r.trace_ref, r.finished_at, h.island
        from read_parquet('{res.run_dir}/rollouts/*.parquet') r
        left join (select harness_id, min(island) as island from read_parquet('{res.run_dir}/harnesses/*.parquet')
                   group by harness_id) h using (harness_id)
        where r.trace_ref is not null order by r.finished_at""").fetchall()
    t0 = json.loads((res.run_dir / "manifest.json").read_text())["started_at"]
    out: dict[str, list[tuple[float, float]]] = {}
    for ref, finished, island in rows:
        trace = store.get_blob(ref)
        if trace.get("problem") == PROBLEM and trace.get("score") is not None:
            out.setdefault("no island" if island is None else f"island {island}", []).append((finished - t0, trace["score"]))
    return out


def test_the_figure_is_drawn_for_an_einstein_run_only(run):
    res, figs = run
    assert [f.name for f in figs] == ["einstein_score_over_time"]
    f = figs[0]
    assert f.title and PROBLEM in f.caption and len(f.fig.axes) == 1
    ax = f.fig.axes[0]
    assert PROBLEM in ax.get_title(loc="left") and ax.get_xlabel() and ax.get_ylabel()
    assert ax.get_yscale() == "symlog"
    assert figures(dataclasses.replace(res, rollouts=res.rollouts.iloc[:0])) == []


def test_best_so_far_per_island_is_the_running_minimum_of_verified_scores(run):
    res, figs = run
    lines = _artists(figs[0].fig, f"best:{PROBLEM}:")
    want = _verified(res)
    ref = min(v for v in ANCHORS[PROBLEM].values() if v is not None)
    assert len(want) >= 2, "the run should have several islands"
    assert set(lines) == {f"best:{PROBLEM}:{g}" for g in want} | {f"best:{PROBLEM}:all"}
    for group, points in want.items():
        line = lines[f"best:{PROBLEM}:{group}"]
        t, s = np.array(points).T
        np.testing.assert_allclose(line.get_xdata(), t)
        np.testing.assert_allclose(line.get_ydata(), np.minimum.accumulate(s) - ref, rtol=0, atol=1e-15)
    every = np.array(sorted(p for pts in want.values() for p in pts))
    np.testing.assert_allclose(lines[f"best:{PROBLEM}:all"].get_ydata()[-1], every[:, 1].min() - ref, atol=1e-15)


def test_every_published_anchor_is_drawn_and_labelled(run):
    res, figs = run
    ax = figs[0].fig.axes[0]
    ref = min(v for v in ANCHORS[PROBLEM].values() if v is not None)
    flat = {float(line.get_ydata()[0]) for line in ax.lines if len(set(line.get_ydata())) == 1 and line.get_gid() is None
            and line.get_linestyle() == ":"}
    texts = " ".join(t.get_text() for t in ax.texts)
    for name, value in ANCHORS[PROBLEM].items():
        if value is not None:
            assert any(abs(y - (value - ref)) < 1e-15 for y in flat), name
            assert name in texts
