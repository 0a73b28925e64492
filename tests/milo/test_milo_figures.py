"""The MILO figures of the run report, on a small finished MILO run: every figure is
drawn, and what each plots equals what the run's tables and manifest say (data, not
pixels: artists are found by their ``gid``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import duckdb
import numpy as np
import pytest

from milo_ray.milo.figures import figures, replay
from milo_ray.results import load_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(shared_runs):
    """The shared MILO run: 3 islands, 2 rounds, patience 1 (tests/shared_runs.py)."""
    res = load_run(shared_runs / "milo")
    return res, {f.name: f for f in figures(res)}


def _artist(fig, gid):
    found = fig.findobj(lambda a: a.get_gid() == gid)
    assert len(found) == 1, f"{gid}: {len(found)} artists"
    return found[0]


def _nodes(res) -> list[dict]:
    """Harness rows of island nodes, with the node's labels from ``extra``."""
    rows = duckdb.sql(f"select island, round, admitted, origin, parent_id, extra "
                      f"from read_parquet('{res.run_dir}/harnesses/*.parquet') where island is not null").fetchall()
    return [{"island": j, "round": r, "admitted": a, "origin": o, "parent_id": p, **json.loads(x)}
            for j, r, a, o, p, x in rows]


def _speciated(res) -> set[int]:
    return {i for p in res.events_of("milo.island") for i in (p["island"], p["from_island"])}


def test_every_figure_is_drawn_with_titles_and_data(run):
    res, figs = run
    islands = sorted({n["island"] for n in _nodes(res)} | {p["island"] for p in res.events_of("milo.island")})
    assert set(figs) == {"milo_island_trajectories", "milo_pareto", "milo_true_quality",
                         *(f"milo_lineage_island_{j}" for j in islands)}
    for f in figs.values():
        assert f.title and f.caption and f.fig.axes
        drawn = sum(len(ax.lines) + len(ax.collections) for ax in f.fig.axes)
        assert drawn >= 2, f"{f.name} draws almost nothing"
        assert any(ax.get_title() for ax in f.fig.axes) or f.fig.get_suptitle()
        assert any(ax.get_xlabel() for ax in f.fig.axes) or f.name.startswith("milo_lineage")
    # The MILO plugin's report section holds exactly these; a run without MILO events gets none.
    (section,) = res.plugin.report_sections(res)
    assert [f.name for f in section.figures] == list(figs)
    assert figures(dataclasses.replace(res, events=res.events.iloc[:0])) == []


def test_best_search_accuracy_by_round_equals_the_harnesses_table(run):
    res, figs = run
    fig = figs["milo_island_trajectories"].fig
    nodes = _nodes(res)
    checked = 0
    for j in sorted({n["island"] for n in nodes} - _speciated(res)):
        rounds = [0] + [p["rounds_done"] for p in res.events_of("milo.progress") if p["island"] == j]
        line = _artist(fig, f"best_search:{j}")
        assert list(line.get_xdata()) == rounds
        want = [max(n["accuracy"] for n in nodes if n["island"] == j and n["admitted"] and n["round"] <= r)
                for r in rounds]
        np.testing.assert_allclose(line.get_ydata(), want)
        checked += 1
        # the held-out accuracy of the incumbent after the last round is the one the summary reports
        held = _artist(fig, f"heldout:{j}").get_ydata()
        assert held[-1] == pytest.approx(res.summary["islands"][str(j)]["heldout_accuracy"])
    assert checked >= 2
    lane = _artist(fig, "lane:reassign")
    assert len(lane.get_offsets()) == len(res.events_of("milo.reassign")) > 0


def test_lineage_trees_show_each_islands_admitted_and_rejected_nodes(run):
    res, figs = run
    nodes = _nodes(res)
    for j in sorted({n["island"] for n in nodes} - _speciated(res)):
        fig = figs[f"milo_lineage_island_{j}"].fig
        mine = [n for n in nodes if n["island"] == j]
        for kind, want in (("admitted", [n for n in mine if n["admitted"] and n["accuracy"] is not None]),
                           ("rejected", [n for n in mine if not n["admitted"] and n["accuracy"] is not None])):
            found = fig.findobj(lambda a: a.get_gid() == f"nodes:{kind}")
            assert sum(len(a.get_offsets()) for a in found) == len(want), (j, kind)
        # one edge per child: every node but the island's seed root
        edges = fig.findobj(lambda a: str(a.get_gid()).startswith("edge:"))
        assert len(edges) == sum(n["parent_id"] is not None for n in mine) == sum(n["origin"] != "seed" for n in mine)


def test_pareto_highlights_exactly_the_admitted_harnesses(run):
    res, figs = run
    fig = figs["milo_pareto"].fig
    admitted = [n for n in _nodes(res) if n["admitted"]]
    for axis in ("output_tokens", "seconds"):
        got = sorted(map(tuple, _artist(fig, f"admitted:{axis}").get_offsets().tolist()))
        want = sorted((n["costs"][axis], n["accuracy"]) for n in admitted)
        np.testing.assert_allclose(got, want)
        # the staircase runs through the admitted harnesses no other admitted one dominates
        front = {(c, a) for c, a in want if not any((c2 <= c and a2 > a) or (c2 < c and a2 >= a) for c2, a2 in want)}
        line = _artist(fig, f"front:{axis}")
        assert set(zip(line.get_xdata(), line.get_ydata())) == front


def test_true_quality_of_each_incumbent_equals_the_runs_own_summary(run):
    res, figs = run
    fig = figs["milo_true_quality"].fig
    rp = replay(res)
    for j in rp.state.islands:
        line = _artist(fig, f"incumbent_true:{j}")
        assert line.get_ydata()[-1] == pytest.approx(res.summary["islands"][str(j)]["true_quality"], abs=1e-12)
