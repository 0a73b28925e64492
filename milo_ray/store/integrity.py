"""Damage a run's files can suffer, detected: content hashes of part files, a full disk,
and the one-writer lock's holder.

Part hashes. Each table directory keeps ``_parts.sha256`` in ``sha256sum`` format (one
``<hex>  <part name>`` line per part, so ``cd <run>/rollouts && sha256sum -c --ignore-missing
_parts.sha256`` checks a run by hand). A part's line is appended and fsynced *before* its
temp file is renamed into place, so every part that exists has its line; a crash between
the two leaves a line naming a file that never appeared, which is harmless and pruned by
the next writer. A run written before hashes were kept has no such file: its parts are
read unverified, and the first writer to reopen it records their hashes as they are then.

Blobs need no list: their name is the sha256 of their content, checked on every read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path

# A leading "_": pyarrow.dataset and Spark skip it when reading a table directory.
LEDGER = "_parts.sha256"
_LINE = re.compile(r"^([0-9a-f]{64})  (part-[^/\s]+\.parquet)$")
_FULL = (errno.ENOSPC, errno.EDQUOT)


class IntegrityError(ValueError):
    """A stored file whose content is not what was written; the message names the file."""


class DiskFull(OSError):
    """The run directory's filesystem has no space left. Everything already stored stays
    intact (files appear only whole); the run stops and resumes once space is freed."""


class RunLocked(RuntimeError):
    """Another live process holds the run directory's writer lock."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def raise_if_full(exc: BaseException, where: Path) -> None:
    """Re-raise an out-of-space ``OSError`` as :class:`DiskFull` naming ``where``."""
    if isinstance(exc, OSError) and not isinstance(exc, DiskFull) and exc.errno in _FULL:
        raise DiskFull(exc.errno, f"no space left on the device holding {where} ({os.strerror(exc.errno)}); "
                                  "nothing already stored is lost: free space, then resume the run") from exc


class PartHashes:
    """The ``_parts.sha256`` list of one table directory."""

    def __init__(self, table_dir: Path):
        self.dir = Path(table_dir)
        self.path = self.dir / LEDGER
        self._known: dict[str, str] | None = None
        self.torn = False  # the last line was cut short (the next writer rewrites the list)

    def exists(self) -> bool:
        return self.path.exists()

    def _load(self) -> dict[str, str]:
        try:
            text = self.path.read_text("ascii")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            raise IntegrityError(f"{self.path}: unreadable hash list ({e}); restore it from a backup") from None
        known: dict[str, str] = {}
        lines = text.split("\n")
        self.torn = lines[-1] != ""
        # The last element is "" after a final newline; anything else there is a line
        # whose append a crash cut short: the part it named was never renamed into place.
        for number, line in enumerate(lines[:-1], 1):
            m = _LINE.match(line)
            if not m:
                raise IntegrityError(f"{self.path}:{number}: not a '<sha256>  <part name>' line ({line[:80]!r}); "
                                     "the hash list is damaged: restore it from a backup")
            known[m.group(2)] = m.group(1)
        return known

    def known(self, refresh: bool = False) -> dict[str, str]:
        if self._known is None or refresh:
            self._known = self._load()
        return self._known

    def record(self, name: str, digest: str) -> None:
        """Append (and fsync) ``name``'s hash; call before the part is renamed into place."""
        self.dir.mkdir(parents=True, exist_ok=True)
        line = f"{digest}  {name}\n".encode("ascii")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise_if_full(e, self.path)
            raise
        self.known()[name] = digest

    def verify(self, path: Path) -> bool:
        """Check ``path`` against its recorded hash: True when verified, False for a run
        that keeps no list (written before hashes were kept). ``IntegrityError`` when the
        content changed after it was written, or the list omits the part."""
        recorded = self.known().get(path.name) or self.known(refresh=True).get(path.name)
        if recorded is None:
            if not self.exists():
                return False
            raise IntegrityError(f"{path}: a part file this run's store never wrote (it is not in {LEDGER}); "
                                 f"move it out of {path.parent}")
        actual = file_sha256(path)
        if actual != recorded:
            raise IntegrityError(f"{path}: content changed after it was written (sha256 {actual[:12]}..., "
                                 f"{LEDGER} records {recorded[:12]}...); restore it from a backup, or move it "
                                 f"out of {path.parent} and its rows are no longer part of the run")
        return True

    def rewrite(self, entries: dict[str, str]) -> None:
        """Replace the list atomically with ``entries`` (drops lines of removed parts,
        adopts the parts of a run written before hashes were kept)."""
        text = "".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items()))
        atomic_write_bytes(self.path, text.encode("ascii"))
        self._known = dict(entries)


# ---- files that appear whole ----------------------------------------------------------
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
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        raise_if_full(e, path)
        raise
    fsync_dir(path.parent)



# ---- the writer lock's holder ----------------------------------------------------------
def holder_record() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode()


def describe_holder(lock_file: Path) -> str:
    """Who holds the lock, as the holder recorded it (best effort: a text for a message)."""
    try:
        info = json.loads(lock_file.read_text("utf-8") or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {int(info['pid'])} on {info['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
