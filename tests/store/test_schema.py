"""Row validation: what a store accepts, rejects and how it normalizes values."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from milo_ray.core.rollouts import RolloutResult
from milo_ray.store import schema
from milo_ray.store.base import TABLES


def test_every_contract_table_has_a_versioned_schema():
    assert set(schema.SCHEMAS) == set(TABLES)
    for table, sch in schema.SCHEMAS.items():
        assert sch.metadata[b"schema_version"] == str(schema.SCHEMA_VERSION).encode()
        assert sch.metadata[b"milo_ray.table"] == table.encode()


def test_rollout_rows_have_exactly_the_rollouts_columns():
    # A new RolloutResult field must get a column (or the store rejects every rollout).
    row = RolloutResult("h", "t", 0, 1.0).row()
    assert set(row) == set(schema.COLUMNS["rollouts"])
    assert {f.name for f in dataclasses.fields(RolloutResult)} - {"trace"} | {"resolved"} == set(row)


def test_integers_reject_fractions_and_bools():
    with pytest.raises(ValueError, match="harnesses.round"):
        schema.to_table("harnesses", [{"harness_id": "h", "round": 1.5}])
    with pytest.raises(ValueError, match="harnesses.island"):
        schema.to_table("harnesses", [{"harness_id": "h", "island": True}])
    t = schema.to_table("harnesses", [{"harness_id": "h", "round": 2.0, "island": np.int32(3)}])
    assert t.to_pylist()[0]["round"] == 2 and t.to_pylist()[0]["island"] == 3


def test_strings_and_bools_are_not_coerced():
    with pytest.raises(ValueError, match="rollouts.task_id"):
        schema.to_table("rollouts", [RolloutResult("h", 7, 0, 1.0).row()])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="harnesses.admitted"):
        schema.to_table("harnesses", [{"harness_id": "h", "admitted": 1}])
    with pytest.raises(ValueError, match="rollouts.score"):
        schema.to_table("rollouts", [{**RolloutResult("h", "t", 0, 1.0).row(), "score": "high"}])


def test_json_columns_encode_objects_canonically_and_check_strings():
    t = schema.to_table("events", [{"seq": 0, "time": 1.0, "kind": "k", "payload": {"b": 1, "a": np.float64(0.5)}}])
    assert t.to_pylist()[0]["payload"] == '{"a":0.5,"b":1}'
    t = schema.to_table("harnesses", [{"harness_id": "h", "extra": {"k": [1, 2]}}])
    assert json.loads(t.to_pylist()[0]["extra"]) == {"k": [1, 2]}
    with pytest.raises(ValueError, match="harnesses.extra"):
        schema.to_table("harnesses", [{"harness_id": "h", "extra": "{not json"}])
    with pytest.raises(ValueError, match="events.payload"):
        schema.to_table("events", [{"seq": 0, "time": 1.0, "kind": "k", "payload": {"x": object()}}])


def test_list_columns_accept_numpy_arrays():
    t = schema.to_table("experience", [{"task_id": "t", "embedding": np.array([0.5, 0.25], dtype=np.float32),
                                        "suggestions": ("a", "b")}])
    row = t.to_pylist()[0]
    assert row["embedding"] == [0.5, 0.25] and row["suggestions"] == ["a", "b"]
    t = schema.to_table("harnesses", [{"harness_id": "h", "fitness": np.array([0.1, 0.9])}])
    assert t.to_pylist()[0]["fitness"] == [0.1, 0.9]


def test_closed_vocabularies_are_enforced():
    with pytest.raises(ValueError, match="harnesses.origin"):
        schema.to_table("harnesses", [{"harness_id": "h", "origin": "crossover"}])
    for origin in schema.ORIGINS:
        schema.to_table("harnesses", [{"harness_id": "h", "origin": origin}])
    for kind in (None, *schema.ERROR_KINDS):
        schema.to_table("rollouts", [RolloutResult("h", "t", 0, 0.0, error_kind=kind).row()])


def test_long_error_messages_are_truncated():
    row = RolloutResult("h", "t", 0, 0.0, error_kind="harness", error="x" * 10_000).row()
    (stored,) = schema.to_table("rollouts", [row]).to_pylist()
    assert len(stored["error"]) == schema.ERROR_MAX_CHARS and stored["error"].endswith("…")


def test_rows_must_be_dicts():
    with pytest.raises(ValueError, match="rows are dicts"):
        schema.to_table("harnesses", [("h",)])  # type: ignore[list-item]
