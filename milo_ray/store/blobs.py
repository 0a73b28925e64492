"""Content-addressed blobs: encoding shared by every store, plus the on-disk layout.

A blob is one zstd frame whose plaintext starts with a one-byte type tag
(``J`` JSON for dict/list, ``S`` utf-8 text, ``B`` raw bytes) so ``get_blob`` returns
the type that was stored. The ref is the sha256 (hex) of tag + plaintext, so equal
content gives one blob, and a string never shares a ref with the same bytes. JSON is
canonical (sorted keys): equal dicts dedupe; tuples come back as lists.

On disk: ``<root>/blobs/<ab>/<sha>.zst`` written temp-then-rename, so a blob file
either is complete or does not exist, and re-writing an existing ref is a no-op.
Durability is batched (``BlobDir.sync``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import json
import os
import re
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import zstandard

from milo_ray.store.integrity import IntegrityError, fsync_dir, raise_if_full
from milo_ray.store.schema import json_dumps

_REF = re.compile(r"^[0-9a-f]{64}$")
_LEVEL = 6  # traces are written once and read rarely: favour size a little


def encode(data: bytes | str | dict | list) -> tuple[str, bytes]:
    """Return (ref, compressed bytes) for ``data``."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        plain = b"B" + bytes(data)
    elif isinstance(data, str):
        plain = b"S" + data.encode("utf-8")
    elif isinstance(data, (dict, list, tuple)):
        plain = b"J" + json_dumps(data).encode("utf-8")
    else:
        raise TypeError(f"blobs hold bytes, str, dict or list, not {type(data).__name__}")
    ref = hashlib.sha256(plain).hexdigest()
    return ref, _compressor().compress(plain)


_PER_THREAD = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    # Making a compressor costs about as much as compressing a trace; one per thread,
    # because a ZstdCompressor must not be used by two threads at once.
    c = getattr(_PER_THREAD, "zstd", None)
    if c is None:
        c = _PER_THREAD.zstd = zstandard.ZstdCompressor(level=_LEVEL)
    return c


def decode(compressed: bytes, ref: str | None = None) -> Any:
    """The stored value; with ``ref``, first check the content still hashes to it
    (``IntegrityError`` naming the blob otherwise)."""
    try:
        plain = zstandard.ZstdDecompressor().decompress(compressed)
    except zstandard.ZstdError as e:
        raise IntegrityError(f"blob {ref or '?'}: not a zstd frame ({e}); the file is damaged") from None
    if ref is not None and hashlib.sha256(plain).hexdigest() != ref:
        raise IntegrityError(f"blob {ref}: content changed after it was written (it no longer hashes to its name); "
                             "restore it from a backup")
    tag, body = plain[:1], plain[1:]
    if tag == b"J":
        return json.loads(body.decode("utf-8"))
    if tag == b"S":
        return body.decode("utf-8")
    if tag == b"B":
        return body
    raise ValueError(f"corrupt blob: unknown type tag {tag!r}")


def check_ref(ref: str) -> str:
    if not isinstance(ref, str) or not _REF.match(ref):
        raise ValueError(f"blob ref must be 64 lowercase hex characters (a sha256), got {ref!r}")
    return ref


class BlobDir:
    """``<root>/blobs`` on a local filesystem.

    Blob files appear atomically (temp-then-rename) but are not fsynced one by one
    (an fsync costs ~0.5 ms, more than the rest of a rollout append): ``sync()``
    makes every blob written so far durable in one call, and the Parquet store runs
    it before each part file, so a row never becomes durable before the blob it
    references. A killed process loses nothing either way (the page cache survives
    it); ``sync`` only matters for power loss or a kernel crash.
    """

    def __init__(self, root: Path):
        self.root = Path(root) / "blobs"
        self._unsynced: set[Path] = set()
        self._lock = threading.Lock()
        self._made: set[str] = set()  # fan-out directories this object made or found

    def path(self, ref: str) -> Path:
        return self.root / ref[:2] / f"{ref}.zst"

    def write(self, ref: str, compressed: bytes) -> None:
        path = self.path(ref)
        if path.exists():  # content-addressed: an existing file already holds these bytes
            return
        if ref[:2] not in self._made:  # 256 directories: made once, not per blob
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(ref[:2])
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:  # its directory was removed since: make it again
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(compressed)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            raise_if_full(e, path)
            raise
        with self._lock:
            self._unsynced.add(path)

    def sync(self) -> None:
        """Make every blob written by this object durable."""
        with self._lock:
            pending, self._unsynced = self._unsynced, set()
        if not pending:
            return
        if _syncfs(self.root):
            return
        for path in pending:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for d in {p.parent for p in pending} | {self.root}:
            fsync_dir(d)

    def read(self, ref: str) -> bytes:
        try:
            return self.path(check_ref(ref)).read_bytes()
        except FileNotFoundError:
            raise KeyError(f"no blob {ref} under {self.root}") from None


def _syncfs(path: Path) -> bool:
    """One ``syncfs(2)`` for the filesystem holding ``path`` (Linux); False if unavailable."""
    libc = _libc()
    if libc is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return libc.syncfs(fd) == 0
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=1)
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.syncfs  # noqa: B018  (absent on very old glibc)
        return libc
    except (OSError, AttributeError):
        return None
