"""SSR's typed events: payloads round-trip, bad payloads are named, the projection folds
a round's decisions, and a resumed judging round asks only for the missing records
with the inputs an uninterrupted round would have given."""

from __future__ import annotations

import json

import pytest

from milo_ray.core.rollouts import RolloutResult
from milo_ray.ssr import evidence as ev
from milo_ray.ssr.events import (
    REGISTRY, CandidateDrawn, Judged, RoundStarted, Selection, StageStarted, Summarized, parse,
)
from milo_ray.ssr.state import RecordedRun, ResumeDiverged, check_parent, check_stage

EXAMPLES = [
    RoundStarted(2, "p" * 16, 1, 40),
    Judged(0, "p" * 16, "t1", 0.5, False, 0.4, 0.9, 0.8, "s", ["a", "b"], "i", ["lax"], ["verifier"], "ref", None, 2),
    CandidateDrawn(1, "p" * 16, 3, 1, 8, 12345, "c" * 16, "blob", "minimal-c3", None, "report"),
    StageStarted(1, "p" * 16, 1, {"validation": ["v1"], "success": [], "failure": ["t2"]}, ["c", "p"], 8),
    Selection(0, "c" * 16, "p" * 16, "c" * 16, True, 2, "completed", 0.4, "c" * 16, 0.6, 16, {"c": 0.6, "p": 0.4}),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.kind)
def test_payload_round_trips_through_json(event):
    payload = json.loads(json.dumps(event.to_payload()))
    assert parse(event.kind, payload, **event.columns()) == event
    assert not set(event.to_payload()) & {"round", "harness_id"}  # those are table columns


def test_every_kind_is_registered_once():
    assert len(REGISTRY) == len({cls.kind for cls in REGISTRY.values()})
    assert parse("milo.summary", {"anything": 1}, round=0) is None  # another method's
    assert parse("ssr.summary", {"anything": 1}, round=0) == Summarized({"anything": 1}, round=0)


def test_a_payload_missing_or_adding_a_field_is_named():
    payload = RoundStarted(0, "p", 0, 0).to_payload()
    with pytest.raises(ValueError, match="ssr.round.*'stall'"):
        parse("ssr.round", {k: v for k, v in payload.items() if k != "stall"}, round=0, harness_id="p")
    with pytest.raises(ValueError, match=r"ssr.round.*\['bogus'\]"):
        parse("ssr.round", {**payload, "bogus": 1}, round=0, harness_id="p")


def _rows(events):
    return [{"seq": i, "kind": e.kind, "payload": json.dumps(e.to_payload()), **e.columns()}
            for i, e in enumerate(events)]


def test_projection_folds_a_round_and_rejects_a_diverging_replay():
    start, judged, drawn, stage = EXAMPLES[0], EXAMPLES[1], EXAMPLES[2], EXAMPLES[3]
    run = RecordedRun.from_rows(list(reversed(_rows([start, judged, drawn, stage]))))  # applied by seq
    assert run.round(2).started == start and run.round(0).judged == {"t1": judged}
    assert run.round(1).draws == {(3, 1): drawn} and run.round(1).stages == {1: stage}
    assert run.round(7).judged == {}  # nothing recorded
    check_parent(run.round(2), "p" * 16)
    with pytest.raises(ResumeDiverged, match="round 2"):
        check_parent(run.round(2), "q" * 16)
    other = StageStarted(1, "p" * 16, 1, {"validation": ["v2"], "success": [], "failure": ["t2"]}, ["c", "p"], 8)
    with pytest.raises(ResumeDiverged, match="stage 1"):
        check_stage(run.round(1), other)


def test_skipped_items_keep_the_whole_pool_in_the_judge_feedback():
    results = [RolloutResult("h", f"t{i}", 0, float(i % 2), trace={"trajectory": {"i": i}})
               for i in range(4)]
    every = ev.judge_items(results, store=None)
    rest = ev.judge_items(results, store=None, skip={"t0", "t2"})
    assert [it.task_id for it in rest] == ["t1", "t3"]
    assert [it.feedback for it in rest] == [it.feedback for it in every if it.task_id in ("t1", "t3")]
    assert rest[0].feedback["pool"]["tasks"] == 4
