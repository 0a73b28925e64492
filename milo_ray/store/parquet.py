"""The Parquet ``RunStore``: one run = one directory (DESIGN §3).

Layout::

    <root>/manifest.json                       atomic JSON (write_manifest)
    <root>/<table>/part-<seq>-<uuid>.parquet   append-only parts, zstd, schema_version in footer
    <root>/blobs/<ab>/<sha>.zst                content-addressed traces and harness sources
    <root>/.writer.lock                        flock held by the one writing process

Writes. Rows are validated on append and buffered per table; a buffer becomes one
part file when it reaches ``flush_rows`` rows or its oldest row is ``flush_seconds``
old (a background thread checks), and on ``flush()``/``close()``. So 10,000
rollouts make a handful of files, and a crash loses at most the unflushed buffer.
A flush detaches the buffer and remembers which part file it goes to; the rows count
as stored exactly when that file is in place. An exception or ``KeyboardInterrupt``
at any point of a flush therefore neither loses them (no file yet: they go back into
the buffer) nor writes them twice (file renamed: the next flush does not repeat it).
Every file (part, blob, manifest) is written to a dot-prefixed ``.tmp`` file in the
same directory, fsynced, then ``os.replace``-d into place: a reader, DuckDB's
``'<root>/rollouts/*.parquet'`` glob or ``pyarrow.dataset`` only ever sees whole
files. A ``.tmp`` left by a crash is ignored by readers and deleted when a writer
reopens the run.

Compaction and crash safety. ``compact()`` merges each table's parts into one new
part whose footer lists the names it replaces (``milo_ray.replaces``), then deletes
those parts. The merged file appears atomically (rename), so at every instant the
directory holds either the old parts, or the old parts plus a merged file that
declares them replaced, or only the merged file. Readers of this module exclude
every part named in a present file's replaces list, so they never double-count in
any of these states; a writer reopening the run finishes an interrupted compaction
by deleting the replaced parts. (A raw DuckDB glob can see duplicates only between
such a crash and the next writer open.)

One writer: the writing *process* holds ``flock`` on ``.writer.lock``; a second
writer (another process, or a second store object on the same run) fails fast.
The kernel drops the lock when the process dies, so a killed run can be resumed.
Readers (``open_run``) take no lock and write nothing.

Reads check every part's footer first (cached per file name: parts are immutable):
a file of a newer ``schema_version``, a parquet file of another table or program,
or an unreadable file raises ``ValueError`` naming the file, before any row is
read and before a writer touches the run.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from milo_ray.store import schema
from milo_ray.store.blobs import BlobDir
from milo_ray.store.core import StoreCore
from milo_ray.store.integrity import (DiskFull, PartHashes, RunLocked, atomic_write_bytes, describe_holder, file_sha256, fsync_dir,
                                      holder_record, raise_if_full)

try:  # POSIX only; elsewhere the one-writer rule is documented, not enforced
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

META_REPLACES = b"milo_ray.replaces"
MANIFEST = "manifest.json"
_LOCK = ".writer.lock"


def _part_seq(name: str) -> int:
    try:
        return int(name.split("-")[1])
    except (IndexError, ValueError):
        return -1


def _is_part(name: str) -> bool:
    return name.startswith("part-") and name.endswith(".parquet")


class ParquetRunStore(StoreCore):
    """Parquet-backed run store rooted at ``root`` (created if missing; appended to if
    it exists). ``run_id`` defaults to the manifest's, else the directory name."""

    def __init__(
        self,
        root: str | os.PathLike,
        run_id: str | None = None,
        *,
        flush_rows: int = 2000,
        flush_seconds: float | None = 5.0,
        read_only: bool = False,
    ):
        if not isinstance(flush_rows, int) or flush_rows < 1:
            raise ValueError(f"flush_rows must be a positive int, got {flush_rows!r}")
        if flush_seconds is not None and not flush_seconds > 0:
            raise ValueError(f"flush_seconds must be > 0 or None (no age-based flush), got {flush_seconds!r}")
        self.root = Path(root)
        self.read_only = read_only
        if read_only:
            if not self.root.is_dir():
                raise FileNotFoundError(f"no run directory at {self.root}")
        else:
            self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = None
        self._hashes = {t: PartHashes(self._table_dir(t)) for t in schema.SCHEMAS}
        if not read_only:
            self._acquire_writer_lock()
        stored_id = self._stored_run_id()
        if run_id and stored_id and run_id != stored_id:
            self._release_writer_lock()
            raise ValueError(f"{self.root} holds run {stored_id!r}, not {run_id!r}; pass run_id={stored_id!r} or None")
        super().__init__(run_id or stored_id or self.root.resolve().name)
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._blobs = BlobDir(self.root)
        # Per table, one tuple replaced as a whole (so an interrupt never leaves it half
        # updated): (buffered chunks, in-flight flush or None). An in-flight flush is
        # (part path, chunks sent to it): those rows are stored iff the path exists.
        # Chunks are schema.Columns (validated rows) or pa.Table (a buffer already built by a read).
        self._buf: dict[str, tuple[tuple[Any, ...], tuple[Path, tuple[Any, ...]] | None]] = {
            t: ((), None) for t in schema.SCHEMAS
        }
        self._buffered: dict[str, int] = {t: 0 for t in schema.SCHEMAS}
        self._since: dict[str, float | None] = {t: None for t in schema.SCHEMAS}
        # (table, part name) -> names it replaces, for parts whose footer was checked
        # (part files are immutable once renamed into place)
        self._replaces: dict[tuple[str, str], tuple[str, ...]] = {}
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        try:
            if not read_only:
                self._recover()
            else:
                self._report_temp_files()
            self._file_seq = {t: self._max_part_seq(t) + 1 for t in schema.SCHEMAS}
            self._completed = self._load_completed()
            seqs = self._scan("events").column("seq")
            self._next_seq = 0 if len(seqs) == 0 else int(pc.max(seqs).as_py()) + 1
        except BaseException:
            self._closed = True  # nothing buffered yet: __del__ must not flush
            self._release_writer_lock()
            raise
        if not read_only:
            _OPEN_WRITERS.add(self)

    # ---- opening ----------------------------------------------------------------------
    def _acquire_writer_lock(self) -> None:
        if fcntl is None:
            return
        fd = os.open(self.root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            # The kernel drops a flock when its holder dies, so a holder named here is alive
            # (on this host; see the docs for shared filesystems).
            raise RunLocked(
                f"{self.root} is in use by {describe_holder(self.root / _LOCK)}: a run has exactly one "
                f"writing process; wait for it to finish or stop it, then resume (read it meanwhile with "
                f"milo_ray.store.open_run)"
            ) from None
        except OSError:  # filesystem without flock support: keep the documented rule only
            pass
        else:
            try:  # who holds it, for the message a second writer gets
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder_record(), 0)
            except OSError:
                pass
        self._lock_fd = fd

    def _release_writer_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def _stored_run_id(self) -> str | None:
        text = self._manifest_read()
        if text is None:
            return None
        try:
            value = json.loads(text).get("run_id")
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None

    def _table_dir(self, table: str) -> Path:
        return self.root / table

    def _recover(self) -> None:
        """Writer open: drop temp files of a crashed writer, finish interrupted compactions.
        Every part's footer is checked first, so a run holding a file this version cannot
        read is refused before anything in it changes."""
        stale: dict[str, set[str]] = {}
        for table in schema.SCHEMAS:
            d = self._table_dir(table)
            if d.is_dir():
                present = {p.name for p in d.iterdir() if _is_part(p.name)}
                stale[table] = {r for name in present for r in self._replaced_by(table, d / name)} & present
        for table, names in stale.items():
            d = self._table_dir(table)
            for p in d.iterdir():
                if p.name.startswith(".") and p.name.endswith(".tmp"):
                    log.warning("%s: removed a half-written file a crashed writer left (its rows were never "
                                "part of the run)", p)
                    p.unlink(missing_ok=True)
            if names:
                self._remove_parts(d, sorted(names))
            self._settle_hash_list(table)
        blob_root = self._blobs.root
        if blob_root.is_dir():
            for p in blob_root.glob("*/.*.tmp"):
                p.unlink(missing_ok=True)
        for p in self.root.glob(f".{MANIFEST}.*.tmp"):
            p.unlink(missing_ok=True)

    def _settle_hash_list(self, table: str) -> None:
        """Writer open: a run written before hashes were kept gets its parts' hashes as
        they are now; lines of parts that no longer exist (replaced by a compaction, or
        never renamed into place) are dropped."""
        hashes = self._hashes[table]
        present = [p for p in self._table_dir(table).iterdir() if _is_part(p.name)]
        if not hashes.exists():
            if present:
                hashes.rewrite({p.name: file_sha256(p) for p in present})
                log.info("%s: recorded the hashes of %d part(s) written before hashes were kept", hashes.path,
                         len(present))
            return
        known = hashes.known(refresh=True)
        names = {p.name for p in present}
        if set(known) - names or hashes.torn:
            hashes.rewrite({n: h for n, h in known.items() if n in names})

    def _report_temp_files(self) -> None:
        """A reader skips files still being written (or left by a crashed writer); it says so."""
        for table in schema.SCHEMAS:
            d = self._table_dir(table)
            if d.is_dir():
                for p in d.iterdir():
                    if p.name.startswith(".") and p.name.endswith(".tmp"):
                        log.warning("%s: skipped a half-written file (a live writer is writing it, or a crashed "
                                    "one left it; the next writer removes it)", p)

    def _max_part_seq(self, table: str) -> int:
        d = self._table_dir(table)
        if not d.is_dir():
            return -1
        return max((_part_seq(p.name) for p in d.iterdir() if _is_part(p.name)), default=-1)

    def _load_completed(self) -> set[str]:
        data = self._scan("rollouts", columns=["cache_key", "error_kind"])
        keys, kinds = data["cache_key"].to_pylist(), data["error_kind"].to_pylist()
        return {k for k, kind in zip(keys, kinds) if k and kind != "infra"}

    # ---- part files -------------------------------------------------------------------
    def _replaced_by(self, table: str, path: Path) -> tuple[str, ...]:
        """Names of the parts ``path`` replaces, after checking its footer belongs to
        ``table`` and to a schema version this code reads (``ValueError`` naming the
        file otherwise). Reads the footer only, once per file."""
        cached = self._replaces.get((table, path.name))
        if cached is None:
            # The footer first: a part from a newer milo_ray is best told as "upgrade".
            cached = _check_footer(table, path)
            self._hashes[table].verify(path)
            self._replaces[(table, path.name)] = cached
        return cached

    def live_parts(self, table: str) -> list[Path]:
        """Part files holding ``table``'s flushed rows, in write order (parts superseded
        by a compaction excluded)."""
        schema.check_table(table)
        d = self._table_dir(table)
        if not d.is_dir():
            return []
        parts = sorted((p for p in d.iterdir() if _is_part(p.name)), key=lambda p: (_part_seq(p.name), p.name))
        replaced = {r for p in parts for r in self._replaced_by(table, p)}
        return [p for p in parts if p.name not in replaced]

    def _new_part_path(self, table: str) -> Path:
        seq = self._file_seq[table]
        self._file_seq[table] = seq + 1
        return self._table_dir(table) / f"part-{seq:08d}-{uuid.uuid4().hex[:12]}.parquet"

    def _write_part(
        self, table: str, data: pa.Table, replaces: list[str] | None = None, path: Path | None = None
    ) -> Path:
        path = path or self._new_part_path(table)
        d, name = path.parent, path.name
        d.mkdir(parents=True, exist_ok=True)
        self._blobs.sync()  # blobs referenced by these rows become durable first
        meta = dict(schema.SCHEMAS[table].metadata)
        if replaces:
            meta[META_REPLACES] = json.dumps(replaces).encode()
        data = data.cast(schema.SCHEMAS[table]).replace_schema_metadata(meta)
        tmp = d / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(data, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            # Hash recorded before the part appears: every part that exists has its line.
            self._hashes[table].record(name, file_sha256(tmp))
            os.replace(tmp, d / name)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            raise_if_full(e, d)
            raise
        self._replaces[(table, name)] = tuple(replaces or ())
        fsync_dir(d)
        return d / name

    def _remove_parts(self, d: Path, names: list[str]) -> None:
        for name in names:
            (d / name).unlink(missing_ok=True)
        fsync_dir(d)

    # ---- hooks ------------------------------------------------------------------------
    def _convert(self, table: str, rows: list[Any]) -> schema.Columns:
        # Validated now, built into Arrow once per part file (or read): a one-row table
        # costs as much to build as a few hundred rows of a large one.
        return schema.to_columns(table, rows)

    def _ingest(self, table: str, data: schema.Columns) -> None:
        chunks, inflight = self._buf[table]
        self._buf[table] = (chunks + (data,), inflight)
        self._buffered[table] += data.num_rows
        now = time.monotonic()
        if self._since[table] is None:
            self._since[table] = now
        if self._buffered[table] >= self.flush_rows or self._is_stale(table, now):
            self._flush_table(table)
        elif self.flush_seconds is not None and self._flusher is None:
            self._start_flusher()

    def _is_stale(self, table: str, now: float) -> bool:
        since = self._since[table]
        return self.flush_seconds is not None and since is not None and now - since >= self.flush_seconds

    def _settle(self, table: str) -> tuple[Any, ...]:
        """Resolve an interrupted flush and return the buffered chunks. The rows sent to
        an in-flight part are stored iff that part was renamed into place; otherwise they
        go back in front of the buffer. Idempotent: the state changes in one assignment."""
        chunks, inflight = self._buf[table]
        if inflight is None:
            return chunks
        path, sent = inflight
        if not path.exists():
            (path.parent / f".{path.name}.tmp").unlink(missing_ok=True)
            chunks = sent + chunks
        self._buf[table] = (chunks, None)
        self._buffered[table] = sum(c.num_rows for c in chunks)
        if not chunks:
            self._since[table] = None
        elif self._since[table] is None:
            self._since[table] = time.monotonic()
        return chunks

    def _flush_table(self, table: str) -> None:
        chunks = self._settle(table)
        if not chunks:
            return
        path = self._new_part_path(table)
        # Detach the rows and name their part in one step; from here on they are stored
        # exactly when ``path`` exists, wherever an exception or interrupt lands.
        self._buf[table] = ((), (path, chunks))
        self._buffered[table] = 0
        self._since[table] = None
        try:
            self._write_part(table, schema.build(table, chunks), path=path)
        finally:
            self._settle(table)

    def _scan(
        self, table: str, filter: pc.Expression | None = None, columns: list[str] | None = None
    ) -> pa.Table:
        sch = schema.SCHEMAS[table]
        if not self.read_only:
            # The writer reads under its lock so a concurrent flush or compaction cannot
            # move rows between the buffer and the files mid-read.
            with self._lock:
                return self._scan_unlocked(table, sch, filter, columns, self._settle(table))
        # A reader races the writer's compactions: a part may vanish between listing and
        # reading; its rows are then in a newer part, so list again.
        for attempt in range(10):
            try:
                return self._scan_unlocked(table, sch, filter, columns, [])
            except FileNotFoundError:
                if attempt == 9:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")

    def _scan_unlocked(self, table, sch, filter, columns, buffered) -> pa.Table:
        files = self.live_parts(table)
        pieces = []
        if files:
            pieces.append(_read_parts(table, files, filter=filter, columns=columns))
        if buffered:
            b = schema.build(table, buffered).combine_chunks()
            if len(buffered) > 1:  # many one-row appends: merge once so later reads stay fast
                self._buf[table] = ((b,), None)  # the writer's _scan settled the buffer
            b = b if filter is None else b.filter(filter)
            pieces.append(b if columns is None else b.select(columns))
        if not pieces:
            empty = sch.empty_table()
            return empty if columns is None else empty.select(columns)
        out = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        return out.replace_schema_metadata(sch.metadata) if columns is None else out

    def _blob_write(self, ref: str, compressed: bytes) -> None:
        self._blobs.write(ref, compressed)

    def _blob_read(self, ref: str) -> bytes:
        return self._blobs.read(ref)

    def _manifest_write(self, text: str) -> None:
        atomic_write_bytes(self.root / MANIFEST, text.encode("utf-8"))

    def _manifest_read(self) -> str | None:
        try:
            return (self.root / MANIFEST).read_text("utf-8")
        except FileNotFoundError:
            return None

    # ---- public lifecycle -------------------------------------------------------------
    def completed_keys(self) -> set[str]:
        if self.read_only:  # a reader follows a live writer
            return self._load_completed()
        return super().completed_keys()

    def flush(self) -> None:
        """Write every buffered row to a part file."""
        with self._lock:
            if self.read_only:
                return
            for table in schema.SCHEMAS:
                self._flush_table(table)
            self._blobs.sync()  # blobs stored without rows (harness sources) too

    def _flush_stale(self) -> None:
        with self._lock:
            if self._closed:
                return
            now = time.monotonic()
            for table in schema.SCHEMAS:
                if self._is_stale(table, now):
                    self._flush_table(table)

    def compact(self) -> None:
        """Merge each table's parts into one file, rows and order unchanged (see module
        docstring for why a crash at any point neither loses nor double-counts rows)."""
        with self._lock:
            self._check_writable()
            self.flush()
            for table in schema.SCHEMAS:
                parts = self.live_parts(table)
                if len(parts) <= 1:
                    continue
                data = _read_parts(table, parts)
                self._write_part(table, data, replaces=[p.name for p in parts])
                self._remove_parts(self._table_dir(table), [p.name for p in parts])
                self._settle_hash_list(table)

    def close(self) -> None:
        """Flush, stop the background flusher and release the writer lock. Idempotent."""
        self._stop.set()
        try:
            super().close()
        finally:
            with self._lock:
                self._release_writer_lock()
        t = self._flusher
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)

    def __del__(self) -> None:
        # A writer dropped without close() still lands its buffered rows and frees the
        # run for the next writer (the flusher holds only a weak reference).
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    def _start_flusher(self) -> None:
        interval = max(0.01, min(1.0, self.flush_seconds / 4))  # type: ignore[operator]
        self._flusher = threading.Thread(
            target=_flusher_loop, args=(weakref.ref(self), self._stop, interval),
            name=f"store-flusher-{self.run_id}", daemon=True,
        )
        self._flusher.start()


def _check_footer(table: str, path: Path) -> tuple[str, ...]:
    """Check one part's footer metadata; return the part names it replaces.
    ``FileNotFoundError`` passes through (a reader racing a compaction lists again)."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise ValueError(
            f"{path}: unreadable (corrupt?) {table} part file ({e}); move it out of {path.parent} "
            f"to read the rest of the run"
        ) from None
    owner = meta.get(schema.META_TABLE)
    if owner != table.encode():
        what = "a parquet file without milo_ray metadata" if owner is None else \
            f"a milo_ray {owner.decode(errors='replace')!r} file"
        raise ValueError(
            f"{path}: not a milo_ray {table} file ({what}); move it out of {path.parent}"
        )
    raw = meta.get(schema.META_SCHEMA_VERSION)
    try:
        version = int(raw.decode()) if raw is not None else None
    except ValueError:
        version = None
    if version is None:
        raise ValueError(f"{path}: {table} part without a valid schema_version ({raw!r}); move it out of {path.parent}")
    if version > schema.SCHEMA_VERSION:
        raise ValueError(
            f"{path}: written by a newer milo_ray (schema_version {version}, this version reads up to "
            f"{schema.SCHEMA_VERSION}); upgrade milo_ray to read this run"
        )
    try:
        raw = meta.get(META_REPLACES)
        replaces = tuple(json.loads(raw)) if raw else ()
        if not all(isinstance(r, str) for r in replaces):
            raise ValueError("not a list of names")
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: unreadable {META_REPLACES.decode()} footer entry ({e}); the file is corrupt") from None
    return replaces


def _read_parts(table: str, parts: list[Path], filter: pc.Expression | None = None,
                columns: list[str] | None = None) -> pa.Table:
    """Rows of ``parts`` (footers already checked) as one table of ``table``'s schema."""
    sch = schema.SCHEMAS[table]
    try:
        return ds.dataset([str(p) for p in parts], schema=sch, format="parquet").to_table(filter=filter, columns=columns)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as e:
        error = e
    for p in parts:  # error path only: find the file at fault so the message can name it
        try:
            ds.dataset([str(p)], schema=sch, format="parquet").to_table()
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as e:
            raise ValueError(
                f"{p}: unreadable (corrupt?) {table} part file ({e}); move it out of {p.parent} "
                f"to read the rest of the run"
            ) from None
    raise error


_OPEN_WRITERS: "weakref.WeakSet[ParquetRunStore]" = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:
    # A driver that exits normally without closing its store still flushes the buffers.
    for store in list(_OPEN_WRITERS):
        try:
            store.close()
        except Exception:
            log.exception("closing run store %s at exit failed", getattr(store, "run_id", "?"))


def _flusher_loop(ref: "weakref.ref[ParquetRunStore]", stop: threading.Event, interval: float) -> None:
    # Holds only a weak reference between ticks, so an abandoned store can be collected.
    said_full = False
    while not stop.wait(interval):
        store = ref()
        if store is None:
            return
        try:
            store._flush_stale()
            said_full = False
        except DiskFull as e:  # said once: the next foreground write raises it to the run
            if not said_full:
                log.warning("background flush of run %s: %s", store.run_id, e)
            said_full = True
        except Exception:  # keep the rows buffered; the next flush retries and raises
            log.exception("background flush of run %s failed", store.run_id)
        del store


def open_run(path: str | os.PathLike) -> ParquetRunStore:
    """Open a run directory for analysis: reads follow a live writer, writes raise."""
    return ParquetRunStore(path, read_only=True)
