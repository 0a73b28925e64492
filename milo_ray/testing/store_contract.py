"""The RunStore contract suite (DESIGN §5.4): every backend passes these tests.

It lives in the package so any future backend can reuse it. A backend's test module
subclasses ``RunStoreContract`` and supplies a ``backend`` fixture (see
``tests/store/test_contract.py``): ``backend.new(**kw)`` makes an empty store,
``backend.reopen(store)`` closes it and opens the same run again (the in-memory
store, which has no persistence, keeps the same object).
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import duckdb
import pyarrow as pa
import pytest

from milo_ray import redaction
from milo_ray.core.rollouts import RolloutResult
from milo_ray.store.base import TABLES, RunStore
from milo_ray.store.core import StoreClosed
from milo_ray.store.schema import SCHEMAS, SCHEMA_VERSION


def make_result(i: int, *, harness="h0", error_kind=None, trace=True, score=None) -> RolloutResult:
    return RolloutResult(
        harness_id=harness,
        task_id=f"task-{i % 7}",
        rollout_idx=i,
        score=(i % 4) / 3 if score is None else score,
        input_tokens=100 + i,
        output_tokens=10 + i,
        cost_usd=0.001 * i,
        latency_s=1.5 + i,
        timed_out=i % 5 == 0,
        error_kind=error_kind,
        error=None if error_kind is None else f"{error_kind} failure {i}",
        trace={"trajectory": {"steps": [f"step {j}" for j in range(3)], "i": i}, "ctrf": {"passed": i % 3}}
        if trace else None,
        method="milo",
        round=i // 10,
        stage="search",
        split="search",
        node="node-a",
        started_at=1000.0 + i,
        finished_at=1001.5 + i,
        cache_key=f"key-{harness}-{i}",
        attempts=1 + (i % 2),
    )


def full_rows() -> dict[str, list[dict]]:
    """One fully populated row per non-rollout table (floats exactly representable in float32)."""
    return {
        "harnesses": [
            dict(harness_id="h1", name="stock", island=2, parent_id="h0", co_parent_id="h9", round=3,
                 origin="graft", mutator="offline-bold", evidence_scale=20, admitted=True,
                 verdict_reason="not dominated", fitness=[0.5, 0.75, 0.25], delta_hv=0.125,
                 diff_added=12, diff_deleted=4, source_ref="ab" * 32, validation_error=None,
                 created_at=1234.5, extra='{"note":"x"}'),
        ],
        "experience": [
            dict(task_id="t1", round=1, harness_id="h1", w=0.5, a=0.25, u=1.0, q=0.25,
                 summary="ran out of time", suggestions=["add a deadline check", "plan first"],
                 embedding=[0.5, -0.25, 0.0], embedder="BAAI/bge-large-en-v1.5", judge_error=None, trace_ref="cd" * 32),
        ],
        "agent_calls": [
            dict(run_id="r1", call_id="mutate:i0:r3", role="mutator", agent="offline-bold", model="m1", island=0,
                 candidate=None, round=3, input_tokens=1200, output_tokens=300, cost_usd=None, latency_s=2.5,
                 retries=1, error=None, time=1234.5),
        ],
    }


def rows_without_seq_time(table: pa.Table) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("seq", "time")} for r in table.to_pylist()]


def multiset(table: pa.Table) -> Counter:
    return Counter(repr(sorted(r.items())) for r in table.to_pylist())


class RunStoreContract:
    """Subclasses provide the ``backend`` fixture."""

    def test_store_satisfies_the_protocol(self, backend):
        store = backend.new()
        assert isinstance(store, RunStore)
        assert isinstance(store.run_id, str) and store.run_id

    def test_rollouts_round_trip_with_traces_moved_to_blobs(self, backend):
        store = backend.new()
        results = [make_result(i) for i in range(12)]
        traces = [r.trace for r in results]
        store.append_rollouts(results)
        for r, trace in zip(results, traces):
            assert r.trace is None and r.trace_ref
            assert store.get_blob(r.trace_ref) == trace
        rows = store.read("rollouts").to_pylist()
        assert rows == [{**r.row(), "run_id": store.run_id} for r in results]
        assert [row["resolved"] for row in rows] == [r.score >= 1.0 for r in results]

    def test_every_table_round_trips(self, backend):
        store = backend.new()
        for table, rows in full_rows().items():
            store.append(table, rows)
            assert store.read(table).to_pylist() == rows
        store.event("stall", {"island": 2, "count": 3}, round=4, island=2, harness_id="h1")
        (ev,) = store.read("events").to_pylist()
        assert (ev["kind"], ev["round"], ev["island"], ev["harness_id"]) == ("stall", 4, 2, "h1")
        assert ev["payload"] == '{"count":3,"island":2}' and ev["time"] > 0

    def test_missing_nullable_columns_read_as_null(self, backend):
        store = backend.new()
        store.append("harnesses", [{"harness_id": "h1"}])
        (row,) = store.read("harnesses").to_pylist()
        assert row["harness_id"] == "h1"
        assert all(v is None for k, v in row.items() if k != "harness_id")

    def test_unknown_column_is_rejected_by_name_and_nothing_is_written(self, backend):
        store = backend.new()
        with pytest.raises(ValueError, match="'colour'"):
            store.append("harnesses", [{"harness_id": "ok"}, {"harness_id": "h2", "colour": "red"}])
        assert store.read("harnesses").num_rows == 0

    def test_bad_values_are_rejected_naming_the_column(self, backend):
        store = backend.new()
        with pytest.raises(ValueError, match="harnesses.round"):
            store.append("harnesses", [{"harness_id": "h", "round": 1.5}])
        with pytest.raises(ValueError, match="harnesses.harness_id"):
            store.append("harnesses", [{"name": "no id"}])
        with pytest.raises(ValueError, match="rollouts.error_kind"):
            store.append_rollouts([make_result(0, error_kind="oops")])
        with pytest.raises(ValueError, match="unknown table"):
            store.append("nope", [{}])
        with pytest.raises(ValueError, match="events.seq"):
            store.append("events", [{"kind": "x", "seq": 3}])
        for table in TABLES:
            assert store.read(table).num_rows == 0

    def test_read_includes_rows_not_yet_flushed(self, backend):
        store = backend.new(flush_rows=10_000, flush_seconds=None)
        store.append_rollouts([make_result(i) for i in range(3)])
        store.event("x")
        assert store.read("rollouts").num_rows == 3
        assert store.read("events").num_rows == 1

    def test_read_carries_schema_version(self, backend):
        store = backend.new()
        store.append_rollouts([make_result(0)])
        for table in TABLES:
            data = store.read(table)
            assert data.schema.metadata[b"schema_version"] == str(SCHEMA_VERSION).encode()
            assert data.schema.remove_metadata() == SCHEMAS[table].remove_metadata()

    def test_completed_keys_exclude_infra_failures(self, backend):
        store = backend.new()
        store.append_rollouts([make_result(0), make_result(1, error_kind="infra"),
                               make_result(2, error_kind="harness"), make_result(3, error_kind="task")])
        assert store.completed_keys() == {"key-h0-0", "key-h0-2", "key-h0-3"}
        keys = store.completed_keys()
        keys.add("mutated")  # a copy: the caller cannot corrupt the store's set
        assert "mutated" not in store.completed_keys()

    def test_get_rollouts_serves_the_last_completed_row_per_key(self, backend):
        store = backend.new()
        first = make_result(1, error_kind="infra")
        retried = make_result(1, score=1.0)
        other = make_result(2)
        store.append_rollouts([first, other])
        store.append_rollouts([retried])
        got = store.get_rollouts(["key-h0-1", "key-h0-2", "missing"])
        assert set(got) == {"key-h0-1", "key-h0-2"}
        assert got["key-h0-1"] == RolloutResult(**{**vars(retried), "run_id": store.run_id})
        assert got["key-h0-2"].trace_ref == other.trace_ref and got["key-h0-2"].trace is None
        assert store.get_rollouts([]) == {}

    def test_event_seq_strictly_increases_across_reopen(self, backend):
        store = backend.new()
        store.event("a")
        store.append("events", [{"kind": "b"}, {"kind": "c", "payload": {"x": [1, 2]}}])
        store = backend.reopen(store)
        store.event("d")
        events = store.read("events").to_pylist()
        assert [e["seq"] for e in events] == [0, 1, 2, 3]
        assert [e["kind"] for e in events] == ["a", "b", "c", "d"]

    def test_rows_and_completed_keys_survive_reopen(self, backend):
        store = backend.new()
        store.append_rollouts([make_result(i) for i in range(5)] + [make_result(5, error_kind="infra")])
        for table, rows in full_rows().items():
            store.append(table, rows)
        before = {t: store.read(t) for t in TABLES}
        keys = store.completed_keys()
        store = backend.reopen(store)
        assert store.completed_keys() == keys
        for t in TABLES:
            assert store.read(t).equals(before[t])
        store.append_rollouts([make_result(6)])
        assert store.completed_keys() == keys | {"key-h0-6"}
        assert store.read("rollouts").num_rows == 7

    def test_concurrent_appends_from_many_threads_lose_nothing(self, backend):
        store = backend.new(flush_rows=37)
        n_threads, per_thread = 8, 60
        barrier = threading.Barrier(n_threads)

        def work(t):
            barrier.wait()
            for i in range(per_thread):
                store.append_rollouts([make_result(i, harness=f"h{t}")])
                store.event("tick", {"t": t, "i": i})
                if i % 20 == 0:
                    store.flush()

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        total = n_threads * per_thread
        rollouts = store.read("rollouts")
        assert rollouts.num_rows == total
        assert len(set(rollouts["cache_key"].to_pylist())) == total
        assert len(store.completed_keys()) == total
        assert sorted(store.read("events")["seq"].to_pylist()) == list(range(total))
        store = backend.reopen(store)
        assert store.read("rollouts").num_rows == total

    def test_compaction_preserves_rows(self, backend):
        store = backend.new(flush_rows=3)
        store.append_rollouts([make_result(i) for i in range(10)])
        for i in range(7):
            store.event("e", {"i": i})
        for table, rows in full_rows().items():
            store.append(table, rows * 4)
        before = {t: store.read(t) for t in TABLES}
        keys = store.completed_keys()
        store.compact()
        for t in TABLES:
            assert multiset(store.read(t)) == multiset(before[t])
        assert store.completed_keys() == keys
        store.compact()  # idempotent
        store.append_rollouts([make_result(10)])
        store = backend.reopen(store)
        assert store.read("rollouts").num_rows == 11
        assert multiset(store.read("events")) == multiset(before["events"])

    def test_blobs_round_trip_every_type_and_dedupe(self, backend):
        store = backend.new()
        values = [b"\x00raw bytes", "text é", {"b": [1, 2.5, None], "a": {"x": True}}, [1, "two", {"3": 3}]]
        refs = [store.put_blob(v) for v in values]
        assert len(set(refs)) == len(values)
        for v, ref in zip(values, refs):
            got = store.get_blob(ref)
            assert got == v and type(got) is type(v)
        assert store.put_blob({"a": {"x": True}, "b": [1, 2.5, None]}) == refs[2]  # key order irrelevant
        assert store.put_blob("x") != store.put_blob(b"x")
        with pytest.raises(KeyError):
            store.get_blob("0" * 64)
        with pytest.raises(ValueError):
            store.get_blob("not-a-ref")
        with pytest.raises(TypeError):
            store.put_blob(3.14)
        ref = refs[2]
        store = backend.reopen(store)
        assert store.get_blob(ref) == values[2]

    def test_harness_source_round_trips(self, backend):
        store = backend.new()
        files = {"harness.py": "def build_agent(model, backend):\n    return None\n", "prompts/system.md": "Be careful."}
        ref = store.put_harness_source(files)
        assert store.get_blob(ref) == files
        assert store.put_harness_source(dict(reversed(list(files.items())))) == ref
        with pytest.raises(ValueError):
            store.put_harness_source({"harness.py": 3})

    def test_manifest_round_trips_and_is_replaced(self, backend):
        store = backend.new()
        assert store.read_manifest() == {}
        store.write_manifest({"status": "running", "seeds": [1, 2]})
        assert store.read_manifest() == {"run_id": store.run_id, "status": "running", "seeds": [1, 2]}
        store.write_manifest({"status": "done"})
        store = backend.reopen(store)
        assert store.read_manifest() == {"run_id": store.run_id, "status": "done"}
        with pytest.raises(ValueError):
            store.write_manifest({"bad": object()})

    def test_duckdb_queries_the_tables(self, backend):
        store = backend.new()
        store.append_rollouts([make_result(i) for i in range(9)])
        rollouts = store.read("rollouts")  # noqa: F841  (DuckDB finds it by name)
        ((n, mean),) = duckdb.sql("select count(*), avg(score) from rollouts").fetchall()
        assert n == 9
        assert mean == pytest.approx(sum(make_result(i).score for i in range(9)) / 9)

    def test_writes_after_close_raise(self, backend):
        store = backend.new()
        store.append_rollouts([make_result(0)])
        store.close()
        store.close()  # idempotent
        with pytest.raises(StoreClosed):
            store.append_rollouts([make_result(1)])
        with pytest.raises(StoreClosed):
            store.event("late")
        assert store.read("rollouts").num_rows == 1

    def test_registered_secrets_are_redacted_from_every_write(self, backend):
        """Rows (top-level and nested payloads), rollout errors and traces, blobs of every
        type and the manifest never keep a registered key value, in any backend; a value
        shorter than MIN_SECRET_CHARS is left alone."""

        canary = "sk-canary-" + "7f3a" * 6
        quoted = 'sk-"quoted\\canary-0123456789'
        redaction.clear()
        redaction.register({"MILO_TEST_KEY": canary, "MILO_QUOTED_KEY": quoted, "MILO_SHORT_KEY": "abc"})
        try:
            store = backend.new()
            leaky = make_result(0, error_kind="harness")
            leaky.error = f"provider said: invalid key {canary}"
            leaky.trace = {"trajectory": {"steps": [f"echo {canary}", {"k": quoted}], canary: 1}}
            store.append_rollouts([leaky])
            store.event("leak", {"nested": [{"text": f"key={canary}"}], "short": "abc"})
            refs = [store.put_blob(f"x {canary} y"), store.put_blob(canary.encode()), store.put_blob([quoted]),
                    store.put_harness_source({"harness.py": f"KEY = {canary!r}\n"})]
            store.write_manifest({"config": {"env": canary}})
            store = backend.reopen(store)
            seen = [repr(store.read(t).to_pylist()) for t in TABLES]
            seen += [repr(store.get_blob(r)) for r in refs + [store.read("rollouts")["trace_ref"][0].as_py()]]
            seen.append(repr(store.read_manifest()))
            text = "\n".join(seen)
            assert canary not in text and "quoted\\\\canary" not in text and "quoted\\canary" not in text
            assert redaction.marker("MILO_TEST_KEY") in text and redaction.marker("MILO_QUOTED_KEY") in text
            payload = store.read("events").to_pylist()[-1]["payload"]
            payload = json.loads(payload) if isinstance(payload, str) else payload
            assert payload["short"] == "abc"  # too short to be a secret: kept
            root = getattr(store, "root", None)
            if root is not None:  # a backend with files: not one of them holds the value
                import zstandard
                from pathlib import Path

                for path in Path(root).rglob("*"):
                    if path.is_file():
                        data = path.read_bytes()
                        if path.suffix == ".zst":
                            data = zstandard.ZstdDecompressor().decompress(data)
                        assert canary.encode() not in data, path
        finally:
            redaction.clear()
