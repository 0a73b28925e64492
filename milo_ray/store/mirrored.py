"""A Parquet run store whose truth is on object storage (``run.dir=s3://BUCKET/PREFIX``).

The writer keeps a local working copy (the Parquet store's directory, with its flock, temp
files and fsyncs unchanged) and sends each file to the bucket as it is committed: a blob
before the part whose rows reference it, a table's hash list before the part it names, the
manifest each time it is replaced, a compaction's merged part before the deletes of the
parts it replaces (``Uploads`` keeps that order, so the bucket always holds a prefix of the
commits). The one-writer rule holds on the bucket through ``S3Lease``, checked before every
part commit.

Opening for writing makes the working copy's tables and manifest equal to the bucket's
(downloaded; a local part the bucket never received is set aside: its rows are rerun), so a
run resumes on any machine; blobs are fetched from the bucket when first read.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from milo_ray.store import schema
from milo_ray.store.blobs import BlobDir, check_ref
from milo_ray.store.integrity import LEDGER
from milo_ray.store.lease import DEFAULT_LEASE_SECONDS, S3Lease
from milo_ray.store.parquet import MANIFEST, ParquetRunStore
from milo_ray.store.remote import BLOB_DIR, Remote, RunURI, Uploads, remote_for, snapshot, with_retries

log = logging.getLogger(__name__)

_UPLOAD_THREADS = 8


class MirroredBlobDir(BlobDir):
    """Blobs in the working copy, sent to the bucket on ``sync()`` (which the store runs
    before each part, so a row never reaches the bucket before its blob); a blob missing
    locally is fetched from the bucket. Without ``uploads`` it only reads (a reader)."""

    def __init__(self, root: Path, remote: Remote, uploads: Uploads | None = None, rel: str = ""):
        super().__init__(root)
        self.remote, self.uploads = remote, uploads
        self._rel = f"{rel}/{BLOB_DIR}" if rel else BLOB_DIR
        self._unsent: set[str] = set()

    def _key(self, ref: str) -> str:
        return f"{self._rel}/{ref[:2]}/{ref}.zst"

    def write(self, ref: str, compressed: bytes) -> None:
        if self.uploads is None:
            raise PermissionError("a reader's blob directory is read-only")
        super().write(ref, compressed)
        with self._lock:
            # Also when the local file existed: a crashed session may have written it unsent.
            self._unsent.add(ref)

    def sync(self) -> None:
        super().sync()
        with self._lock:
            refs = sorted(self._unsent)
        if not refs:
            return

        def send(ref: str) -> None:
            with_retries(f"uploading blob {ref}", lambda: self.remote.put_file(self.path(ref), self._key(ref)),
                         self.remote.uri)

        workers = min(_UPLOAD_THREADS, len(refs))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(send, r): r for r in refs}
            sent = {futures[f] for f in concurrent.futures.as_completed(futures) if f.exception() is None}
            failed = [f.exception() for f in futures if f.exception() is not None]
        with self._lock:
            self._unsent -= sent
        if failed:
            raise failed[0]  # the unsent blobs stay queued; no part is committed before them

    def read(self, ref: str) -> bytes:
        try:
            return super().read(ref)
        except KeyError:
            pass
        data = self.remote.get_bytes(self._key(check_ref(ref)))
        if data is None:
            raise KeyError(f"no blob {ref} under {self.remote.uri.text}/{self._rel}")
        path = self.path(ref)
        try:  # keep it: blobs are immutable and their content is checked against the ref on decode
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f".{path.name}.{os.getpid()}.dl.tmp"
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError:
            pass
        return data


class MirroredRunStore(ParquetRunStore):
    """The Parquet store on a local working copy (``local_dir``), mirrored to ``uri``."""

    def __init__(self, uri: str | RunURI, local_dir: str | os.PathLike, run_id: str | None = None, *,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS, **options: Any):
        if options.get("read_only"):
            raise ValueError("MirroredRunStore writes; read a run on object storage with open_remote_run(uri)")
        self.uri = uri if isinstance(uri, RunURI) else RunURI.parse(uri)
        self.remote = Remote(self.uri)
        self.remote.check_bucket()
        # Set before the Parquet store's constructor, which takes the lock and reads the run.
        self._lease = S3Lease(self.uri, lease_seconds=lease_seconds)
        self._uploads = Uploads(self.remote, Path(local_dir))
        self._held = False
        super().__init__(local_dir, run_id, **options)
        self._blobs = MirroredBlobDir(self.root, self.remote, self._uploads)

    # ---- lock and working copy -----------------------------------------------------------
    def _acquire_writer_lock(self) -> None:
        super()._acquire_writer_lock()  # the working copy's flock: one writer on this host
        try:
            self._lease.acquire()  # the bucket's: one writer anywhere
            self._held = True
            self._pull()
        except BaseException:
            self._release_writer_lock()  # the constructor releases nothing it failed to finish taking
            raise

    def _release_writer_lock(self) -> None:
        try:
            if self._held:
                try:
                    self._uploads.drain()
                except OSError as exc:
                    log.error("%s: %d committed file(s) could not be uploaded (%s); the bucket holds the run up to "
                              "the one before them, and resuming reruns the rest", self.uri.text,
                              len(self._uploads.pending()), exc)
        finally:
            if self._held:
                self._held = False
                self._lease.release()
            super()._release_writer_lock()

    def _pull(self) -> None:
        """Make the working copy's manifest, parts and hash lists the bucket's."""
        wanted = [r for r in self.remote.list() if _is_store_file(r)]
        have = set(wanted)
        for table in schema.SCHEMAS:
            d = self.root / table
            if not d.is_dir():
                continue
            for p in d.iterdir():
                rel = f"{table}/{p.name}"
                if p.name.endswith(".parquet") and rel not in have and not p.name.startswith("."):
                    aside = self.root / ".not-in-bucket" / table
                    aside.mkdir(parents=True, exist_ok=True)
                    shutil.move(p, aside / p.name)
                    log.warning("%s: %s never reached %s; moved to %s (its rows are rerun)", self.root, rel,
                                self.uri.text, aside)
                elif p.is_file():
                    p.unlink()
        (self.root / MANIFEST).unlink(missing_ok=True)
        self.remote.download(wanted, self.root)

    # ---- commits ---------------------------------------------------------------------------
    def _write_part(self, table: str, data: Any, replaces: list[str] | None = None, path: Path | None = None) -> Path:
        self._lease.check()  # a driver that lost the run commits nothing more
        written = super()._write_part(table, data, replaces=replaces, path=path)
        self._uploads.push("put", f"{table}/{LEDGER}")  # the hash line first, as on disk
        self._uploads.push("put", f"{table}/{written.name}")
        return written

    def _remove_parts(self, d: Path, names: list[str]) -> None:
        super()._remove_parts(d, names)
        for name in names:
            self._uploads.push("delete", f"{d.name}/{name}")

    def _settle_hash_list(self, table: str) -> None:
        super()._settle_hash_list(table)
        if self._held and (self.root / table / LEDGER).exists():
            self._uploads.push("put", f"{table}/{LEDGER}")

    def _manifest_write(self, text: str) -> None:
        self._lease.check()
        super()._manifest_write(text)
        self._uploads.push("put", MANIFEST)

    def upload_file(self, rel: str) -> None:
        """Send a file of the working copy that is not the store's (``run.log``, the report)."""
        self._uploads.push("put", rel)


def _is_store_file(rel: str) -> bool:
    parts = rel.split("/")
    if parts == [MANIFEST]:
        return True
    return len(parts) == 2 and parts[0] in schema.SCHEMAS and (
        parts[1] == LEDGER or (parts[1].startswith("part-") and parts[1].endswith(".parquet")))


def publish(uri: RunURI, root: Path, files: list[Path]) -> None:
    """Copy ``files`` (below ``root``, the working copy) to the bucket: the files a run writes
    beside its store (``run.log``, the report). Best effort: the run's results do not depend
    on them, so a failure is logged, not raised."""
    try:
        remote = Remote(uri)
        for f in files:
            if f.is_file():
                remote.put_file(f, f.relative_to(root).as_posix())
    except Exception as exc:
        log.warning("%s: run.log and the report were not copied to the bucket (%s); they are in %s", uri.text, exc,
                    root)


def open_remote_run(uri: str) -> ParquetRunStore:
    """Read a run on object storage: a snapshot of its tables taken now, blobs read through."""
    root = snapshot(uri)
    store = ParquetRunStore(root, read_only=True)
    store._blobs = blob_dir(root)
    return store


def blob_dir(run_dir: Path) -> BlobDir:
    """The blob directory of a run directory; inside a snapshot, one that reads through to
    the bucket."""
    found = remote_for(run_dir)
    if found is None:
        return BlobDir(run_dir)
    remote, rel = found
    return MirroredBlobDir(Path(run_dir), remote, None, rel)
