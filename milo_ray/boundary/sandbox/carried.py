"""What the agent phase hands the grading sandbox besides the workspace: copies of
directories the agent wrote (Harbor's ``/logs/agent`` and ``/logs/artifacts``), shown to
the verifier read-only.

Grading runs in a fresh sandbox, so the host copies these out of the agent's sandbox after
its processes are dead: from the host directory behind them (bwrap, whose ``dirs.mounts``
name it), walked by :mod:`milo_ray.boundary.nofollow`; or from a tar stream of the container
(Docker: ``export_tar``, a ``docker cp`` without ``-L``, which archives a link as a link),
whose members are read here, never extracted by ``tarfile``. The agent wrote them, so:

* no symlink is ever followed, and only regular files and directories are carried: a
  symlink, hard link, fifo, socket or device is dropped, as is a tar name that would leave
  the directory (absolute, ``..``);
* the number of entries (files and directories) and the total size are capped
  (:data:`MAX_FILES`, :data:`MAX_BYTES`);
* what was dropped, and why, is recorded (:meth:`CarriedDirs.record`; the executor keeps
  it in the rollout's trace, beside the verifier's output).

The copies go to a fresh directory the host creates outside every tree a sandbox can write
(the rollout's scratch root): nothing is created, chmod-ed or chown-ed inside the agent's
tree. Files are 0644 and directories 0755, owned by the host user; the grading sandbox
binds them read-only. A directory the agent never made is carried empty, so the verifier
finds it where Harbor provides it.
"""

from __future__ import annotations

import os
import posixpath
import subprocess
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Sequence

from milo_ray.boundary.nofollow import Refusal, Tree, UnsafePath, read_tree_nofollow, safe_relpath, write_tree_nofollow

MAX_FILES = 10_000  # entries (files and directories) of all carried directories together
MAX_BYTES = 64 << 20  # bytes of all carried files together
MAX_DROPPED_KEPT = 100  # dropped entries named in the record (all are counted)
# One docker cp of a capped tree takes seconds; a hung daemon then fails the copy (recorded
# as dropped), not the rollout.
EXPORT_TIMEOUT_S = 120.0


@dataclass
class CarriedDirs:
    """The copies: ``binds`` maps each host copy to the sandbox path it is shown at
    (read-only); ``files``/``bytes``: what was carried; ``dropped``: what was not, and why."""

    binds: dict[str, str] = field(default_factory=dict)
    files: int = 0
    bytes: int = 0
    dropped: list[str] = field(default_factory=list)
    dropped_count: int = 0

    def record(self) -> dict[str, Any]:
        """What the rollout's trace keeps."""
        return {"dirs": sorted(self.binds.values()), "files": self.files, "bytes": self.bytes,
                "dropped": list(self.dropped), "dropped_count": self.dropped_count}

    def _add(self, inside: str, tree: Tree) -> None:
        self.files += len(tree.files)
        self.bytes += sum(len(b) for b in tree.files.values())
        for r in tree.refused:
            self.dropped_count += 1
            if len(self.dropped) < MAX_DROPPED_KEPT:
                self.dropped.append(f"{inside}/{r.path}: {r.reason}" if r.path != "." else f"{inside}: {r.reason}")


def carry_dirs(sandbox: Any, paths: Sequence[str], dest: Path, *, max_files: int = MAX_FILES,
               max_bytes: int = MAX_BYTES) -> CarriedDirs:
    """Copy each sandbox directory of ``paths`` out of ``sandbox`` (whose processes are
    dead) into ``dest``, a directory this call creates (module docstring: how)."""
    out = CarriedDirs()
    entries = 0
    dest.mkdir(mode=0o755)
    os.chmod(dest, 0o755)  # the host's own new directory: readable by the sandbox user
    for i, inside in enumerate(paths):
        target = dest / f"{i}-{posixpath.basename(inside.rstrip('/')) or 'root'}"
        files, size = max(0, max_files - entries), max(0, max_bytes - out.bytes)
        export = getattr(sandbox, "export_tar", None)
        tree = _from_tar(export(inside), files, size) if export is not None else _from_host(sandbox, inside, files, size)
        target.mkdir(mode=0o755)
        os.chmod(target, 0o755)
        write_tree_nofollow(target, tree)
        out.binds[str(target)] = inside
        out._add(inside, tree)
        entries += len(tree.files) + len(tree.dirs)
    return out


def _from_host(sandbox: Any, inside: str, max_files: int, max_bytes: int) -> Tree:
    """The tree behind sandbox path ``inside``, read from the host directory of the mount
    holding it: the mount's own directory (made by the host) is the trusted base, every
    component below it is opened without following a link."""
    mounts = getattr(getattr(sandbox, "dirs", None), "mounts", None) or {}
    norm = posixpath.normpath(inside)
    for mount, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if norm != mount and norm.startswith(mount.rstrip("/") + "/"):
            root = Path(host).joinpath(*safe_relpath(posixpath.relpath(norm, mount)))
            try:
                return read_tree_nofollow(root, max_files=max_files, max_bytes=max_bytes)
            except FileNotFoundError:
                return Tree()  # never made by the agent: carried empty
            except UnsafePath as exc:
                return Tree(refused=[Refusal(".", f"{exc.reason}, not carried")])
    return Tree(refused=[Refusal(".", "the sandbox shows no host directory there, not carried")])


class _Limited:
    """A read-only stream that ends after ``limit`` bytes, so a stream past the caps is
    not read to its end."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        self.raw, self.left, self.cut = raw, limit, False

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            self.cut = True
            return b""
        data = self.raw.read(self.left if n is None or n < 0 else min(n, self.left))
        self.left -= len(data)
        return data


def _from_tar(argv: list[str], max_files: int, max_bytes: int) -> Tree:
    """The tree in the tar stream ``argv`` writes (its top entry is the directory itself)."""
    tree = Tree()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    timer = threading.Timer(EXPORT_TIMEOUT_S, proc.kill)
    timer.start()
    # A member's header and padding take at most 1.5 KiB on top of its data.
    stream = _Limited(proc.stdout, max_bytes + 1536 * (max_files + 2))
    state = {"entries": 0, "bytes": 0}
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if not _tar_member(tar, member, tree, state, max_files, max_bytes):
                    break
    except (tarfile.TarError, OSError) as exc:
        if stream.cut:
            tree.refused.append(Refusal(".", "the rest was not carried (past the caps)"))
        elif tree.files or tree.dirs or not isinstance(exc, tarfile.ReadError):
            tree.refused.append(Refusal(".", f"the copy stopped ({exc}); the rest was not carried"))
    finally:
        proc.kill()
        err = proc.stderr.read(4096).decode(errors="replace") if proc.stderr else ""
        proc.wait()
        timer.cancel()
        proc.stdout.close()
        proc.stderr.close()
    missing = "no such" in err.lower() or "could not find" in err.lower()
    if proc.returncode not in (0, -9) and not missing and not (tree.files or tree.dirs or tree.refused):
        tree.refused.append(Refusal(".", f"could not be exported: {err.strip()[-300:]}"))
    return tree


def _tar_member(tar: tarfile.TarFile, member: tarfile.TarInfo, tree: Tree, state: dict[str, int],
                max_files: int, max_bytes: int) -> bool:
    """Take one member into ``tree``; False once the entry cap stops the copy."""
    parts = member.name.split("/")
    rel = "/".join(p for p in parts[1:] if p)  # below the top entry (the directory itself)
    if not rel:
        if not member.isdir():
            tree.refused.append(Refusal(".", "a symlink or not a directory, not carried"))
        return True
    try:
        safe_relpath(rel)
        if member.name.startswith("/") or ".." in parts:
            raise UnsafePath(rel, "")
    except UnsafePath:
        tree.refused.append(Refusal(rel, "a name that leaves the directory"))
        return True
    state["entries"] += 1
    if state["entries"] > max_files:
        tree.refused.append(Refusal(rel, f"more than {max_files} entries: the copy stopped here"))
        return False
    parent = posixpath.dirname(rel)
    if parent and parent not in tree.dirs:
        tree.refused.append(Refusal(rel, "its directory was not carried"))
    elif member.isdir():
        tree.dirs.append(rel)
    elif not member.isreg():
        kind = "a symlink" if member.issym() else "a hard link" if member.islnk() else "not a regular file"
        tree.refused.append(Refusal(rel, kind))
    elif rel in tree.files:
        tree.refused.append(Refusal(rel, "a second entry of the same name"))
    elif state["bytes"] + member.size > max_bytes:
        tree.refused.append(Refusal(rel, f"past the carried files' cap of {max_bytes} bytes"))
    else:
        data = tar.extractfile(member).read(member.size)
        state["bytes"] += len(data)
        tree.files[rel] = data
    return True

