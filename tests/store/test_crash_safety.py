"""A writer killed with SIGKILL at an arbitrary point leaves a run that reads back
whole and consistent, and that a new writer resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import duckdb
import pyarrow.parquet as pq

from milo_ray.store import ParquetRunStore, open_run
from milo_ray.store.schema import SCHEMAS

# Each iteration i writes rollout key-i (with a trace blob) then event seq i, so a
# consistent run holds a prefix of both (a resumed writer starts at the first missing
# event and skips rollouts already stored, as a driver would); small buffers and periodic compactions make
# the kill likely to land inside a part write, a rename or a compaction.
WRITER = textwrap.dedent(
    """
    import sys
    from milo_ray.core.rollouts import RolloutResult
    from milo_ray.store import ParquetRunStore

    store = ParquetRunStore(sys.argv[1], flush_rows=7, flush_seconds=None)
    done = store.completed_keys()
    i = store.read("events").num_rows  # resume like a driver: skip rollouts already stored
    while True:
        if f"key-{i}" not in done:
            store.append_rollouts([RolloutResult(
                harness_id="h", task_id=f"t{i % 13}", rollout_idx=i, score=(i % 3) / 2,
                cache_key=f"key-{i}", trace={"i": i, "pad": "x" * 2000})])
        store.event("tick", {"i": i})
        if i % 23 == 0:
            store.flush()
        if i % 97 == 0:
            store.compact()
        print(i, flush=True)
        i += 1
    """
)


def run_and_kill(root, min_iterations: int) -> int:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True)
    last = -1
    try:
        for line in proc.stdout:
            last = int(line)
            if last >= min_iterations:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert last >= min_iterations, "writer died before it was killed"
    return last


def check_consistent(root) -> int:
    """Every part file is whole; the run is a prefix of the writer's iterations."""
    for table in SCHEMAS:
        for f in (root / table).glob("*.parquet"):
            pq.read_table(f)  # raises on a torn file
    reader = open_run(root)
    keys = reader.read("rollouts")["cache_key"].to_pylist()
    n = len(keys)
    assert sorted(keys, key=lambda k: int(k.split("-")[1])) == [f"key-{i}" for i in range(n)]
    assert reader.completed_keys() == set(keys)
    events = reader.read("events").to_pylist()
    assert sorted(e["seq"] for e in events) == list(range(len(events)))
    assert all(e["payload"] == f'{{"i":{e["seq"]}}}' for e in events)
    # Rows are buffered after their blob is written, so every stored ref resolves.
    for row in reader.read("rollouts").to_pylist()[-20:]:
        assert reader.get_blob(row["trace_ref"])["i"] == int(row["cache_key"].split("-")[1])
    return n


def test_sigkill_mid_write_leaves_only_whole_files_and_a_resumable_run(tmp_path):
    root = tmp_path / "run"
    last = run_and_kill(root, min_iterations=300)
    n = check_consistent(root)
    assert 0 < n <= last + 1

    # A resumed writer continues both sequences where the files left them.
    (root / "rollouts" / ".part-99999999-torn.parquet.tmp").write_bytes(b"PAR1 torn")
    with ParquetRunStore(root, flush_rows=7, flush_seconds=None) as store:
        assert duckdb.sql(f"select count(*) from '{root}/rollouts/*.parquet'").fetchall() == [(n,)]
        n_events = store.read("events").num_rows
        store.event("resumed")
        assert store.read("events")["seq"].to_pylist()[-1] == n_events
    assert not (root / "rollouts" / ".part-99999999-torn.parquet.tmp").exists()


def test_repeated_kills_and_resumes_keep_the_run_consistent(tmp_path):
    root = tmp_path / "run"
    seen = 0
    for _ in range(3):  # each writer opens right after the kill: the flock died with the process
        run_and_kill(root, min_iterations=seen + 150)
        n = check_consistent(root)
        assert n >= seen  # nothing that was on disk is ever lost
        seen = n


# Kill deterministically *inside* a part write: after 50 iterations every part file is
# written in two halves with a pause between them, and the parent kills on the pause.
SLOW_WRITER = textwrap.dedent(
    """
    import io, sys, time
    import pyarrow.parquet as pq
    from milo_ray.core.rollouts import RolloutResult
    from milo_ray.store import ParquetRunStore

    real_write = pq.write_table

    def slow_write(table, where, **kw):
        buf = io.BytesIO()
        real_write(table, buf, **kw)
        data = buf.getvalue()
        where.write(data[: len(data) // 2])
        where.flush()
        print("mid-write", flush=True)
        time.sleep(60)
        where.write(data[len(data) // 2 :])

    store = ParquetRunStore(sys.argv[1], flush_rows=5, flush_seconds=None)
    for i in range(10_000):
        if i == 50:
            pq.write_table = slow_write
        store.append_rollouts([RolloutResult(harness_id="h", task_id="t", rollout_idx=i, score=1.0,
                                             cache_key=f"key-{i}", trace={"i": i})])
    """
)


def test_kill_inside_a_part_write_leaves_nothing_a_reader_sees(tmp_path):
    root = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mid-write"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    torn = [p for p in (root / "rollouts").iterdir() if p.name.endswith(".tmp")]
    assert len(torn) == 1  # the half-written part never got its final name
    assert check_consistent(root) == 50
    assert duckdb.sql(f"select count(*) from '{root}/rollouts/*.parquet'").fetchall() == [(50,)]
    ParquetRunStore(root).close()
    assert not torn[0].exists()
