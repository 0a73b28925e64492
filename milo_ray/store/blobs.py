"""Content-addressed blobs: encoding shared by every store, plus the on-disk layout.

A blob is one zstd frame whose plaintext starts with a one-byte type tag
(``J`` JSON for dict/list, ``S`` utf-8 text, ``B`` raw bytes) so ``get_blob`` returns
the type that was stored. The ref is the sha256 (hex) of tag + plaintext, so equal
content gives one blob, and a string never shares a ref with the same bytes. JSON is
canonical (sorted keys): equal dicts dedupe; tuples come back as lists.

On disk: ``<root>/blobs/<ab>/<sha>.zst`` written temp-then-rename, so a blob file
either is complete or does not exist, and re-writing an existing ref is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import zstandard

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
    return ref, zstandard.ZstdCompressor(level=_LEVEL).compress(plain)


def decode(compressed: bytes) -> Any:
    plain = zstandard.ZstdDecompressor().decompress(compressed)
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


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either nothing/the old file or all of it.

    The temp file sits in the same directory (same filesystem, so ``os.replace`` is an
    atomic rename) and starts with a dot, which every reader ignores."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


class BlobDir:
    """``<root>/blobs`` on a local filesystem."""

    def __init__(self, root: Path):
        self.root = Path(root) / "blobs"

    def path(self, ref: str) -> Path:
        return self.root / ref[:2] / f"{ref}.zst"

    def write(self, ref: str, compressed: bytes) -> None:
        path = self.path(ref)
        if path.exists():  # content-addressed: an existing file already holds these bytes
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, compressed)

    def read(self, ref: str) -> bytes:
        try:
            return self.path(check_ref(ref)).read_bytes()
        except FileNotFoundError:
            raise KeyError(f"no blob {ref} under {self.root}") from None
