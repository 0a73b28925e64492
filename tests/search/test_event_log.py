"""The shared event log: one codec for every event class (nested dataclasses, tuples,
int-keyed dicts, enums, renamed and optional keys, whole-payload events), the shared
events stored under each method's namespace, append-then-apply in one call, and a
write-once log that skips only what earlier sessions stored."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import pytest

from milo_ray.search.events import (Event, EventLog, EventTypes, RoleBudget, Stopped, Summarized, UnknownEvent,
                                    absent_when_none, canonical_payload, stored_as)
from milo_ray.store.memory import MemoryRunStore


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Point:
    x: int
    label: str = ""


@dataclass(frozen=True)
class Everything(Event):
    kind: ClassVar[str] = "toy.everything"
    column_fields: ClassVar[tuple[str, ...]] = ("round",)
    points: list[Point]
    by_island: dict[int, tuple[str, int]]
    color: Color
    move: str = stored_as("kind")
    note: str | None = absent_when_none()
    raw: Any = None
    round: int | None = None


TOY = EventTypes("toy", (Everything, RoleBudget, Stopped, Summarized))
EXAMPLE = Everything([Point(1, "a"), Point(2)], {0: ("n0", 3), 7: ("n7", 1)}, Color.BLUE, "speciate",
                     raw={"nested": [1, {"k": None}]}, round=4)


def test_the_codec_writes_plain_json_and_reads_back_the_typed_event():
    payload = EXAMPLE.to_payload()
    assert payload == {"points": [{"x": 1, "label": "a"}, {"x": 2, "label": ""}],
                       "by_island": {"0": ["n0", 3], "7": ["n7", 1]}, "color": "blue", "kind": "speciate",
                       "raw": {"nested": [1, {"k": None}]}}  # no "note": absent when None; round is a column
    assert EXAMPLE.columns() == {"round": 4}
    back = TOY.decode("toy.everything", json.loads(json.dumps(payload)), round=4)
    assert back == EXAMPLE
    assert isinstance(back.by_island[7], tuple) and isinstance(back.points[0], Point) and back.color is Color.BLUE
    assert TOY.decode("toy.everything", {**payload, "note": "n"}, round=4).note == "n"


def test_a_missing_or_unknown_field_is_named():
    payload = EXAMPLE.to_payload()
    with pytest.raises(ValueError, match="toy.everything.*'color' is missing"):
        TOY.decode("toy.everything", {k: v for k, v in payload.items() if k != "color"})
    with pytest.raises(ValueError, match=r"toy.everything.*\['bogus'\]"):
        TOY.decode("toy.everything", {**payload, "bogus": 1})
    with pytest.raises(UnknownEvent, match=r"'toy\.teleport'.*known: .*toy\.everything"):
        TOY.decode("toy.teleport", {})


def test_shared_events_are_stored_under_each_methods_namespace():
    assert TOY.kind_of(RoleBudget("judge", "cap")) == "toy.role_budget"
    assert EventTypes("other", (Stopped,)).kind_of(Stopped("done")) == "other.stop"
    assert Stopped("done").to_payload() == {"reason": "done"}  # the optional record fields are absent
    s = Summarized({"a": {"b": 1}}, round=2)
    assert s.to_payload() == {"a": {"b": 1}} and TOY.decode("toy.summary", {"a": {"b": 1}}, round=2) == s
    with pytest.raises(TypeError, match="not a registered toy event"):
        EventTypes("toy", (Everything,)).kind_of(Stopped("x"))
    with pytest.raises(ValueError, match="outside namespace"):
        EventTypes("milo", (Everything,))


def test_append_stores_the_row_then_applies_the_event_and_replay_reads_it_back():
    store, seen = MemoryRunStore(), []

    def apply(e):
        assert len(store.read("events").to_pylist()) == len(seen) + 1, "applied before its row was stored"
        seen.append(e)

    log = EventLog(store, TOY, apply=apply)
    log.append(EXAMPLE)
    log.append(RoleBudget("judge", "cap"), island=3)
    store.event("other.thing", {"x": 1})  # another namespace: not this log's
    (row0, row1, _) = sorted(store.read("events").to_pylist(), key=lambda r: r["seq"])
    assert (row0["kind"], row0["round"], row0["payload"]) == ("toy.everything", 4, canonical_payload(EXAMPLE.to_payload()))
    assert (row1["kind"], row1["island"]) == ("toy.role_budget", 3)
    assert seen == [EXAMPLE, RoleBudget("judge", "cap")]
    replayed = []
    assert EventLog(store, TOY).replay(replayed.append) == seen == replayed


def test_a_failed_write_applies_nothing():
    class Broken(MemoryRunStore):
        def event(self, *a, **k):
            raise OSError("disk full")

    seen = []
    with pytest.raises(OSError):
        EventLog(Broken(), TOY, apply=seen.append).append(EXAMPLE)
    assert seen == []


def test_write_once_skips_rows_of_earlier_sessions_only():
    store = MemoryRunStore()
    EventLog(store, TOY).append(EXAMPLE)
    seen = []
    log = EventLog(store, TOY, apply=seen.append, write_once=True)
    assert log.append(EXAMPLE) is False  # stored by the earlier session: applied, not written
    assert log.append(Stopped("done")) is True
    assert log.append(Stopped("done")) is True  # this session's own repeat is a new row
    assert [r["kind"] for r in store.read("events").to_pylist()] == ["toy.everything", "toy.stop", "toy.stop"]
    assert seen == [EXAMPLE, Stopped("done"), Stopped("done")]


def test_a_closing_record_is_written_once_even_when_a_killed_session_already_wrote_it():
    store = MemoryRunStore()
    EventLog(store, TOY).append(Summarized({"best": 0.8, "rows": [1, 2]}))  # the killed session got this far
    seen = []
    log = EventLog(store, TOY, apply=seen.append)
    assert log.append(Summarized({"best": 0.8, "rows": [1, 2]}), once=True) is False  # applied, not written
    assert log.append(Summarized({"best": 0.9, "rows": [1, 2]}), once=True) is True  # a different summary is new
    assert [json.loads(r["payload"])["best"] for r in store.read("events").to_pylist()] == [0.8, 0.9]
    assert len(seen) == 2


@dataclass(frozen=True)
class Abstract(Event):
    kind: ClassVar[str] = "toy.abstract"
    seq: "Sequence[tuple[int, ...]]" = ()
    table: "Mapping[int, Color]" = field(default_factory=dict)


def test_abstract_sequence_and_mapping_annotations_decode_too():
    e = Abstract(((1, 2), (3,)), {5: Color.RED})
    back = EventTypes("toy", (Abstract,)).decode("toy.abstract", json.loads(json.dumps(e.to_payload())))
    assert back == Abstract([(1, 2), (3,)], {5: Color.RED})
