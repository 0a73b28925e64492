"""Lineage memory and its markdown snapshot."""

from __future__ import annotations

import re

import pytest

from milo_helpers import node
from milo_ray.agents.orchestrators.offline import parse_snapshot
from milo_ray.milo.island import Island
from milo_ray.milo.lineage import Lineage, LineageNode
from milo_ray.milo.render import render_flat_archive, render_island, render_population


def _lineage() -> Lineage:
    lin = Lineage(2)
    lin.add(LineageNode.from_dict(node("s", island=2, acc=0.4, harness_path="/r/h/s/harness.py")))
    lin.add(LineageNode.from_dict(node("2-1", island=2, parent="s", acc=0.5, mutation="add verifier gate",
                                       harness_path="/r/h/a/harness.py", diff_path="/r/h/a/diff.patch",
                                       diff_added=12, diff_deleted=3)))
    lin.add(LineageNode.from_dict(node("2-2", island=2, parent="2-1", acc=0.3, admitted=False,
                                       mutation="drop planning tool", reason="dominated by 2-1 (acc 0.500 vs 0.300)")))
    lin.add(LineageNode.from_dict(node("2-3", island=2, parent="s", acc=None, admitted=False,
                                       mutation="rewrite prompt", reason="mutator error: timed out")))
    return lin


def test_memory_is_append_only():
    lin = _lineage()
    with pytest.raises(ValueError, match="append-only"):
        lin.add(LineageNode.from_dict(node("s", island=2)))


def test_edges_carry_delta_acc_and_delta_cost():
    lin = _lineage()
    e = lin.edge("2-1")
    assert e.delta_acc == pytest.approx(0.1)
    assert e.diff_added == 12 and e.diff_deleted == 3
    assert set(e.delta_cost) == {"output_tokens", "seconds"}
    assert lin.edge("2-3").delta_acc is None  # unevaluated child
    assert lin.edge("s") is None


def test_edges_across_a_curriculum_change_carry_no_gains():
    lin = _lineage()
    lin.add(LineageNode.from_dict(node("2-4", island=2, parent="2-1", acc=0.9, search_version=1)))
    e = lin.edge("2-4")
    assert e.delta_acc is None and e.delta_cost == {}
    lin.update("2-1", search_version=1)  # the parent re-fit on the new task set
    assert lin.edge("2-4").delta_acc == pytest.approx(0.4)


def test_graft_child_carries_its_cross_island_co_parent_edge():
    lin = _lineage()
    d = node("d2-1-g0", island=2, parent="2-1", acc=0.7, mutation="graft the donor's verifier")
    d.update(origin="graft", co_parent="0-4", co_parent_label={"accuracy": 0.6, "costs": d["costs"]})
    lin.add(LineageNode.from_dict(d))
    e = lin.co_parent_edge("d2-1-g0")
    assert e.kind == "graft" and e.parent == "0-4" and e.delta_acc == pytest.approx(0.1)
    assert lin.co_parent_edge("2-1") is None  # a tree child has no co-parent
    line = [l for l in render_island(lin, mutator="bold", stall=0).splitlines() if "[d2-1-g0]" in l][0]
    assert "co-parent: 0-4 (vs it: Δacc +0.100" in line


def test_rejected_children_are_rendered_with_verdict_and_mutation():
    md = render_island(_lineage(), mutator="bold", stall=1)
    lines = md.splitlines()
    child = [l for l in lines if "[2-2]" in l and l.lstrip().startswith("-")][0]
    assert "mutation: drop planning tool" in child
    assert child.endswith("verdict: rejected (dominated by 2-1 (acc 0.500 vs 0.300))")
    failed = [l for l in lines if "[2-3]" in l and l.lstrip().startswith("-")][0]
    assert "verdict: rejected (mutator error: timed out)" in failed
    admitted = [l for l in lines if "[2-1]" in l and l.lstrip().startswith("-")][0]
    assert "verdict: admitted" in admitted and "diff: /r/h/a/diff.patch" in admitted
    assert "harness: /r/h/a/harness.py" in admitted
    # Indentation encodes depth: 2-2 is a grandchild of the root.
    assert child.startswith("    - [2-2] depth 2")
    assert "What moved the needle" in md
    ranking = md.split("What moved the needle")[1]
    assert ranking.index("[2-1]") < ranking.index("[2-2]")


def test_snapshot_lines_parse_back():
    md = render_island(_lineage())
    parsed = parse_snapshot(md)[2]
    assert [(p["node"], p["mutation"], p["admitted"]) for p in parsed] == [
        ("2-1", "add verifier gate", True), ("2-2", "drop planning tool", False), ("2-3", "rewrite prompt", False)]


def test_flat_archive_hides_tree_and_rejections():
    md = render_flat_archive(_lineage())
    assert "verdict" not in md and "mutation" not in md
    assert "/r/h/a/harness.py" in md and "[2-2]" not in md


def test_population_snapshot_lists_every_island():
    a, b = Island(0), Island(1)
    a.add_node(node("x", acc=0.4, behavior={"t1": 1.0, "t2": 0.0}))
    b.add_node(node("y", island=1, acc=0.6, behavior={"t1": 0.0, "t2": 1.0}))
    md = render_population([(0, a.summary(), a.render()), (1, b.summary(), b.render())],
                           assignment={0: "bold", 1: "sloppy"}, pool=["bold", "sloppy"],
                           regret={"t1": 0.5, "t2": 0.5}, search_tasks=["t1", "t2"], trigger=0)
    assert "## Island 0 summary" in md and "## Island 1 summary" in md
    assert "island 1 -> sloppy" in md and "Stalled island: 0" in md
    assert re.search(r"best behavior: solved 1 \[t2\]", md)
    assert "### Island 1" in md


def test_node_origin_is_checked():
    with pytest.raises(ValueError, match="origin"):
        LineageNode(node_id="x", harness_id="h", island=0, round=0, origin="alien")
