"""A result that carries untrusted text is stored sanitised, and one that still cannot be
encoded becomes its rollout's harness failure: never a failed write that takes the batch,
the rows buffered before it, or the run with it."""

from __future__ import annotations

import json

import pytest

from milo_ray.store import MemoryRunStore, ParquetRunStore
from milo_ray.testing.store_contract import make_result


@pytest.fixture(params=["memory", "parquet"])
def stores(request, tmp_path):
    """(a new store, a function that closes it and opens the run again)."""
    if request.param == "memory":
        store = MemoryRunStore(run_id="mem")
        yield store, lambda: store
        return
    # Large flush thresholds: the earlier rows are still buffered when the bad batch comes.
    store = ParquetRunStore(tmp_path / "run", flush_rows=10_000, flush_seconds=None)
    opened = [store]

    def reopen():
        opened[-1].close()
        opened.append(ParquetRunStore(tmp_path / "run"))
        return opened[-1]

    yield store, reopen
    opened[-1].close()


def test_untrusted_text_in_a_result_is_stored_sanitised(stores):
    store, reopen = stores
    bad = make_result(1, error_kind="harness")
    bad.error = "cannot open caf\udce9.txt\x00: \ud800"
    bad.trace = {"trajectory": {"steps": [{"content": "answer \udcff\x00" + "y" * (3 << 20)}], "file\udcfe": 1}}
    store.append_rollouts([make_result(0), bad, make_result(2)])
    store = reopen()
    rows = {r["rollout_idx"]: r for r in store.read("rollouts").to_pylist()}
    assert sorted(rows) == [0, 1, 2]
    assert rows[1]["error"] == "cannot open caf\\xe9.txt\\x00: \ufffd" and rows[1]["error_kind"] == "harness"
    trace = store.get_blob(rows[1]["trace_ref"])
    content = trace["trajectory"]["steps"][0]["content"]
    assert content.startswith("answer \\xff\\x00yyy") and content.endswith(f"[... {15 + (3 << 20) - (1 << 20)} "
                                                                            "characters cut]")
    assert "file\\xfe" in trace["trajectory"]


def test_a_result_that_cannot_be_encoded_is_its_rollouts_harness_failure(stores):
    store, reopen = stores
    store.append_rollouts([make_result(0), make_result(1)])  # buffered, not yet written
    huge = make_result(2)
    huge.output_tokens = 2**70  # not an int64
    unjsonable = make_result(3)
    unjsonable.trace = {"steps": [object()]}
    batch = [huge, make_result(4), unjsonable]
    store.append_rollouts(batch)
    assert huge.score == 0 and huge.error_kind == "harness" and "could not be stored" in huge.error
    store = reopen()
    rows = {r["rollout_idx"]: r for r in store.read("rollouts").to_pylist()}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    for i in (2, 3):
        assert rows[i]["score"] == 0 and rows[i]["error_kind"] == "harness"
        assert rows[i]["error"].startswith("the rollout's result could not be stored") and rows[i]["trace_ref"] is None
    assert rows[2]["output_tokens"] == 0 and rows[3]["output_tokens"] == make_result(3).output_tokens
    assert rows[4] == {**make_result(4).row(), "trace_ref": rows[4]["trace_ref"], "run_id": store.run_id}
    assert {r.cache_key for r in batch} <= store.completed_keys() | {""}


def test_an_invalid_tool_call_count_past_int64_is_stored_as_not_counted(stores):
    store, reopen = stores
    huge = make_result(0)
    huge.invalid_tool_calls = 2**70
    store.append_rollouts([huge, make_result(1)])
    store = reopen()
    rows = {r["rollout_idx"]: r for r in store.read("rollouts").to_pylist()}
    assert rows[0]["invalid_tool_calls"] is None and rows[0]["error_kind"] == "harness"
    assert rows[1] == {**make_result(1).row(), "trace_ref": rows[1]["trace_ref"], "run_id": store.run_id}


def test_child_records_and_events_store_untrusted_text_sanitised(stores):
    """A mutator's output reaches the harnesses and events tables (a rejected child's
    reason, a validator's message naming a file): every table's strings pass the same
    sanitiser, nested payloads included."""
    store, reopen = stores
    reason = "mutator crashed: OSError: " + "bad name " + "\udcff\x00" + "v" * (2 << 20)
    store.append("harnesses", [{"harness_id": "h1", "validation_error": "SyntaxError in n\udce9w.py",
                                "verdict_reason": reason}])
    store.event("mutation_failed", {"error": reason, "files": ["\ud800.py"]})
    store = reopen()
    (row,) = store.read("harnesses").to_pylist()
    assert row["validation_error"] == "SyntaxError in n\\xe9w.py"
    assert row["verdict_reason"].startswith("mutator crashed: OSError: bad name \\xff\\x00v")
    assert row["verdict_reason"].endswith("characters cut]")
    (ev,) = store.read("events").to_pylist()
    payload = json.loads(ev["payload"])
    assert payload["files"] == ["\ufffd.py"] and "\\xff\\x00" in payload["error"]
