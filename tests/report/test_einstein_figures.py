"""The instance-level figure of the run report, on a small finished milo_einstein run:
it is drawn, and each step line is the running minimum of the verified scores the
rollout traces hold, at the rollouts' finish times, against the published anchors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import duckdb
import numpy as np
import pytest

from milo_ray.benchmarks.einstein.problems import ANCHORS
from milo_ray.report.einstein_figures import figures
from milo_ray.results import load_run
from milo_ray.store import open_run

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = "first_autocorrelation"


@pytest.fixture(scope="module")
def run(shared_runs):
    """The shared einstein run: 2 islands, one round (tests/shared_runs.py)."""
    res = load_run(shared_runs / "einstein")
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


def test_the_whole_report_renders_for_an_einstein_run(run, tmp_path):
    from milo_ray.report import write_report

    res, _ = run
    page = write_report(res.run_dir, tmp_path / "report")
    html = page.read_text()
    png = (tmp_path / "report" / "einstein_score_over_time.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "einstein_score_over_time" in html and 'id="final-test-table"' in html
    # Its numbers are the run's rewards: the final test's PR@k is their mean over the test rollouts.
    assert res.summary["final_test"] and f'{res.summary["final_test"][0]["pr_at_k"]:.3f}' in html
