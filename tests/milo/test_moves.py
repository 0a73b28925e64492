"""Orchestrator moves are typed objects with one handler each: a decision becomes its
moves in application order, each applied by its own handler and recorded by its kind."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from milo_ray.agents.orchestrators.schema import DECISION_SCHEMA
from milo_ray.milo.events import InterventionDone, MoveDone, Reassign
from milo_ray.milo.moves import MOVES, CurriculumMove, GraftMove, ReassignMove, SpeciateMove, moves_of
from milo_ray.milo.orchestrator import apply_decision

DECISION = {
    "diagnosis": "x",
    "curriculum": {"tasks": ["t1", "t2"], "why": "regret"},
    "recombine": [{"dest_island": 1, "donor_island": 0, "why": "borrow"}, {"dest_island": 0, "donor_island": 1}],
    "speciate": [{"from_island": 0, "harness_id": "n3", "mutator": "bold"}],
    "reassign": [{"island": 0, "mutator": "a"}, {"island": 1, "mutator": "b"}],
}


def test_a_decision_becomes_typed_moves_in_application_order():
    moves = moves_of(DECISION)
    assert moves == [ReassignMove(((0, "a"), (1, "b"))), SpeciateMove(0, "n3", "bold"), GraftMove(1, 0, "borrow"),
                     GraftMove(0, 1, ""), CurriculumMove(("t1", "t2"))]
    assert [m.kind for m in moves] == ["reassign", "speciate", "recombine", "recombine", "curriculum"]
    assert moves_of({"diagnosis": "nothing", "reassign": [], "speciate": [], "curriculum": None}) == []


def test_every_move_the_decision_schema_allows_has_a_move_class():
    assert {m.key for m in MOVES} == set(DECISION_SCHEMA["properties"]) - {"diagnosis", "kind", "loci"}


def _run(decision, done=()):
    emitted = []
    state = SimpleNamespace(decisions={"d0-2": SimpleNamespace(trigger=0, round=2, decision=decision)},
                            moves_done={"d0-2": set(done)})
    run = SimpleNamespace(state=state, stop=False, emit=lambda e, **kw: emitted.append((e, kw)))
    asyncio.run(apply_decision(run, "d0-2"))
    return emitted


def test_each_move_is_applied_by_its_own_handler_and_recorded_by_its_kind():
    decision = {"diagnosis": "dry", "reassign": DECISION["reassign"]}
    assert _run(decision) == [
        (Reassign(0, "a", "d0-2"), {"island": 0, "round": 2}), (Reassign(1, "b", "d0-2"), {"island": 1, "round": 2}),
        (MoveDone("d0-2", 0, "reassign"), {"island": 0, "round": 2}), (InterventionDone("d0-2"), {"island": 0, "round": 2}),
    ]


def test_a_move_recorded_done_is_not_applied_again():
    decision = {"diagnosis": "dry", "reassign": DECISION["reassign"]}
    assert _run(decision, done={0}) == [(InterventionDone("d0-2"), {"island": 0, "round": 2})]
