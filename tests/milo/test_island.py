"""Island policies without Ray: admission, ΔHV, parent selection, stall bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from milo_helpers import fitness, node
from milo_ray.kernels.pareto import selection_scores
from milo_ray.milo.island import Island


def _island_with_seed(acc=0.5, tokens=1e5, seconds=600.0) -> Island:
    isl = Island(0, eps=0.02)
    isl.add_node(node("s0", acc=acc, tokens=tokens, seconds=seconds))
    return isl


def test_child_dominated_by_an_admitted_harness_is_rejected():
    isl = _island_with_seed(acc=0.5)
    v = isl.judge(fitness(0.40))  # clearly less accurate, same cost
    assert not v.admitted
    assert "dominated by s0" in v.reason
    v2 = isl.judge(fitness(0.49, tokens=2e5, seconds=900))  # within eps but costlier on every axis
    assert not v2.admitted


def test_cheaper_child_within_eps_is_admitted():
    isl = _island_with_seed(acc=0.5)
    v = isl.judge(fitness(0.49, tokens=5e4, seconds=300))
    assert v.admitted
    assert v.delta_hv > 0


def test_more_accurate_child_is_admitted_even_if_costlier():
    isl = _island_with_seed(acc=0.5)
    assert isl.judge(fitness(0.6, tokens=1e6, seconds=3000)).admitted


def test_every_admitted_child_has_positive_delta_hv_on_a_fresh_island():
    rng = np.random.default_rng(7)
    isl = _island_with_seed(acc=0.3)
    admitted = 0
    for i in range(200):
        f = fitness(float(rng.uniform(0.1, 0.7)), tokens=float(rng.uniform(1e4, 1e6)), seconds=float(rng.uniform(60, 3600)))
        v = isl.judge(f)
        if v.admitted:
            admitted += 1
            assert v.delta_hv > 0, f"admitted child {f} with ΔHV={v.delta_hv}"
            isl.add_node(node(f"c{i}", parent="s0", acc=f[0], tokens=(1 - f[1]) * 2e7, seconds=(1 - f[2]) * 7200))
    assert admitted >= 3


def test_parent_selection_frequencies_match_softmax_of_eta():
    isl = Island(0, eps=0.02, temperature=1.0)
    # Three admitted harnesses with different dominance / similarity structure.
    isl.add_node(node("a", acc=0.60, tokens=2e5, seconds=900, behavior={"t1": 1.0, "t2": 0.2, "t3": 0.6}))
    isl.add_node(node("b", parent="a", acc=0.50, tokens=1e5, seconds=600, behavior={"t1": 1.0, "t2": 0.0, "t3": 0.5}))
    isl.add_node(node("c", parent="a", acc=0.30, tokens=1.5e5, seconds=800, behavior={"t1": 0.0, "t2": 0.9, "t3": 0.0}))
    ids, p = isl.selection_probabilities()
    F = np.array([isl.lineage.node(i).fitness for i in ids])
    B = np.array([[isl.lineage.node(i).behavior[t] for t in ("t1", "t2", "t3")] for i in ids])
    eta = selection_scores(F, B, eps=0.02)
    expected = np.exp(eta - eta.max())
    expected /= expected.sum()
    np.testing.assert_allclose(p, expected)
    assert len(set(np.round(p, 6))) > 1  # the fixture is not trivially uniform
    n = 3000
    counts = {i: 0 for i in ids}
    for s in range(n):
        counts[isl.select_parent(1000 + s)] += 1
    obs = np.array([counts[i] for i in ids])
    chi2 = stats.chisquare(obs, expected * n)
    assert chi2.pvalue > 0.001, (obs, expected * n)


def test_best_mode_picks_highest_search_accuracy():
    isl = Island(0)
    isl.add_node(node("a", acc=0.4))
    isl.add_node(node("b", parent="a", acc=0.7))
    assert isl.select_parent(0, mode="best") == "b"


def test_rejected_children_are_never_selected_as_parents():
    isl = Island(0)
    isl.add_node(node("a", acc=0.4))
    isl.add_node(node("r", parent="a", acc=0.9, admitted=False))
    assert {isl.select_parent(s) for s in range(50)} == {"a"}


def test_held_out_best_is_tracked():
    isl = Island(0)
    isl.add_node(node("a", acc=0.4))
    assert isl.record_val("a", 0.3)
    isl.add_node(node("b", parent="a", acc=0.5))
    assert not isl.record_val("b", 0.3)  # not strictly better
    assert isl.record_val("b", 0.35)
    assert isl.best().node_id == "b"


def test_speciate_moves_subtree_and_keeps_rest():
    isl = Island(0)
    isl.add_node(node("a", acc=0.4))
    isl.add_node(node("b", parent="a", acc=0.3, admitted=False))
    isl.add_node(node("c", parent="b", acc=0.35))
    isl.add_node(node("d", parent="a", acc=0.45))
    moved = isl.detach_subtree("b")
    assert [m.node_id for m in moved] == ["b", "c"]
    assert [n.node_id for n in isl.lineage] == ["a", "d"]
    new = Island(1)
    new.adopt_subtree(moved)
    assert new.lineage.node("b").admitted  # the niche root is admitted on its own island
    assert new.lineage.node("b").island == 1
    with pytest.raises(ValueError, match="root"):
        isl.detach_subtree("a")


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="temperature"):
        Island(0, temperature=0)
    with pytest.raises(ValueError, match="no admitted"):
        Island(0).select_parent(0)


def test_a_speciated_subtree_takes_its_recorded_nodes_and_held_out_verdicts_along():
    from milo_ray.milo.events import HeldOut, NodeRecorded
    from milo_ray.milo.lineage import LineageNode

    src = Island(0)
    for n in (node("s0", acc=0.5), node("0-1", parent="s0", acc=0.6), node("0-2", parent="0-1", acc=0.7)):
        src.apply(NodeRecorded(LineageNode.from_dict(n)))
    src.apply(HeldOut(0, "0-1", 0.6))
    part = src.detach("0-1")
    assert part.node_ids == ["0-1", "0-2"] and part.val_gain == {"0-1": True}
    dst = Island(1)
    dst.adopt(part)
    # The moved node is never measured again (its verdict moved), and nothing stays behind.
    assert (dst.held_out_gain("0-1"), src.held_out_gain("0-1")) == (True, None)
    assert sorted(dst.recorded) == ["0-1", "0-2"] and list(src.recorded) == ["s0"]
    assert dst.recorded["0-1"].island == 0 and dst.node("0-1").island == 1  # as recorded vs. as held now


def test_a_round_plan_is_the_parent_draw_and_the_memory_of_one_state():
    isl = _island_with_seed()
    isl.add_node(node("0-1", parent="s0", acc=0.55, tokens=5e4))
    isl.set_progress(1, 0)
    plan = isl.plan(7, "softmax", "lineage", "bold")
    from milo_ray.core.seeds import derive_seed

    assert plan.parent.node_id == isl.select_parent(derive_seed(7, "parent", 0, 2), "softmax")
    assert (plan.rounds_done, plan.stall, plan.problem) == (1, 0, None)
    assert plan.memory == isl.render(memory="lineage", mutator="bold")
    empty = Island(3).plan(7, "softmax", "lineage", None)
    assert empty.parent is None and "no admitted harness" in empty.problem


def test_idle_rounds_count_the_rounds_since_the_island_last_evaluated_a_child():
    isl = Island(0)
    isl.add_node(node("0-0", acc=0.5))
    isl.add_node(node("0-1", parent="0-0", acc=0.6, round=1))
    assert isl.progress() == (0, 0)
    isl.set_progress(1, 0)
    assert isl.progress() == (1, 0)
    # Rounds 2 and 3 made a duplicate (not evaluated) and nothing (a failed mutation).
    isl.add_node(node("0-2", parent="0-1", acc=None, round=2, admitted=False))
    isl.set_progress(3, 2)
    assert isl.progress() == (3, 2)
    isl.add_node(node("0-4", parent="0-1", acc=0.55, round=4, admitted=False))  # evaluated, even if rejected
    isl.set_progress(4, 3)
    assert isl.progress() == (4, 0)
