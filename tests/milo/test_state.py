"""MILO's state is a pure projection of its typed events (no Ray, no store): the same
stored events always rebuild the same state, every event survives its JSON payload,
and a kind nobody registered is refused, not skipped."""

from __future__ import annotations

import copy
import json

import pytest

from milo_helpers import fitness, node
from milo_ray.milo.events import (EVENT_TYPES, MILO_EVENTS, CurriculumChanged, Decision, DecisionInvalid, HeldOut, Init,
                                  InterventionDone, IslandFounded, MiloEvent, MoveDone, MoveFailed, NodeRecorded,
                                  Progress, Reassign, Refit, RoleBudget, SeedScore, Step, Stopped, Summarized,
                                  UnknownEvent, decode)
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.state import MiloState


def _n(node_id: str, **kw) -> LineageNode:
    return LineageNode.from_dict(node(node_id, **kw))


def stored_sequence() -> list[tuple[str, dict]]:
    """A small run as the events table stores it (kind, JSON payload): two islands,
    a rejected and an admitted child, a held-out gain, an intervention that reassigns,
    speciates and changes the curriculum (with a re-fit), a lock-step step, a role cap."""
    events: list[MiloEvent] = [
        Init(search_tasks=["t1", "t2"], val_tasks=["v1"], task_pool=["t1", "t2", "t3"], islands=[0, 1],
             assignment={0: "bold", 1: "bold"},
             seeds=[SeedScore("a", "ha", 0.4, fitness(0.4), {"output_tokens": 1e5, "seconds": 600.0}),
                    SeedScore("b", "hb", 0.6, fitness(0.6), {"output_tokens": 1e5, "seconds": 600.0}),
                    SeedScore("c", "hc", 0.5, fitness(0.5), {"output_tokens": 1e5, "seconds": 600.0})],
             members={0: [("s0-a", 0)], 1: [("s1-b", 1)]}),
        NodeRecorded(_n("s0-a", island=0, acc=0.4, harness_id="ha")),
        HeldOut(0, "s0-a", 0.3),
        NodeRecorded(_n("s1-b", island=1, acc=0.6, harness_id="hb")),
        HeldOut(1, "s1-b", 0.5),
        Step({0: 1, 1: 1}),
        NodeRecorded(_n("0-1", island=0, parent="s0-a", acc=0.2, admitted=False, round=1, mutator="bold")),
        Progress(0, 1, 1),
        NodeRecorded(_n("1-1", island=1, parent="s1-b", acc=0.7, round=1, mutator="bold")),
        HeldOut(1, "1-1", 0.6),
        Progress(1, 1, 0),
        NodeRecorded(_n("0-2", island=0, parent="0-1", acc=0.45, round=2, mutator="bold")),
        Decision("d0-1", 0, 1, {"diagnosis": "dry", "reassign": [{"island": 0, "mutator": "sloppy"}],
                                "speciate": [{"from_island": 0, "harness_id": "0-1", "mutator": "conservative"}],
                                "recombine": [], "curriculum": {"tasks": ["t2", "t3"]}}),
        Reassign(0, "sloppy", "d0-1"),
        MoveDone("d0-1", 0, "reassign"),
        IslandFounded(2, 0, "0-1", "conservative", "d0-1", 1),
        MoveDone("d0-1", 1, "speciate"),
        CurriculumChanged(1, ["t2", "t3"], "d0-1"),
        Refit(1, "s1-b", {"accuracy": 0.55, "behavior": {"t2": 0.5, "t3": 0.6}, "search_version": 1}),
        MoveDone("d0-1", 2, "curriculum"),
        InterventionDone("d0-1"),
        DecisionInvalid("d1-1", 1, 1, "unknown mutator 'x'", {"reassign": [{"island": 1, "mutator": "x"}]}),
        MoveFailed("d1-1", 0, "nothing to do"),
        RoleBudget("mutator", "run.budget.roles.mutator reached"),
        RoleBudget("mutator", "a second report of the same cap"),
        Stopped("mutator budget: run.budget.roles.mutator reached"),
    ]
    # Through JSON, as the events table stores payloads.
    return [(MILO_EVENTS.kind_of(e), json.loads(json.dumps(e.to_payload()))) for e in events]


def project(rows: list[tuple[str, dict]]) -> MiloState:
    state = MiloState()
    for kind, payload in rows:
        state.apply(decode(kind, payload))
    return state


def test_replaying_the_same_events_from_scratch_gives_equal_states():
    rows = stored_sequence()
    before = copy.deepcopy(rows)
    a, b = project(rows), project(rows)
    assert a.snapshot() == b.snapshot()
    assert rows == before, "applying events must not change them"
    # Applying the same decoded objects to two states (no re-decoding) agrees too.
    decoded = [decode(k, p) for k, p in rows]
    c, d = MiloState(), MiloState()
    for e in decoded:
        c.apply(e)
    for e in decoded:
        d.apply(e)
    assert c.snapshot() == d.snapshot() == a.snapshot()


def test_the_projection_is_what_the_events_say():
    s = project(stored_sequence())
    assert s.assignment == {0: "sloppy", 1: "bold", 2: "conservative"}
    # Speciate moved 0-1 and its child 0-2 to island 2; its root is admitted there.
    assert [n.node_id for n in s.islands[0].nodes()] == ["s0-a"]
    assert [n.node_id for n in s.islands[2].nodes()] == ["0-1", "0-2"]
    assert isinstance(s.node("0-2"), LineageNode) and s.node("0-2").island == 2 and s.node("0-1").admitted
    assert s.recorded["0-1"].island == 0 and not s.recorded["0-1"].admitted  # as its milo.node recorded it
    assert s.val_gain == {"s0-a": True, "s1-b": True, "1-1": True}
    assert s.progress == {0: (1, 1), 1: (1, 0), 2: (0, 0)}
    assert (s.version, s.search_tasks) == (1, ["t2", "t3"])
    assert s.node("s1-b").accuracy == 0.55 and s.node("s1-b").search_version == 1
    assert s.moves_done == {"d0-1": {0, 1, 2}} and s.decisions_done == {"d0-1"}
    assert s.last_intervention == {0: 1, 1: 1}
    assert s.speciations == {("d0-1", 1): (2, "0-1")}
    assert s.mutator_stats == {"bold": {"children": 3, "admitted": 2}}
    assert s.last_step == {0: 1, 1: 1}
    assert s.exhausted_roles == {"mutator": "run.budget.roles.mutator reached"}  # the first report stands


@pytest.mark.parametrize("kind", sorted(EVENT_TYPES))
def test_every_event_kind_round_trips_through_its_payload(kind):
    examples = {k: decode(k, p) for k, p in stored_sequence()}
    examples["milo.summary"] = Summarized({"method": "milo", "islands": {"0": {"rounds": 3}}})
    e = examples[kind]
    payload = json.loads(json.dumps(e.to_payload()))
    assert type(e).from_payload(payload) == e
    assert decode(kind, payload) == e
    assert json.loads(json.dumps(decode(kind, payload).to_payload())) == payload


def test_payload_keys_are_the_stored_format():
    # Run directories written before the typed events read back unchanged.
    assert MoveDone("d", 1, "speciate").to_payload() == {"decision_id": "d", "index": 1, "kind": "speciate"}
    assert Step({0: 2}).to_payload() == {"rounds": {"0": 2}}
    legacy_island = {"island": 3, "from_island": 0, "node_id": "0-4", "mutator": "bold", "decision_id": "d0-4"}
    assert decode("milo.island", legacy_island).index is None
    legacy_init = {"search_tasks": ["t"], "val_tasks": ["v"], "task_pool": ["t"], "islands": [0],
                   "assignment": {"0": "bold"}}
    assert decode("milo.init", legacy_init) == Init(["t"], ["v"], ["t"], [0], {0: "bold"})


def test_an_unknown_event_kind_is_a_clear_error():
    with pytest.raises(UnknownEvent, match=r"'milo\.teleport'.*known: .*milo\.node"):
        decode("milo.teleport", {"island": 0})
    with pytest.raises(ValueError, match=r"'milo\.progress': malformed payload"):
        decode("milo.progress", {"island": 0})

    class Teleport(MiloEvent):
        kind = "milo.teleport"

        def to_payload(self):
            return {}

        @classmethod
        def from_payload(cls, p):
            return cls()

    with pytest.raises(TypeError, match="no handler for Teleport"):
        MiloState().apply(Teleport())


def test_a_refit_of_an_unknown_field_is_refused():
    with pytest.raises(ValueError, match="not LineageNode fields"):
        Refit(0, "n", {"acuracy": 0.5})
