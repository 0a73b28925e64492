"""Damage a run directory can suffer, and what the Parquet store makes of it: a part or
blob changed after it was written is refused naming the file, a half-written file is
reported and skipped, a second live writer is refused naming the holder (a killed one
frees the run), and a full disk stops writes without losing or tearing anything stored."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from milo_ray.store import ParquetRunStore, open_run
from milo_ray.store.integrity import LEDGER, DiskFull, IntegrityError, PartHashes, RunLocked
from milo_ray.testing.store_contract import make_result
from milo_ray.testing.tmpfs import MountRefused, SmallDisk


def snapshot(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".writer.lock"}


def keys(store) -> list[str]:
    return sorted(store.read("rollouts").column("cache_key").to_pylist())


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "run"
    with ParquetRunStore(root, run_id="r", flush_rows=1, flush_seconds=None) as s:
        s.append_rollouts([make_result(0)])
        s.append_rollouts([make_result(1)])
    return root


def parts(root, table="rollouts"):
    return sorted((root / table).glob("part-*.parquet"))


def _refused_by_reader_and_writer(root, path, words):
    before = snapshot(root)
    for open_ in (lambda: open_run(root).read("rollouts"), lambda: ParquetRunStore(root, flush_seconds=None)):
        with pytest.raises(IntegrityError) as err:
            open_()
        message = str(err.value)
        assert "\n" not in message and str(path) in message
        for w in words:
            assert w in message
        assert snapshot(root) == before  # refused before anything changed


def forge(part):
    """Rewrite a part as a valid milo_ray part with every score raised by one."""
    t = pq.read_table(part)
    forged = t.set_column(t.schema.get_field_index("score"), "score", pc.add(t["score"], 1.0))
    pq.write_table(forged.replace_schema_metadata(t.schema.metadata), part, compression="zstd")


def test_a_part_rewritten_after_it_was_written_is_refused_naming_it(run):
    victim = parts(run)[0]
    forge(victim)
    _refused_by_reader_and_writer(run, victim, ["content changed after it was written", LEDGER])


def test_a_part_the_store_never_wrote_is_refused(run):
    planted = run / "rollouts" / "part-00000077-planted.parquet"
    planted.write_bytes(parts(run)[0].read_bytes())  # a valid part, but never recorded
    _refused_by_reader_and_writer(run, planted, ["never wrote", "move it out of"])


def test_a_blob_changed_after_it_was_written_is_refused(tmp_path):
    root = tmp_path / "run"
    with ParquetRunStore(root, flush_seconds=None) as s:
        ref = s.put_blob({"trace": "original"})
    other = ParquetRunStore(tmp_path / "other", flush_seconds=None)
    forged_ref = other.put_blob({"trace": "forged"})
    other.close()
    path = root / "blobs" / ref[:2] / f"{ref}.zst"
    path.write_bytes((tmp_path / "other" / "blobs" / forged_ref[:2] / f"{forged_ref}.zst").read_bytes())
    with pytest.raises(IntegrityError, match=f"blob {ref}: content changed"):
        open_run(root).get_blob(ref)


def test_a_run_written_before_hashes_were_kept_opens_and_its_first_writer_records_them(run):
    ledger = run / "rollouts" / LEDGER
    ledger.unlink()
    assert keys(open_run(run)) == sorted([make_result(0).cache_key, make_result(1).cache_key])  # unverified
    ParquetRunStore(run, flush_seconds=None).close()  # a writer adopts the parts as they are
    assert set(PartHashes(run / "rollouts").known()) == {p.name for p in parts(run)}
    victim = parts(run)[0]
    forge(victim)
    with pytest.raises(IntegrityError, match="content changed"):
        open_run(run).read("rollouts")


def test_a_hash_line_cut_short_by_a_crash_is_ignored_and_pruned(run):
    ledger = run / "rollouts" / LEDGER
    whole = ledger.read_text()
    with open(ledger, "a") as f:
        f.write("ab12")  # an append the crash cut short: its part was never renamed into place
    assert len(keys(open_run(run))) == 2
    with ParquetRunStore(run, flush_seconds=None) as s:
        s.append_rollouts([make_result(2)])
    assert ledger.read_text().startswith(whole) and "ab12" not in ledger.read_text()
    assert len(keys(open_run(run))) == 3


def test_a_half_written_file_is_reported_and_skipped_then_removed_by_the_next_writer(run, caplog):
    torn = run / "rollouts" / ".part-00000009-torn.parquet.tmp"
    torn.write_bytes(parts(run)[0].read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="milo_ray.store.parquet"):
        assert len(keys(open_run(run))) == 2
        assert any(str(torn) in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
        caplog.clear()
        ParquetRunStore(run, flush_seconds=None).close()
        assert any(str(torn) in r.getMessage() and "removed" in r.getMessage() for r in caplog.records)
    assert not torn.exists()


HOLDER = textwrap.dedent("""
    import sys, time
    from milo_ray.store import ParquetRunStore
    s = ParquetRunStore(sys.argv[1], flush_seconds=None)
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_second_writer_is_refused_naming_the_live_holder_and_a_killed_holder_frees_the_run(run):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"in use by pid {holder.pid} on "):
            ParquetRunStore(run, flush_seconds=None)
        assert len(keys(open_run(run))) == 2  # readers are never refused
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        # The kernel dropped the dead holder's lock: no stale lock to clear by hand.
        with ParquetRunStore(run, flush_seconds=None) as s:
            s.append_rollouts([make_result(2)])
    finally:
        if holder.poll() is None:
            holder.kill()
    assert len(keys(open_run(run))) == 3


@pytest.fixture
def small_disk(tmp_path):
    try:
        disk = SmallDisk(tmp_path / "disk", size_kib=2048)
    except MountRefused as e:
        pytest.skip(str(e))
    yield disk
    disk.unmount()


def test_a_full_disk_stops_writes_loses_nothing_stored_and_the_run_goes_on_once_space_is_back(small_disk):
    root = small_disk.path / "run"
    s = ParquetRunStore(root, run_id="r", flush_rows=1, flush_seconds=None)
    s.write_manifest({"run_id": "r", "status": "running"})
    s.append_rollouts([make_result(i) for i in range(3)])
    stored = keys(s)
    filler = small_disk.fill()
    with pytest.raises(DiskFull, match=f"no space left on the device holding {root}"):
        for i in range(3, 200):
            s.append_rollouts([make_result(i)])
    with pytest.raises(DiskFull):
        s.write_manifest({"run_id": "r", "status": "finished"})
    try:
        s.close()  # its last buffer may not fit; the run is released either way
    except DiskFull:
        pass
    # Nothing torn, nothing lost: the run reads whole, with the last whole manifest.
    reader = open_run(root)
    assert set(stored) <= set(keys(reader))
    assert json.loads((root / "manifest.json").read_text())["status"] == "running"
    assert not [p for p in root.rglob("*.tmp")]
    filler.unlink()
    small_disk.resize(8192)
    with ParquetRunStore(root, run_id="r", flush_seconds=None) as s:  # verifies every part on open
        done = set(keys(s))
        s.append_rollouts([make_result(i) for i in range(200) if make_result(i).cache_key not in done])
    assert len(keys(open_run(root))) == 200


def test_a_table_directory_still_reads_with_pyarrow_alone(run):
    # The hash list sits beside the parts; readers of a whole directory must skip it.
    assert pq.read_table(run / "rollouts").num_rows == 2
