"""Parquet-only guarantees: file layout, batching, DuckDB globs, compaction crash
safety, one writer, readers, schema evolution."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from milo_ray.store import ParquetRunStore, StoreClosed, open_run
from milo_ray.store.parquet import META_REPLACES
from milo_ray.store.schema import SCHEMA_VERSION, SCHEMAS
from milo_ray.testing.store_contract import full_rows, make_result, multiset


def parts(root, table):
    return sorted((root / table).glob("*.parquet"))


def duck_count(root, table) -> int:
    ((n,),) = duckdb.sql(f"select count(*) from '{root}/{table}/*.parquet'").fetchall()
    return n


@pytest.fixture
def store(tmp_path):
    s = ParquetRunStore(tmp_path / "run", flush_rows=50, flush_seconds=None)
    yield s
    s.close()


def test_every_part_file_carries_schema_version_and_table(store):
    store.append_rollouts([make_result(i) for i in range(120)])
    for table, rows in full_rows().items():
        store.append(table, rows)
    store.event("x")
    store.flush()
    for table in SCHEMAS:
        files = parts(store.root, table)
        assert files
        for f in files:
            meta = pq.read_schema(f).metadata
            assert meta[b"schema_version"] == str(SCHEMA_VERSION).encode()
            assert meta[b"milo_ray.table"] == table.encode()


def test_ten_thousand_rollouts_make_a_handful_of_files(tmp_path):
    with ParquetRunStore(tmp_path / "run", flush_rows=2000, flush_seconds=None) as store:
        for i in range(10_000):
            store.append_rollouts([make_result(i, trace=False)])
    files = parts(tmp_path / "run", "rollouts")
    assert len(files) == 5
    assert sum(pq.read_metadata(f).num_rows for f in files) == 10_000


def test_duckdb_glob_counts_each_row_once_before_and_after_compaction(store):
    for i in range(230):
        store.append_rollouts([make_result(i)])
    store.flush()
    assert len(parts(store.root, "rollouts")) == 5
    assert duck_count(store.root, "rollouts") == 230
    store.compact()
    assert len(parts(store.root, "rollouts")) == 1
    assert duck_count(store.root, "rollouts") == 230
    ((mean,),) = duckdb.sql(f"select avg(score) from '{store.root}/rollouts/*.parquet'").fetchall()
    assert mean == pytest.approx(sum(make_result(i).score for i in range(230)) / 230)


def test_age_based_flush_writes_without_an_explicit_flush(tmp_path):
    with ParquetRunStore(tmp_path / "run", flush_rows=10_000, flush_seconds=0.05) as store:
        store.event("lonely")
        deadline = time.monotonic() + 30  # generous: only the background flusher can make this file
        while not parts(store.root, "events") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(parts(store.root, "events")) == 1
        assert open_run(store.root).read("events").num_rows == 1


def test_leftover_tmp_files_are_ignored_then_cleaned_by_the_writer(store):
    store.append_rollouts([make_result(i) for i in range(60)])
    store.flush()
    good = parts(store.root, "rollouts")[0]
    junk = store.root / "rollouts" / f".{good.name[:-8]}-crashed.parquet.tmp"
    junk.write_bytes(good.read_bytes()[:100])  # a truncated write
    blob_junk = next((store.root / "blobs").iterdir()) / ".deadbeef.zst.abc.tmp"
    blob_junk.write_bytes(b"partial")
    assert open_run(store.root).read("rollouts").num_rows == 60
    assert duck_count(store.root, "rollouts") == 60
    store.close()
    reopened = ParquetRunStore(store.root)
    assert not junk.exists() and not blob_junk.exists()
    assert reopened.read("rollouts").num_rows == 60
    reopened.close()


def test_interrupted_compaction_never_double_counts(tmp_path, monkeypatch):
    root = tmp_path / "run"
    store = ParquetRunStore(root, flush_rows=20, flush_seconds=None)
    for i in range(100):
        store.append_rollouts([make_result(i)])
    for i in range(45):
        store.event("e", {"i": i})
    store.flush()
    before = {t: store.read(t) for t in ("rollouts", "events")}

    def crash(*_a, **_k):
        raise KeyboardInterrupt("killed between writing the merged part and removing the old ones")

    monkeypatch.setattr(store, "_remove_parts", crash)
    with pytest.raises(KeyboardInterrupt):
        store.compact()
    merged = [f for f in parts(root, "rollouts") if META_REPLACES in (pq.read_schema(f).metadata or {})]
    assert len(merged) == 1 and len(parts(root, "rollouts")) == 6  # old parts still present
    reader = open_run(root)
    assert multiset(reader.read("rollouts")) == multiset(before["rollouts"])
    assert reader.read("rollouts").num_rows == 100
    assert set(reader.completed_keys()) == set(before["rollouts"]["cache_key"].to_pylist())
    store.close()  # releases the writer lock; nothing is left to flush, so the state stays as the crash left it

    again = ParquetRunStore(root)  # the next writer finishes the compaction
    assert parts(root, "rollouts") == merged
    assert duck_count(root, "rollouts") == 100
    assert multiset(again.read("events")) == multiset(before["events"])
    again.close()


def test_a_second_writer_is_refused_until_the_first_closes(tmp_path):
    first = ParquetRunStore(tmp_path / "run")
    with pytest.raises(RuntimeError, match="is in use by pid"):
        ParquetRunStore(tmp_path / "run")
    first.close()
    second = ParquetRunStore(tmp_path / "run")
    second.close()


def test_reopening_with_another_run_id_is_refused(tmp_path):
    with ParquetRunStore(tmp_path / "run", run_id="alpha") as s:
        s.write_manifest({"status": "running"})
    with pytest.raises(ValueError, match="alpha"):
        ParquetRunStore(tmp_path / "run", run_id="beta")
    with ParquetRunStore(tmp_path / "run") as s:
        assert s.run_id == "alpha"
    assert open_run(tmp_path / "run").run_id == "alpha"


def test_run_id_defaults_to_directory_name(tmp_path):
    with ParquetRunStore(tmp_path / "2024-run-7") as s:
        s.append_rollouts([make_result(0)])
        assert s.run_id == "2024-run-7"
        assert s.read("rollouts")["run_id"].to_pylist() == ["2024-run-7"]


def test_reader_follows_a_live_writer_and_cannot_write(store):
    reader = open_run(store.root)
    assert reader.read("rollouts").num_rows == 0
    for i in range(60):  # 50 flushed, 10 buffered
        store.append_rollouts([make_result(i)])
    assert reader.read("rollouts").num_rows == 50
    assert len(reader.completed_keys()) == 50
    with pytest.raises(StoreClosed):
        reader.event("x")
    with pytest.raises(StoreClosed):
        reader.compact()
    with pytest.raises(FileNotFoundError):
        open_run(store.root / "missing")


def test_manifest_is_written_atomically_as_json(store):
    store.write_manifest({"status": "running", "seed": 3})
    assert json.loads((store.root / "manifest.json").read_text())["seed"] == 3
    assert not list(store.root.glob(".manifest.json*"))


def test_old_parts_without_a_newer_column_read_it_as_null(tmp_path):
    # A part written before ``attempts`` existed: schemas only grow, old files stay readable.
    root = tmp_path / "run"
    old_schema = pa.schema([f for f in SCHEMAS["rollouts"] if f.name != "attempts"], metadata=SCHEMAS["rollouts"].metadata)
    row = {k: v for k, v in make_result(0, trace=False).row().items() if k != "attempts"}
    (root / "rollouts").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), root / "rollouts" / "part-00000000-old.parquet")
    with ParquetRunStore(root) as store:
        store.append_rollouts([make_result(1, trace=False)])
        assert store.read("rollouts")["attempts"].to_pylist() == [None, make_result(1).attempts]
        got = store.get_rollouts([row["cache_key"]])[row["cache_key"]]
        assert got.attempts == 1  # the dataclass default stands in for the missing column
    assert open_run(root).read("rollouts")["attempts"].to_pylist() == [None, make_result(1).attempts]


def test_a_run_stored_before_the_invalid_tool_call_count_reads_it_as_not_counted(tmp_path):
    # Null, not 0: an older run never looked for invalid tool calls, so it cannot claim none.
    root = tmp_path / "run"
    old_schema = pa.schema([f for f in SCHEMAS["rollouts"] if f.name != "invalid_tool_calls"],
                           metadata=SCHEMAS["rollouts"].metadata)
    row = {k: v for k, v in make_result(0, trace=False).row().items() if k != "invalid_tool_calls"}
    (root / "rollouts").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), root / "rollouts" / "part-00000000-old.parquet")
    counted = make_result(1, trace=False)
    counted.invalid_tool_calls = 2
    with ParquetRunStore(root) as store:
        store.append_rollouts([counted])
        assert store.read("rollouts")["invalid_tool_calls"].to_pylist() == [None, 2]
        got = store.get_rollouts([row["cache_key"], counted.cache_key])
        assert got[row["cache_key"]].invalid_tool_calls is None and got[counted.cache_key].invalid_tool_calls == 2
    ((n,),) = duckdb.sql(f"select sum(invalid_tool_calls) from read_parquet('{root}/rollouts/*.parquet', "
                         "union_by_name=true)").fetchall()
    assert n == 2


def test_blob_files_are_content_addressed_zstd(store):
    ref = store.put_blob({"trajectory": {"steps": []}})
    path = store.root / "blobs" / ref[:2] / f"{ref}.zst"
    assert path.is_file() and path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # zstd frame magic
    mtime = path.stat().st_mtime_ns
    assert store.put_blob({"trajectory": {"steps": []}}) == ref
    assert path.stat().st_mtime_ns == mtime  # idempotent: not rewritten


def test_a_dropped_writer_flushes_and_frees_the_run(tmp_path):
    store = ParquetRunStore(tmp_path / "run", flush_rows=1000, flush_seconds=None)
    store.append_rollouts([make_result(0)])
    del store  # no close(): garbage collection closes it
    with ParquetRunStore(tmp_path / "run") as again:
        assert again.read("rollouts").num_rows == 1


def test_a_writer_exiting_without_close_keeps_its_rows(tmp_path):
    code = (
        "import sys\n"
        "from milo_ray.store import ParquetRunStore\n"
        "store = ParquetRunStore(sys.argv[1], flush_rows=1000, flush_seconds=None)\n"
        "store.event('only-in-buffer')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], check=True)
    assert open_run(tmp_path / "run").read("events")["kind"].to_pylist() == ["only-in-buffer"]


@pytest.mark.parametrize("syncfs_available", [True, False])
def test_blobs_are_made_durable_before_the_rows_that_reference_them(store, monkeypatch, syncfs_available):
    from milo_ray.store import blobs

    if not syncfs_available:
        monkeypatch.setattr(blobs, "_syncfs", lambda path: False)  # per-file fsync fallback
    real_sync = store._blobs.sync
    seen = []

    def sync():
        seen.append((len(store._blobs._unsynced), len(parts(store.root, "rollouts"))))
        real_sync()

    monkeypatch.setattr(store._blobs, "sync", sync)
    store.append_rollouts([make_result(i) for i in range(3)])
    store.flush()
    assert seen[0] == (3, 0)  # three blobs synced while no rollouts part existed yet
    assert not store._blobs._unsynced
    assert len(parts(store.root, "rollouts")) == 1


def test_a_value_arrow_would_refuse_rejects_its_append_not_a_later_flush(store):
    # The store buffers validated rows and builds the Arrow table once per part file, so
    # every value Arrow could refuse must be refused when it is appended: a refusal at the
    # flush would take the other rows of the part with it.
    store.append_rollouts([make_result(0)])
    bad = make_result(1).row()
    bad["score"] = 2 ** 60  # an int a double cannot hold exactly
    with pytest.raises(ValueError, match=r"rollouts\.score"):
        store.append("rollouts", [bad])
    with pytest.raises(ValueError, match=r"harnesses\.fitness"):
        store.append("harnesses", [{"harness_id": "h", "fitness": ["not a number"]}])
    store.append_rollouts([make_result(2)])
    store.flush()
    assert sorted(store.read("rollouts")["rollout_idx"].to_pylist()) == [0, 2]
    assert store.read("harnesses").num_rows == 0


def test_buffered_one_row_appends_make_one_part_with_every_row_in_order(tmp_path):
    with ParquetRunStore(tmp_path / "run", flush_rows=1000, flush_seconds=None) as s:
        for i in range(30):
            s.append_rollouts([make_result(i)])
        assert s.read("rollouts")["rollout_idx"].to_pylist() == list(range(30))  # read from the buffer
        s.append_rollouts([make_result(30)])  # after a read built the buffer into a table
    assert len(parts(tmp_path / "run", "rollouts")) == 1
    assert open_run(tmp_path / "run").read("rollouts")["rollout_idx"].to_pylist() == list(range(31))
