"""Decision schema validation and the offline orchestrator's four diagnoses."""

from __future__ import annotations

import pytest

from milo_ray.agents.orchestrators.offline import OfflineOrchestrator
from milo_ray.agents.orchestrators.schema import DecisionError, count_moves, validate_decision


def _ok(**kw):
    d = {"diagnosis": "x"}
    d.update(kw)
    return d


V = dict(islands=[0, 1, 2], mutators=["bold", "sloppy", "conservative"])


def test_valid_decision_is_normalized():
    d = validate_decision(_ok(reassign=[{"island": 1, "mutator": "bold"}]), **V)
    assert d["recombine"] == [] and d["speciate"] == [] and d["curriculum"] is None
    assert count_moves(d) == 1


@pytest.mark.parametrize("decision,match", [
    (_ok(reassign=[{"island": 7, "mutator": "bold"}]), "unknown island 7"),
    (_ok(recombine=[{"dest_island": 1, "donor_island": 1}]), "donor_island == dest_island"),
    (_ok(reassign=[{"island": 0, "mutator": "gpt"}]), "not in the pool"),
    (_ok(reassign=[{"island": 0, "mutator": "bold"}], recombine=[{"dest_island": 0, "donor_island": 1}],
         curriculum={"tasks": ["a"]}), "3 moves"),
    (_ok(speciate=[{"from_island": 0, "harness_id": "x"}]), "mutator"),
    ({"reassign": []}, "diagnosis"),
    ("not json", "JSON object"),
    (_ok(surprise=1), "surprise"),
])
def test_bad_decisions_are_rejected_with_clear_messages(decision, match):
    with pytest.raises(DecisionError, match=match):
        validate_decision(decision, **V)


def test_reassign_list_counts_as_one_move():
    d = _ok(reassign=[{"island": 0, "mutator": "bold"}, {"island": 1, "mutator": "sloppy"}],
            recombine=[{"dest_island": 0, "donor_island": 2}])
    assert count_moves(validate_decision(d, **V)) == 2


def test_semantic_checks_with_context():
    with pytest.raises(DecisionError, match="already uses"):
        validate_decision(_ok(reassign=[{"island": 0, "mutator": "bold"}]), **V, assignment={0: "bold"})
    with pytest.raises(DecisionError, match="not a harness of island"):
        validate_decision(_ok(speciate=[{"from_island": 0, "harness_id": "zz", "mutator": "bold"}]), **V,
                          harnesses={0: ["aa"]})
    with pytest.raises(DecisionError, match="unknown task ids"):
        validate_decision(_ok(curriculum={"tasks": ["nope"]}), **V, tasks=["t1"])


# --- offline rules ---------------------------------------------------------------------

def _summary(j, *, acc, behavior, recent=(), nodes=None, stall=0):
    best = {"node_id": f"b{j}", "harness_id": f"h{j}", "accuracy": acc, "val_accuracy": acc, "behavior": behavior}
    return {"island": j, "stall": stall, "best": best, "recent": list(recent),
            "nodes": nodes if nodes is not None else [dict(best, is_root=True)], "admitted": [best]}


def _state(islands, trigger=0, **kw):
    s = {"trigger": trigger, "islands": islands, "assignment": {str(i["island"]): "bold" for i in islands},
         "pool": ["bold", "sloppy", "conservative"], "search_tasks": ["t1", "t2", "t3", "t4"],
         "task_pool": ["t1", "t2", "t3", "t4", "t5", "t6"], "regret": {"t1": 0.5, "t2": 0.0, "t3": 0.3, "t4": 0.0},
         "max_moves": 2, "mutator_stats": {}}
    s.update(kw)
    return s


def _rej(n):
    return [{"node_id": f"0-{i}", "admitted": False, "mutation": f"m{i}", "reason": "dominated"} for i in range(n)]


def _decide(state, md=""):
    d = OfflineOrchestrator().decide(md, state, seed=1).output
    return validate_decision(d, islands=[s["island"] for s in state["islands"]], mutators=state["pool"],
                             assignment={int(k): v for k, v in state["assignment"].items()})


def test_exhausted_lineage_grafts_from_the_island_that_solves_its_failures():
    st = _state([
        _summary(0, acc=0.3, behavior={"t1": 0.0, "t2": 0.0, "t3": 1.0, "t4": 0.2}, recent=_rej(3)),
        _summary(1, acc=0.6, behavior={"t1": 1.0, "t2": 1.0, "t3": 0.2, "t4": 0.2}),
    ])
    d = _decide(st)
    assert d["kind"] == "exhausted_lineage"
    assert d["recombine"] == [{"dest_island": 0, "donor_island": 1, "why": d["recombine"][0]["why"]}]


def test_crowded_out_niche_is_speciated():
    nodes = [
        {"node_id": "b0", "harness_id": "h0", "is_root": True, "behavior": {"t1": 1, "t2": 1, "t3": 0, "t4": 0}},
        {"node_id": "0-2", "harness_id": "hx", "is_root": False, "behavior": {"t1": 0, "t2": 0, "t3": 1, "t4": 1}},
    ]
    st = _state([_summary(0, acc=0.5, behavior={"t1": 1, "t2": 1, "t3": 0, "t4": 0}, nodes=nodes,
                          recent=[{"node_id": "0-3", "admitted": True, "mutation": "x", "reason": ""}]),
                 _summary(1, acc=0.2, behavior={"t1": 0, "t2": 0, "t3": 0, "t4": 0.8})])
    d = _decide(st)
    assert d["kind"] == "crowded_out_niche"
    assert d["speciate"][0]["harness_id"] == "0-2" and d["speciate"][0]["mutator"] != "bold"


def test_dry_mutator_is_reassigned():
    st = _state([_summary(0, acc=0.5, behavior={"t1": 1, "t2": 0, "t3": 0.5, "t4": 0.5}, recent=_rej(3)),
                 _summary(1, acc=0.2, behavior={"t1": 0.5, "t2": 0, "t3": 0.5, "t4": 0})])
    d = _decide(st)
    assert d["kind"] == "dry_mutator"
    assert d["reassign"][0]["island"] == 0 and d["reassign"][0]["mutator"] != "bold"


def test_whole_population_plateau_revises_curriculum_toward_regret():
    st = _state([_summary(0, acc=0.50, behavior={"t1": 1, "t2": 0, "t3": 1, "t4": 0}),
                 _summary(1, acc=0.51, behavior={"t1": 1, "t2": 0, "t3": 1, "t4": 0.04})])
    d = _decide(st)
    assert d["kind"] == "population_plateau"
    tasks = d["curriculum"]["tasks"]
    assert tasks[:2] == ["t1", "t3"]  # highest regret first
    assert set(tasks[2:]) <= {"t5", "t6", "t2", "t4"} and len(tasks) == 4


def test_repeated_rejected_edit_read_from_snapshot_adds_reassign():
    md = "\n".join([
        "### Island 0",
        "- [0-1] depth 1 · mutation | mutation: add verifier | verdict: rejected (dominated)",
        "- [0-2] depth 1 · mutation | mutation: other | verdict: admitted",
        "- [0-3] depth 1 · mutation | mutation: add verifier | verdict: rejected (dominated)",
    ])
    st = _state([
        _summary(0, acc=0.3, behavior={"t1": 0.0, "t2": 0.0, "t3": 1.0, "t4": 0.2},
                 recent=[{"node_id": "0-2", "admitted": True, "mutation": "other", "reason": ""}]),
        _summary(1, acc=0.6, behavior={"t1": 1.0, "t2": 1.0, "t3": 0.2, "t4": 0.2}),
    ])
    d = _decide(st, md)
    # Not exhausted (an admission happened recently) and no niche: dry, reading the repeat from the markdown.
    assert d["kind"] == "dry_mutator"
    assert "add verifier" in d["diagnosis"]


def test_decisions_never_exceed_max_moves():
    st = _state([_summary(0, acc=0.50, behavior={"t1": 0, "t2": 0, "t3": 1, "t4": 0}, recent=_rej(3)),
                 _summary(1, acc=0.51, behavior={"t1": 1, "t2": 1, "t3": 0, "t4": 0})], max_moves=1)
    d = OfflineOrchestrator().decide("", st, seed=3).output
    assert count_moves(d) <= 1
