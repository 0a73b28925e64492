"""Parquet store integrity: an interrupted flush stores its rows exactly once, and reads
refuse part files this version cannot read (newer schema, foreign, corrupt), naming
the file and changing nothing on disk."""

from __future__ import annotations

import hashlib
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import milo_ray.store.parquet as P
from milo_ray.store import ParquetRunStore, open_run
from milo_ray.store.integrity import PartHashes, file_sha256
from milo_ray.store.schema import META_SCHEMA_VERSION, SCHEMAS
from milo_ray.testing.store_contract import make_result


def keys(table: pa.Table) -> list[str]:
    return sorted(table.column("cache_key").to_pylist())


def part_files(root, table="rollouts"):
    return sorted(p.name for p in (root / table).glob("part-*.parquet"))


def is_rollout_part(path) -> bool:
    p = os.fspath(path)
    return os.path.basename(os.path.dirname(p)) == "rollouts" and p.endswith(".parquet")


class Interrupt:
    """Raise KeyboardInterrupt once, at one point of the first rollouts part write."""

    def __init__(self, monkeypatch, point: str):
        self.fired = False
        real_replace, real_fsync_dir, real_write = os.replace, P.fsync_dir, pq.write_table

        def once() -> None:
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt

        def write_table(table, where, *a, **kw):
            if point == "writing the temp file":
                once()
            return real_write(table, where, *a, **kw)

        def replace(src, dst, *a, **kw):
            if is_rollout_part(dst) and point == "before the rename":
                once()
            real_replace(src, dst, *a, **kw)
            if is_rollout_part(dst) and point == "right after the rename":
                once()

        def fsync_dir(d):
            real_fsync_dir(d)
            if os.path.basename(os.fspath(d)) == "rollouts" and point == "fsync of the directory":
                once()

        monkeypatch.setattr(pq, "write_table", write_table)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(P, "fsync_dir", fsync_dir)


POINTS = ["writing the temp file", "before the rename", "right after the rename", "fsync of the directory"]


@pytest.mark.parametrize("point", POINTS)
def test_an_interrupted_flush_stores_its_rows_exactly_once(tmp_path, monkeypatch, point):
    root = tmp_path / "run"
    store = ParquetRunStore(root, flush_rows=3, flush_seconds=None)
    hook = Interrupt(monkeypatch, point)
    with pytest.raises(KeyboardInterrupt):
        store.append_rollouts([make_result(i) for i in range(3)])  # the third row triggers the flush
    assert hook.fired
    # The writer still sees each row once, whether or not the part made it.
    assert keys(store.read("rollouts")) == [make_result(i).cache_key for i in range(3)]
    assert len(store.completed_keys()) == 3
    store.append_rollouts([make_result(3)])
    store.flush()  # what the entry point's ``finally`` does
    store.close()
    expected = [make_result(i).cache_key for i in range(4)]
    assert keys(open_run(root).read("rollouts")) == expected
    assert not list((root / "rollouts").glob(".*.tmp"))  # no temp file left to be mistaken for data
    with ParquetRunStore(root, flush_seconds=None) as again:  # a resumed run sees each row once
        assert keys(again.read("rollouts")) == expected
        again.compact()
    assert keys(open_run(root).read("rollouts")) == expected


def test_rows_survive_an_interrupt_after_the_rename_and_a_failed_flush_before_the_next(tmp_path, monkeypatch):
    root = tmp_path / "run"
    store = ParquetRunStore(root, flush_rows=2, flush_seconds=None)
    Interrupt(monkeypatch, "fsync of the directory")
    with pytest.raises(KeyboardInterrupt):
        store.append_rollouts([make_result(0), make_result(1)])
    monkeypatch.undo()
    real_write = pq.write_table

    def disk_full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    with pytest.raises(OSError):
        store.append_rollouts([make_result(2), make_result(3)])
    assert keys(store.read("rollouts")) == [make_result(i).cache_key for i in range(4)]
    monkeypatch.setattr(pq, "write_table", real_write)
    store.close()
    assert keys(open_run(root).read("rollouts")) == [make_result(i).cache_key for i in range(4)]
    assert len(part_files(root)) == 2


# ---- footer checks ---------------------------------------------------------------------


def snapshot(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".writer.lock"
    }


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "run"
    with ParquetRunStore(root, run_id="r", flush_rows=1, flush_seconds=None) as s:
        s.append_rollouts([make_result(0)])
        s.append_rollouts([make_result(1)])  # two parts, so a writer would have something to compact
        s.event("tick")
    return root


def as_written(root, path):
    """Record a file planted by a test in its table's hash list, as a writer would have:
    these tests check what a read makes of its content, not the hash check."""
    hashes = PartHashes(path.parent)
    hashes.rewrite({**hashes.known(), path.name: file_sha256(path)})
    return path


def newer_schema_part(root):
    src = root / "rollouts" / part_files(root)[0]
    t = pq.read_table(src)
    meta = dict(t.schema.metadata)
    meta[META_SCHEMA_VERSION] = b"99"
    bad = root / "rollouts" / "part-00000050-future.parquet"
    pq.write_table(t.replace_schema_metadata(meta), bad)
    return as_written(root, bad), ["newer milo_ray", "schema_version 99", "upgrade"]


def foreign_part(root):
    bad = root / "rollouts" / "part-00000051-foreign.parquet"
    pq.write_table(pa.table({"foo": [1, 2, 3]}), bad)
    return as_written(root, bad), ["not a milo_ray rollouts file", "move it out of", str(root / "rollouts")]


def other_table_part(root):
    bad = root / "rollouts" / "part-00000052-events.parquet"
    shutil.copy(root / "events" / part_files(root, "events")[0], bad)
    return as_written(root, bad), ["not a milo_ray rollouts file", "'events'"]


def corrupt_part(root):
    bad = root / "rollouts" / "part-00000053-corrupt.parquet"
    bad.write_bytes(b"garbage" * 10)
    return as_written(root, bad), ["unreadable (corrupt?)", "move it out of"]


def bad_column_part(root):
    # Right footer metadata, but a column of an incompatible type: fails while reading rows.
    bad = root / "rollouts" / "part-00000054-badcol.parquet"
    pq.write_table(pa.table({"score": [[1, 2]]}).replace_schema_metadata(SCHEMAS["rollouts"].metadata), bad)
    return as_written(root, bad), ["unreadable (corrupt?)", "move it out of"]


BAD_PARTS = [newer_schema_part, foreign_part, other_table_part, corrupt_part, bad_column_part]


@pytest.mark.parametrize("make_bad", BAD_PARTS, ids=lambda f: f.__name__)
def test_reads_refuse_a_part_they_cannot_read_naming_it_and_changing_nothing(run, make_bad):
    bad, words = make_bad(run)
    before = snapshot(run)

    def writer_read():
        s = ParquetRunStore(run, flush_seconds=None)  # footers are checked on open already
        try:
            s.read("rollouts")
        finally:
            s.close()

    for read in (lambda: open_run(run).read("rollouts"), writer_read):
        with pytest.raises(ValueError) as err:
            read()
        message = str(err.value)
        assert str(bad) in message
        for w in words:
            assert w in message
        assert snapshot(run) == before  # nothing compacted, rewritten or deleted
    # The failed writer open released the run: with the file moved out, it opens and reads.
    bad.rename(run / bad.name)
    with ParquetRunStore(run, flush_seconds=None) as s:
        assert keys(s.read("rollouts")) == [make_result(0).cache_key, make_result(1).cache_key]


def test_compaction_never_rewrites_a_newer_part_as_the_current_version(run):
    with ParquetRunStore(run, flush_seconds=None) as s:
        bad, _ = newer_schema_part(run)
        before = snapshot(run)
        with pytest.raises(ValueError, match="upgrade"):
            s.compact()
        assert snapshot(run) == before
        bad.unlink()


def test_older_schema_versions_still_read(run):
    src = run / "rollouts" / part_files(run)[0]
    t = pq.read_table(src)
    pq.write_table(t.replace_schema_metadata({**t.schema.metadata, META_SCHEMA_VERSION: b"0"}), src)
    as_written(run, src)
    assert keys(open_run(run).read("rollouts")) == [make_result(0).cache_key, make_result(1).cache_key]


def test_footers_are_read_once_per_part_file(run, monkeypatch):
    calls = []
    real = pq.read_schema
    monkeypatch.setattr(pq, "read_schema", lambda p, *a, **kw: calls.append(os.fspath(p)) or real(p, *a, **kw))
    reader = open_run(run)
    reader.read("rollouts")
    seen = sorted(calls)
    assert seen  # footers were checked
    reader.read("rollouts")
    reader.read("events")
    assert sorted(calls) == seen  # immutable parts: checked once, not per read
