"""Host file operations inside a tree a sandbox could write, never following a link.

A sandbox (a rollout's harness, a mutator's coding agent) can leave anything in the
directories it may write: a symlink to a host file or to ``/proc/self/environ``, a
directory swapped for a link between the host's check and its use, a fifo that blocks a
reader, a hard link to a file elsewhere, a sparse file of 10 GB, a hundred thousand
files. The host (often root) reads such trees (a mutator's child, a workspace's
artifacts), copies them (evidence into a workspace, files between sandboxes) and writes
into them (uploads, a task's files). Every such operation goes through this module:

* a walk is fd-relative: the tree's root is opened with ``O_NOFOLLOW | O_DIRECTORY`` and
  every entry below it relative to its parent's descriptor (``dir_fd``, ``os.scandir(fd)``)
  with ``O_NOFOLLOW``, so a directory swapped for a link after it was listed is refused
  at its open, never followed;
* only regular files and directories are taken; a symlink, fifo, socket, device, a file
  with more than one link or on another filesystem than the root is *refused*: skipped
  and named, with why, in :attr:`Tree.refused` (a caller that needs the whole tree, such
  as a mutator's child, rejects it on any refusal);
* counts and sizes are capped before anything is read (a sparse file is refused on its
  size, a huge tree once the cap is reached);
* a relative path given by untrusted text is checked (:func:`safe_relpath`): no absolute
  path, no ``..``, no empty or NUL component.

The caller's own base directory (a scratch directory the host made) is trusted and
opened as given; everything below it is not.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a fifo that slipped past the type check must not wait for a writer.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)

MAX_FILES = 10_000
MAX_BYTES = 64 << 20


class UnsafePath(ValueError):
    """A path inside a sandbox-writable tree that the host will not go through."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


@dataclass(frozen=True)
class Refusal:
    """One entry a walk did not take: its path relative to the tree's root, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class Tree:
    """What a walk read: ``files`` (relative POSIX path -> bytes), ``dirs`` (relative
    paths, parents first) and ``refused`` (what it would not take, and why)."""

    files: dict[str, bytes] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused

    def why(self, limit: int = 5) -> str:
        """The refusals in one line (the first ``limit``, then how many more)."""
        parts = [str(r) for r in self.refused[:limit]]
        if len(self.refused) > limit:
            parts.append(f"and {len(self.refused) - limit} more")
        return "; ".join(parts)


def safe_relpath(rel: str) -> list[str]:
    """The components of ``rel``, a relative path from untrusted text; raises
    :class:`UnsafePath` for an absolute path, ``..``, ``.`` or empty components, NUL."""
    if not isinstance(rel, str) or "\0" in rel:
        raise UnsafePath(repr(rel), "not a path (a NUL or not text)")
    if rel.startswith("/"):
        raise UnsafePath(rel, "an absolute path where a relative one is expected")
    parts = rel.split("/")
    for p in parts:
        if p in ("", ".", ".."):
            raise UnsafePath(rel, f"a {p or 'empty'!r} component (only plain names are taken)")
    return parts


def _open_child_dir(parent_fd: int, name: str, shown: str, *, create: bool, mode: int) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, mode, dir_fd=parent_fd)  # mkdir never follows its last component
        except FileExistsError:
            pass
        return _open_child_dir(parent_fd, name, shown, create=False, mode=mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(shown, "a symlink or not a directory") from None
        raise


def open_dir_nofollow(base: str | Path, rel: str = "", *, create: bool = False, mode: int = 0o755) -> int:
    """A descriptor of the directory ``base/rel``: ``base`` (the caller's own directory) is
    opened as given, every component of ``rel`` with ``O_NOFOLLOW`` relative to its parent
    (made with ``mode`` when missing and ``create``). Raises :class:`UnsafePath` when a
    component is a link or not a directory, FileNotFoundError when one is missing. The
    caller closes the descriptor."""
    fd = os.open(str(base), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    done: list[str] = []
    try:
        for part in (safe_relpath(rel) if rel else []):
            done.append(part)
            nxt = _open_child_dir(fd, part, "/".join(done), create=create, mode=mode)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _split(rel: str) -> tuple[str, str]:
    parts = safe_relpath(rel)
    return "/".join(parts[:-1]), parts[-1]


def _check_file(st: os.stat_result, shown: str, root_dev: int, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(shown, _kind(st.st_mode))
    if st.st_nlink > 1:
        raise UnsafePath(shown, f"a hard link ({st.st_nlink} names for one file)")
    if st.st_dev != root_dev:
        raise UnsafePath(shown, "on another filesystem than its tree")
    if st.st_size > max_bytes:
        raise UnsafePath(shown, f"too large ({st.st_size} bytes > {max_bytes})")


def _read_fd(fd: int, shown: str, max_bytes: int) -> bytes:
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:  # grew while being read
            raise UnsafePath(shown, f"too large (> {max_bytes} bytes)")


def read_file_nofollow(base: str | Path, rel: str, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``base/rel`` (``rel`` walked without following a link;
    a fifo, device, socket, hard link or a file over ``max_bytes`` raises
    :class:`UnsafePath`)."""
    parent, name = _split(rel)
    dfd = open_dir_nofollow(base, parent)
    try:
        root_dev = os.fstat(dfd).st_dev
        try:
            fd = os.open(name, _FILE, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath(rel, "a symlink") from None
            raise
        try:
            _check_file(os.fstat(fd), rel, root_dev, max_bytes)
            return _read_fd(fd, rel, max_bytes)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def write_file_nofollow(base: str | Path, rel: str, data: bytes, *, mode: int | None = None,
                        owner: tuple[int, int] | None = None) -> None:
    """Write ``data`` to ``base/rel``, making missing directories (0755) on the way, never
    through a link: a link or non-directory on the way raises :class:`UnsafePath`, as does
    an existing last component that is not a regular file with one link (it is replaced
    only when it is one). ``mode``: the file's mode (None: 0644 for a new file, an
    existing one keeps its own). ``owner``: (uid, gid) the directories on the way and the
    file get."""
    parts = safe_relpath(rel)
    fd = os.open(str(base), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts[:-1]):
            nxt = _open_child_dir(fd, part, "/".join(parts[:i + 1]), create=True, mode=0o755)
            os.close(fd)
            fd = nxt
            if owner is not None:
                os.fchown(fd, *owner)
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1):
            raise UnsafePath(rel, _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a hard link")
        # O_NOFOLLOW: a link planted after the check above fails the open instead.
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                      0o644 if mode is None else mode, dir_fd=fd)
        try:
            st = os.fstat(out)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                raise UnsafePath(rel, _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a hard link")
            if mode is not None:  # the mode asked for, whatever the umask or an earlier file had
                os.fchmod(out, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            if owner is not None:
                os.fchown(out, *owner)
        finally:
            os.close(out)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(rel, "a symlink") from None
        raise
    finally:
        os.close(fd)


def read_tree_nofollow(root: str | Path, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES,
                       max_file_bytes: int | None = None, skip: tuple[str, ...] = ()) -> Tree:
    """Every regular file under ``root`` (``root`` itself opened with ``O_NOFOLLOW``), walked
    fd-relative. Entries not taken are in :attr:`Tree.refused`: links, fifos, sockets,
    devices, hard links, files on another filesystem, files over ``max_file_bytes``
    (default ``max_bytes``), files past ``max_bytes`` in all, entries past ``max_files``
    (the walk stops there). ``skip``: top-level names left out silently. Raises
    :class:`UnsafePath` when ``root`` itself is a link or not a directory."""
    root = Path(root)
    per_file = max_bytes if max_file_bytes is None else min(max_file_bytes, max_bytes)
    try:
        fd = open_dir_nofollow(root.parent, root.name)
    except UnsafePath:
        raise UnsafePath(str(root), "a symlink or not a directory") from None
    tree = Tree()
    state = {"entries": 0, "bytes": 0}
    try:
        _walk_read(fd, "", os.fstat(fd).st_dev, tree, state, max_files, max_bytes, per_file, skip)
    finally:
        os.close(fd)
    return tree


def _walk_read(dfd: int, prefix: str, root_dev: int, tree: Tree, state: dict[str, int], max_files: int,
               max_bytes: int, per_file: int, skip: tuple[str, ...]) -> bool:
    """Read the directory open at ``dfd`` into ``tree``; False once a cap stopped the walk."""
    with os.scandir(dfd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        if not prefix and entry.name in skip:
            continue
        state["entries"] += 1
        if state["entries"] > max_files:
            tree.refused.append(Refusal(prefix or ".", f"more than {max_files} entries: the walk stopped here"))
            return False
        try:
            st = os.stat(entry.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while listed
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(entry.name, _DIR, dir_fd=dfd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise
                # Listed as a directory, a link (or gone) at its open: swapped in between.
                tree.refused.append(Refusal(rel, "changed into a symlink while being read"))
                continue
            try:
                if os.fstat(sub).st_dev != root_dev:
                    tree.refused.append(Refusal(rel, "on another filesystem than its tree"))
                    continue
                tree.dirs.append(rel)
                if not _walk_read(sub, rel + "/", root_dev, tree, state, max_files, max_bytes, per_file, skip):
                    return False
            finally:
                os.close(sub)
            continue
        if not stat.S_ISREG(st.st_mode):
            tree.refused.append(Refusal(rel, _kind(st.st_mode)))
            continue
        try:
            fd = os.open(entry.name, _FILE, dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOENT):
                raise
            tree.refused.append(Refusal(rel, "changed into a symlink while being read"))
            continue
        try:
            fst = os.fstat(fd)
            try:
                _check_file(fst, rel, root_dev, per_file)
                if state["bytes"] + fst.st_size > max_bytes:
                    raise UnsafePath(rel, f"past the tree's cap of {max_bytes} bytes")
                data = _read_fd(fd, rel, per_file)
            except UnsafePath as e:
                tree.refused.append(Refusal(rel, e.reason))
                continue
            state["bytes"] += len(data)
            tree.files[rel] = data
        finally:
            os.close(fd)
    return True


def write_tree_nofollow(dest: str | Path, tree: Tree, *, owner: tuple[int, int] | None = None) -> None:
    """Write ``tree`` (its directories, then its files) under ``dest`` (made when missing)
    without following a link (:func:`write_file_nofollow`)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for d in tree.dirs:
        os.close(open_dir_nofollow(dest, d, create=True))
    for rel, data in tree.files.items():
        write_file_nofollow(dest, rel, data, owner=owner)


def copy_tree_nofollow(src: str | Path, dest: str | Path, *, max_files: int = MAX_FILES,
                       max_bytes: int = MAX_BYTES) -> Tree:
    """Copy the regular files and directories under ``src`` to ``dest`` (links and special
    files refused, caps as :func:`read_tree_nofollow`); returns what was read, refusals
    included, for the caller to judge."""
    tree = read_tree_nofollow(src, max_files=max_files, max_bytes=max_bytes)
    write_tree_nofollow(dest, tree)
    return tree


def chown_tree_nofollow(root: str | Path, uid: int, gid: int) -> None:
    """Hand ``root`` and everything below it to ``uid:gid``, fd-relative: a link is
    chowned itself (never its target) and never descended into."""
    root = Path(root)
    fd = open_dir_nofollow(root.parent, root.name)
    try:
        os.fchown(fd, uid, gid)
        _walk_chown(fd, uid, gid)
    finally:
        os.close(fd)


def _walk_chown(dfd: int, uid: int, gid: int) -> None:
    with os.scandir(dfd) as it:
        names = [e.name for e in it]
    for name in names:
        try:
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
            sub = os.open(name, _DIR, dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                continue  # a file, a link or gone: nothing to descend into
            raise
        try:
            _walk_chown(sub, uid, gid)
        finally:
            os.close(sub)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"
