"""Files that reach the node that uses them through Ray's object store, never by path.

A rollout on another node cannot read the driver's disk: a Harbor task's directory, the
files a mutation's agent reads (parent harness, evidence, lineage files) exist only where
the driver runs -- on a laptop behind ``ray://``, or on a head whose disk the workers do
not mount. This module owns the one mechanism that moves them:

* :meth:`ShippedTree.pack` packs files into one deterministic tar (sorted members, owner
  0, gzip without a timestamp); its ``digest`` is the SHA-256 of those bytes, so the same
  content always has the same name, and a packed tree knows where it came from
  (``origin``, for messages only);
* :meth:`ShippedTree.publish` puts the bytes into the object store once per driver
  process and Ray job (trees with the same digest share one object);
* a published tree pickles as ``(digest, origin, ObjectRef)``: whatever carries it (a
  task's metadata, a mutation's arguments) carries a reference, not the bytes. An
  unpublished tree carries its bytes (processes without Ray, or a caller that did not
  publish: still correct, only not shared);
* :meth:`ShippedTree.local_path`, in any process, is the tree unpacked in this node's
  cache (:func:`cache_root`, one directory per digest). The first process of a node that
  needs a tree fetches it, checks its digest, unpacks it into a private staging
  directory and renames that into place, which is atomic: concurrent rollouts on a node
  either find the finished directory or race to rename identical content, and nobody
  ever sees a half-written one. Later rollouts reuse it without fetching.

Unpacked trees are shared by every rollout of the node, so their users copy before they
write (a sandbox copies a task's files into its own workspace; a mutation's workspace is
a copy). Nothing here writes into a run directory: results and traces go back to the
driver, the run store's single writer.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Where a node keeps unpacked trees (read by every process of the node that runs rollouts
# or mutations; set it on a node whose temp directory is small or not node-local).
CACHE_ENV = "MILO_RAY_SHIP_CACHE"
_COMPRESSLEVEL = 6  # level 9 costs far more time for little gain on source trees

_lock = threading.Lock()
# digest -> (Ray job id, ObjectRef): one put per driver process and job, whatever the
# number of trees (tasks, mutations) with that content.
_published: dict[str, tuple[str, Any]] = {}
# digest -> unpacked directory, for trees this process already found or unpacked.
_unpacked: dict[str, Path] = {}
_unpack_locks: dict[str, threading.Lock] = {}


class ShippingError(RuntimeError):
    """A shipped tree could not be made local (lost object, corrupt bytes, full disk).
    Raised in the process that needs the files: an infrastructure failure of that
    rollout or mutation, which its caller retries or records."""


def cache_root() -> Path:
    """This node's cache of unpacked trees: ``$MILO_RAY_SHIP_CACHE``, else a per-user
    directory under the system temp directory."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(tempfile.gettempdir()) / f"milo_ray-shipped-{os.getuid()}"


def _ray_job() -> str | None:
    """The connected Ray job's id, or None without Ray (refs die with their job)."""
    import ray

    if not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().get_job_id())


class ShippedTree:
    """A directory tree packed for the nodes that use it (see the module docstring).

    ``digest``: SHA-256 of the packed bytes; ``size``: their length; ``origin``: the
    path it was packed from, on the machine that packed it (never read elsewhere)."""

    __slots__ = ("digest", "size", "origin", "_data", "_ref", "_job")

    def __init__(self, digest: str, size: int, origin: str, *, data: bytes | None = None, ref: Any = None,
                 job: str | None = None) -> None:
        if data is None and ref is None:
            raise ValueError("ShippedTree: needs its bytes or an object reference")
        self.digest, self.size, self.origin = digest, int(size), origin
        self._data, self._ref, self._job = data, ref, job

    # --- packing (where the files are) ---------------------------------------------------
    @classmethod
    def pack(cls, source: str | Path | Mapping[str, str | Path], *, origin: str | None = None) -> "ShippedTree":
        """Pack a directory (its contents become the tree's root) or a mapping of tree
        paths to files or directories (``{"parent_dir": "/runs/x/h1", ...}``).
        ``ValueError`` names a path that is missing, special, or a dangling link."""
        if isinstance(source, (str, Path)) and not Path(source).is_dir():
            raise ValueError(f"cannot ship {str(source)!r}: not a directory (give a mapping to ship single files)")
        members: Mapping[str, str | Path] = {"": source} if isinstance(source, (str, Path)) else source
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for name in sorted(members):
                src = Path(members[name])
                if not src.exists():
                    raise ValueError(f"cannot ship {str(src)!r}: no such file or directory")
                _add(tar, src, name.strip("/"), root=src if src.is_dir() else src.parent)
        data = gzip.compress(raw.getvalue(), compresslevel=_COMPRESSLEVEL, mtime=0)
        where = origin if origin is not None else (str(source) if isinstance(source, (str, Path)) else
                                                   ", ".join(str(members[k]) for k in sorted(members)))
        return cls(hashlib.sha256(data).hexdigest(), len(data), where, data=data)

    # --- the object store (the driver) -----------------------------------------------------
    def publish(self) -> "ShippedTree":
        """Put the bytes into the object store, once per digest per driver process and
        Ray job (a no-op without Ray, or when already published in this job)."""
        job = _ray_job()
        if job is None or (self._ref is not None and self._job == job):
            return self
        if self._data is None:
            raise ShippingError(f"tree {self.digest[:12]} ({self.origin}) was published by another Ray job and its "
                                "bytes are not here to publish again")
        import ray

        with _lock:
            known = _published.get(self.digest)
            if known is None or known[0] != job:
                known = _published[self.digest] = (job, ray.put(self._data))
            self._job, self._ref = known
        return self

    @property
    def published(self) -> bool:
        return self._ref is not None and self._job == _ray_job()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A published tree travels as its reference; the bytes stay in the object store.
        if self._ref is not None:
            return (_rebuild, (self.digest, self.size, self.origin, None, self._ref, self._job))
        return (_rebuild, (self.digest, self.size, self.origin, self._data, None, None))

    # --- the node that needs the files ---------------------------------------------------
    def local_path(self) -> Path:
        """The tree unpacked in this node's cache (fetched and unpacked at most once per
        node; see the module docstring). :class:`ShippingError` when it cannot be."""
        got = _unpacked.get(self.digest)
        if got is not None and got.is_dir():
            return got
        with _lock:
            lock = _unpack_locks.setdefault(self.digest, threading.Lock())
        with lock:
            root = cache_root()
            final = root / self.digest
            if not final.is_dir():
                self._unpack(root, final)
            _unpacked[self.digest] = final
            return final

    def read_bytes(self) -> bytes:
        """The packed bytes, from this object or the object store; checked against the digest."""
        data = self._data
        if data is None:
            import ray

            try:
                data = ray.get(self._ref)
            except Exception as exc:
                raise ShippingError(f"tree {self.digest[:12]} ({self.origin}) could not be fetched from the object "
                                    f"store: {type(exc).__name__}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != self.digest:
            raise ShippingError(f"tree {self.digest[:12]} ({self.origin}): the fetched bytes do not match its digest")
        return data

    def _unpack(self, root: Path, final: Path) -> None:
        data = self.read_bytes()
        try:
            root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{self.digest[:12]}-", dir=root))
            try:
                with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as tar:
                    tar.extractall(staging, filter="data")
                try:
                    os.rename(staging, final)
                except OSError:
                    if not final.is_dir():
                        raise
                    # Another process of this node unpacked the same content first.
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        except (OSError, tarfile.TarError) as exc:
            raise ShippingError(f"tree {self.digest[:12]} ({self.origin}) could not be unpacked into {root}: "
                                f"{type(exc).__name__}: {exc} (set {CACHE_ENV} to a writable node-local "
                                "directory)") from exc

    # --- value semantics ---------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShippedTree) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        how = "published" if self._ref is not None else "inline"
        return f"ShippedTree({self.digest[:12]}, {self.size} B, {how}, from {self.origin!r})"


def _rebuild(digest: str, size: int, origin: str, data: bytes | None, ref: Any, job: str | None) -> ShippedTree:
    return ShippedTree(digest, size, origin, data=data, ref=ref, job=job)


def _add(tar: tarfile.TarFile, path: Path, name: str, *, root: Path) -> None:
    """Add ``path`` as ``name`` (a directory recursively, in sorted order) with the
    owner and group normalized, so equal content packs to equal bytes."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        target = path.resolve()
        if not target.exists():
            raise ValueError(f"cannot ship {str(path)!r}: a dangling symbolic link")
        if target.is_relative_to(root.resolve()) and not os.readlink(path).startswith("/"):
            _header(tar, path, name, st)  # a link inside the tree stays a link
            return
        # A link leaving the tree: ship what it points to (the other node has no such path).
        _add(tar, target, name, root=target if target.is_dir() else target.parent)
        return
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise ValueError(f"cannot ship {str(path)!r}: not a regular file, directory or link")
    if name:
        _header(tar, path, name, st)
    if stat.S_ISDIR(st.st_mode):
        for child in sorted(path.iterdir(), key=lambda p: p.name):
            _add(tar, child, f"{name}/{child.name}" if name else child.name, root=root)


def _header(tar: tarfile.TarFile, path: Path, name: str, st: os.stat_result) -> None:
    info = tar.gettarinfo(str(path), arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = int(st.st_mtime)
    if info.isreg():
        with open(path, "rb") as fh:
            tar.addfile(info, fh)
    else:
        tar.addfile(info)


def publish_all(value: Any) -> Any:
    """Publish every :class:`ShippedTree` found in ``value`` (dicts, lists, tuples, a
    task's ``metadata``); returns ``value``. What a driver calls before shipping tasks."""
    if isinstance(value, ShippedTree):
        value.publish()
    elif isinstance(value, Mapping):
        for v in value.values():
            publish_all(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            publish_all(v)
    elif hasattr(value, "metadata") and isinstance(getattr(value, "metadata"), Mapping):
        publish_all(value.metadata)
    return value
