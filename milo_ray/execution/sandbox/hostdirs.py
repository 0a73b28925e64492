"""The host directories behind a sandbox's writable paths, and file transfer through them.

A bwrap or local sandbox keeps its writable state in host directories under the rollout's
scratch directory: the workspace (mounted at ``spec.workdir``), ``/logs``, ``/tests``,
``/solution``, ``/tmp`` and the sandbox's home. :class:`HostDirs` creates them, copies the
task's ``copy_in`` files in, and maps a sandbox path to its host file for
``upload_files``/``download_files`` -- refusing, with deepagents' error strings, any path
outside these directories or one that escapes them through a symlink (a symlink made by
the agent must never let a transfer read or write the host).
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path

from deepagents.backends.protocol import FileDownloadResponse, FileUploadResponse

from milo_ray.execution.sandbox.base import LOGS_DIR, SOLUTION_DIR, TESTS_DIR, SandboxSpec

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
                self._own_tree(host)
                os.chmod(host, os.stat(host).st_mode | 0o755)

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.lchown(path, *self.owner)

    def _own_tree(self, root: Path) -> None:
        self._own(root)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), *self.owner)

    def _own_new(self, target: Path, root: Path) -> None:
        """Hand ``target`` and the directories above it up to ``root`` to the owner."""
        if self.owner is None:
            return
        p = target
        while True:
            self._own(p)
            if p == root or p.parent == p:
                break
            p = p.parent

    def prepare_mountpoint(self, path: str) -> None:
        """Create the directories leading to ``path`` inside a writable mount, readable
        by all (a read-only host path bound below the home must be reachable by a
        sandbox user other than root)."""
        for inside, host in self.mounts.items():
            if _under(path, inside) and path != inside:
                rel = posixpath.relpath(posixpath.dirname(path), inside)
                d = host if rel == "." else host / rel
                d.mkdir(parents=True, exist_ok=True)
                p = d
                while p != host and p.parent != p:
                    os.chmod(p, 0o755)
                    p = p.parent
                return

    def host_path(self, path: str) -> Path | str:
        """The host file behind sandbox ``path``, or a deepagents error string."""
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            return "invalid_path"
        norm = posixpath.normpath(path)
        for inside, host in self.mounts.items():
            if _under(norm, inside):
                rel = posixpath.relpath(norm, inside)
                target = host if rel == "." else host / rel
                real_root = os.path.realpath(host)
                real = os.path.realpath(target)
                if real != real_root and not real.startswith(real_root + os.sep):
                    return "permission_denied"  # a symlink points out of the mount
                return target
        return "permission_denied"

    def _mount_root(self, target: Path) -> Path:
        for host in self.mounts.values():
            if target == host or host in target.parents:
                return host
        return target

    def _copy_in(self, src: Path, dest: str) -> None:
        target = self.host_path(dest)
        if isinstance(target, str):
            raise ValueError(
                f"SandboxSpec.copy_in destination {dest!r} is not under a writable sandbox directory "
                f"({', '.join(sorted(self.mounts))}): {target}"
            )
        if not src.exists():
            raise ValueError(f"SandboxSpec.copy_in source {str(src)!r} does not exist")
        if src.is_dir():
            # Docker's COPY of a directory copies its contents into the destination.
            shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
            return
        if dest.endswith("/") or target.is_dir():
            target = target / src.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)

    def upload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, content in files:
            target = self.host_path(path)
            if isinstance(target, str):
                out.append(FileUploadResponse(path=path, error=target))
                continue
            if target.is_dir():
                out.append(FileUploadResponse(path=path, error="is_directory"))
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
                self._own_new(target, self._mount_root(target))
            except NotADirectoryError:
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
            target = self.host_path(path)
            if isinstance(target, str):
                out.append(FileDownloadResponse(path=path, content=None, error=target))
            elif target.is_dir():
                out.append(FileDownloadResponse(path=path, content=None, error="is_directory"))
            elif not target.is_file():
                out.append(FileDownloadResponse(path=path, content=None, error="file_not_found"))
            else:
                try:
                    out.append(FileDownloadResponse(path=path, content=target.read_bytes(), error=None))
                except PermissionError:
                    out.append(FileDownloadResponse(path=path, content=None, error="permission_denied"))
        return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
