"""The host directories behind a sandbox's writable paths, and file transfer through them.

A bwrap or local sandbox keeps its writable state in host directories under the rollout's
scratch directory: the workspace (mounted at ``spec.workdir``), ``/logs``, ``/tests``,
``/solution``, ``/tmp`` and the sandbox's home. :class:`HostDirs` creates them, copies the
task's ``copy_in`` files in, and maps a sandbox path to its host file for
``upload_files``/``download_files`` -- refusing, with deepagents' error strings, any path
outside these directories or one that goes through a symlink. Every host operation below a
mount's root is fd-relative and never follows a link (:mod:`milo_ray.boundary.nofollow`): the
agent may swap any directory for a link at any time, and the worker is often root.
Nothing is set up here inside a tree the sandbox can write beyond what a task's own files
need: mount points for read-only binds are bwrap's business (:mod:`bwrap`).
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path

from deepagents.backends.protocol import FileDownloadResponse, FileUploadResponse

from milo_ray.boundary.nofollow import (UnsafePath, chown_tree_nofollow, open_dir_nofollow, read_file_nofollow,
                                    write_file_nofollow)
from milo_ray.boundary.sandbox.base import LOGS_DIR, SOLUTION_DIR, TESTS_DIR, SandboxSpec

SANDBOX_HOME = "/root"  # HOME inside: where a task's image (run as root) has it
SANDBOX_TMP = "/tmp"


class HostDirs:
    """Sandbox path -> host directory for every writable directory of one sandbox."""

    def __init__(self, spec: SandboxSpec, scratch: Path, *, private_tmp: bool = True,
                 owner: tuple[int, int] | None = None) -> None:
        workdir = posixpath.normpath(spec.workdir)
        if not spec.workdir.startswith("/") or workdir == "/":
            raise ValueError(f"SandboxSpec.workdir must be an absolute path below /, got {spec.workdir!r}")
        reserved = (LOGS_DIR, TESTS_DIR, SOLUTION_DIR, SANDBOX_TMP)
        if any(_under(workdir, r) or _under(r, workdir) for r in reserved):
            raise ValueError(f"SandboxSpec.workdir {spec.workdir!r} overlaps one of {reserved}")
        self.workdir = workdir
        # (uid, gid) the sandbox's commands run as when it is not this process's: every
        # writable directory and every file put there is handed to it.
        self.owner = owner
        # A task whose workdir is (under) the home gets HOME = workdir, so the two mounts
        # never shadow each other.
        self.home = workdir if _under(workdir, SANDBOX_HOME) or _under(SANDBOX_HOME, workdir) else SANDBOX_HOME
        scratch = Path(scratch)
        layout = {
            workdir: scratch / "workspace",
            LOGS_DIR: scratch / "logs",
            TESTS_DIR: scratch / "tests",
            SOLUTION_DIR: scratch / "solution",
        }
        # Without a mount namespace (the local sandbox) commands see the host's /tmp, so
        # transfers to /tmp must reach it too (deepagents' edit stages files there).
        layout[SANDBOX_TMP] = scratch / "tmp" if private_tmp else Path("/tmp")
        if self.home != workdir:
            layout[self.home] = scratch / "home"
        for inside, host in layout.items():
            host.mkdir(parents=True, exist_ok=True)
            if inside != SANDBOX_TMP or private_tmp:
                self._own(host)
        # Longest sandbox prefix first, so the most specific mount wins.
        self.mounts: dict[str, Path] = dict(sorted(layout.items(), key=lambda kv: -len(kv[0])))
        for src, dest in spec.copy_in:
            self._copy_in(Path(src), dest)
        self._hand_over()

    def add_files(self, copy_in: tuple[tuple[str, str], ...]) -> None:
        """Copy a spec's ``copy_in`` files in after the directories exist (a sandbox
        opened ahead of its task)."""
        for src, dest in copy_in:
            self._copy_in(Path(src), dest)
        if copy_in:
            self._hand_over()

    def _hand_over(self) -> None:
        """Everything in a writable directory (copied-in files, a workspace prepared
        before the sandbox opened) is the sandbox user's to change, and each directory
        stays enterable: a directory copied onto a mount's root brings its own mode (a
        0700 temp dir), and bwrap (root without capabilities) must still chdir there."""
        if self.owner is None:
            return
        for host in self.mounts.values():
            if host != Path("/tmp"):
                chown_tree_nofollow(host, *self.owner)
                fd = open_dir_nofollow(host.parent, host.name)
                try:
                    os.fchmod(fd, os.fstat(fd).st_mode | 0o755)
                finally:
                    os.close(fd)

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.lchown(path, *self.owner)

    def locate(self, path: str) -> tuple[Path, str] | str:
        """(host directory of the mount, path below it: "" for the mount's root) behind
        sandbox ``path``, or a deepagents error string. The host directory is the
        worker's own; the path below it is the agent's, to be walked without following
        a link (:mod:`milo_ray.boundary.nofollow`)."""
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            return "invalid_path"
        norm = posixpath.normpath(path)
        for inside, host in self.mounts.items():
            if _under(norm, inside):
                rel = posixpath.relpath(norm, inside)
                return host, "" if rel == "." else rel
        return "permission_denied"

    def host_path(self, path: str) -> Path | str:
        """The host path behind sandbox ``path``, or a deepagents error string, for code
        that works on paths (the local sandbox's file tools, which run on the host
        anyway): a path whose links lead out of its mount is refused, but a link made
        after this answer is not seen -- transfers use :meth:`locate` instead."""
        where = self.locate(path)
        if isinstance(where, str):
            return where
        host, rel = where
        target = host / rel if rel else host
        real_root, real = os.path.realpath(host), os.path.realpath(target)
        if real != real_root and not real.startswith(real_root + os.sep):
            return "permission_denied"
        return target

    def _copy_in(self, src: Path, dest: str) -> None:
        where = self.locate(dest)
        if isinstance(where, str):
            raise ValueError(
                f"SandboxSpec.copy_in destination {dest!r} is not under a writable sandbox directory "
                f"({', '.join(sorted(self.mounts))}): {where}"
            )
        if not src.exists():
            raise ValueError(f"SandboxSpec.copy_in source {str(src)!r} does not exist")
        host, rel = where
        try:
            if src.is_dir():
                # Docker's COPY of a directory copies its contents into the destination.
                _copy_dir_in(src, host, rel)
                return
            into_dir = dest.endswith("/") or not rel or _is_dir(host, rel)
            target = "/".join(p for p in (rel, src.name) if p) if into_dir else rel
            write_file_nofollow(host, target, src.read_bytes(), mode=stat.S_IMODE(src.stat().st_mode))
        except UnsafePath as e:
            raise ValueError(f"SandboxSpec.copy_in destination {dest!r}: {e} (the host writes through no link)") from None

    def upload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, content in files:
            where = self.locate(path)
            if isinstance(where, str):
                out.append(FileUploadResponse(path=path, error=where))
                continue
            host, rel = where
            try:
                if not rel:
                    raise IsADirectoryError(path)
                write_file_nofollow(host, rel, content, owner=self.owner)
            except UnsafePath as e:
                # A directory where the file goes is the caller's mistake, a link the agent's.
                error = "is_directory" if e.reason == "a directory" else "permission_denied"
                out.append(FileUploadResponse(path=path, error=error))
                continue
            except IsADirectoryError:
                out.append(FileUploadResponse(path=path, error="is_directory"))
                continue
            except (NotADirectoryError, FileNotFoundError):
                out.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            except PermissionError:
                out.append(FileUploadResponse(path=path, error="permission_denied"))
                continue
            out.append(FileUploadResponse(path=path, error=None))
        return out

    def download(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            where = self.locate(path)
            if isinstance(where, str):
                out.append(FileDownloadResponse(path=path, content=None, error=where))
                continue
            host, rel = where
            try:
                if not rel:
                    raise IsADirectoryError(path)
                content = read_file_nofollow(host, rel)
            except UnsafePath as e:
                error = "is_directory" if e.reason == "a directory" else "permission_denied"
                out.append(FileDownloadResponse(path=path, content=None, error=error))
            except IsADirectoryError:
                out.append(FileDownloadResponse(path=path, content=None, error="is_directory"))
            except (FileNotFoundError, NotADirectoryError):
                out.append(FileDownloadResponse(path=path, content=None, error="file_not_found"))
            except PermissionError:
                out.append(FileDownloadResponse(path=path, content=None, error="permission_denied"))
            else:
                out.append(FileDownloadResponse(path=path, content=content, error=None))
        return out


def _is_dir(host: Path, rel: str) -> bool:
    try:
        os.close(open_dir_nofollow(host, rel))
        return True
    except (FileNotFoundError, UnsafePath):
        return False


def _copy_dir_in(src: Path, host: Path, rel: str) -> None:
    """Copy the task's directory ``src`` (trusted: its links are kept as links) into the
    mount ``host`` at ``rel``, every step below ``host`` fd-relative and never through a
    link already there."""
    for dirpath, dirnames, filenames in os.walk(src):
        sub = os.path.relpath(dirpath, src)
        here = "/".join(p for p in (rel, "" if sub == "." else sub) if p)
        fd = open_dir_nofollow(host, here, create=True)
        try:
            for name in list(dirnames) + filenames:
                path = os.path.join(dirpath, name)
                if os.path.islink(path):
                    try:
                        os.unlink(name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
                    os.symlink(os.readlink(path), name, dir_fd=fd)
                elif os.path.isfile(path):
                    with open(path, "rb") as f:
                        data = f.read()
                    write_file_nofollow(host, f"{here}/{name}" if here else name, data,
                                        mode=stat.S_IMODE(os.stat(path).st_mode))
        finally:
            os.close(fd)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
