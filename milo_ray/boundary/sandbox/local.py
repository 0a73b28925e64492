"""The ``local`` sandbox: an agent's commands run directly on the host, unconfined, in a
workspace directory under the rollout's scratch. For trusted debugging only (every open
logs a warning); it isolates nothing and limits only time and output.

There is no mount namespace, so the task's absolute paths (``spec.workdir`` such as
``/app``, ``/logs``, ``/tests``, ``/solution``, the home) are host directories under
scratch. They are rewritten where this class sees a path: ``upload_files`` /
``download_files`` and the deepagents file tools (``ls``, ``read``, ``write``, ``edit``,
``grep``, ``glob``, which take and return task paths). They are NOT rewritten inside shell
commands: a command runs in the workspace, so relative paths work, but ``cat /app/x`` reads
the host's ``/app/x``; ``/tmp`` is the host's ``/tmp``. Tasks whose scripts use absolute
task paths (most verifiers do) need ``sandbox=bwrap`` or ``sandbox=docker``. Code of the
framework's own that builds a command naming a task path asks :meth:`LocalSandbox.shell_path`
for it (the optimizer runner's ``cd`` into its workdir).

A task's ``memory_mb``, ``cpus`` and ``storage_mb`` are not enforced (the open's warning
names the ones asked for), and :meth:`oom_kills` is None: no failure here is ever put down
to memory on the sandbox's word.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from pathlib import Path

from deepagents.backends.protocol import (
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
)

from milo_ray.boundary.sandbox.base import Sandbox, SandboxSpec
from milo_ray.boundary.sandbox.base import resolve_timeout
from milo_ray.boundary.sandbox.bwrap import to_response
from milo_ray.boundary.sandbox.hostdirs import HostDirs
from milo_ray.boundary.sandbox.process import CappedProcess, start_capped

logger = logging.getLogger(__name__)

UNCONFINED_WARNING = "sandbox=local runs agent commands on the host unconfined"


class LocalSandboxFactory:
    """Opens :class:`LocalSandbox` es. ``command_timeout_s``: default per-command timeout
    (None: none); ``output_cap_bytes``: output kept per command."""

    name = "local"

    def __init__(self, command_timeout_s: float | None = 600.0, output_cap_bytes: int = 100_000) -> None:
        if command_timeout_s is not None and command_timeout_s <= 0:
            raise ValueError(f"sandbox.command_timeout_s must be > 0 or null, got {command_timeout_s}")
        if output_cap_bytes <= 0:
            raise ValueError(f"sandbox.output_cap_bytes must be > 0, got {output_cap_bytes}")
        self.command_timeout_s = command_timeout_s
        self.output_cap_bytes = int(output_cap_bytes)

    def unsupported(self, spec: SandboxSpec) -> str | None:
        # The host stands in for the task's image exactly as it does for bwrap.
        if spec.needs_docker:
            return f"task {spec.task_id}: its image cannot be replaced by the host ({spec.needs_docker}); run it with sandbox=docker"
        if spec.docker_image and not spec.build_context:
            return f"task {spec.task_id}: it runs in the prebuilt image {spec.docker_image}, which the host cannot stand in for; run it with sandbox=docker"
        return None

    def open(self, spec: SandboxSpec, scratch: Path) -> "LocalSandbox":
        why = self.unsupported(spec)
        if why:
            raise RuntimeError(why)
        ignored = [f"{k}={v}" for k, v in (("memory_mb", spec.memory_mb), ("cpus", spec.cpus),
                                             ("storage_mb", spec.storage_mb)) if v is not None]
        logger.warning("%s (task %s, workspace %s)%s", UNCONFINED_WARNING, spec.task_id, Path(scratch) / "workspace",
                       f"; not enforced: {', '.join(ignored)}" if ignored else "")
        return LocalSandbox(self, spec, Path(scratch))


class LocalSandbox(Sandbox):
    """One task's workspace on the host (see the module docstring for the path rules)."""

    def __init__(self, factory: LocalSandboxFactory, spec: SandboxSpec, scratch: Path) -> None:
        self._factory = factory
        self.spec = spec
        self._id = f"local-{uuid.uuid4().hex[:16]}"
        self.dirs = HostDirs(spec, scratch, private_tmp=False)
        self.workspace = self.dirs.mounts[self.dirs.workdir]
        # Only the host's PATH is kept (its tools are the point of running locally); the
        # rest of its environment, API keys included, is not handed to agent commands.
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(self.dirs.mounts[self.dirs.home]),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **spec.env,
        }
        self._lock = threading.Lock()
        self._running: set[CappedProcess] = set()
        self._closed = False

    @property
    def id(self) -> str:
        return self._id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        timeout_s = resolve_timeout(timeout, self._factory.command_timeout_s)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"sandbox {self._id} is closed")
            proc = start_capped(
                ["/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh", "-c", command],
                timeout_s=timeout_s,
                output_cap_bytes=self._factory.output_cap_bytes,
                env=self._env,
                cwd=str(self.workspace),
            )
            self._running.add(proc)
        try:
            run = proc.wait()
        finally:
            with self._lock:
                self._running.discard(proc)
        return to_response(run, timeout_s)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self.dirs.upload(files)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self.dirs.download(paths)

    def shell_path(self, path: str) -> str:
        # No mount namespace: a command's shell reaches a task path at its host directory.
        target = self.dirs.host_path(path)
        if isinstance(target, str):
            raise ValueError(f"{path}: not a path of this sandbox ({target})")
        return str(target)

    def interrupt(self) -> None:
        # Each command is its own process group; a process that left its group (setsid)
        # is beyond reach here -- one of the things sandbox=local does not confine.
        with self._lock:
            running = list(self._running)
        for proc in running:
            proc.kill()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.interrupt()

    # --- the deepagents file tools, with task paths mapped to the host and back ---

    def _host(self, path: str | None) -> str:
        target = self.dirs.host_path(self.dirs.workdir if path is None else path)
        if isinstance(target, str):
            raise _Refused(f"{path}: {target}")
        return str(target)

    def _task(self, host_path: str) -> str:
        # Most specific host directory first: scratch itself may lie under the host's /tmp.
        for inside, host in sorted(self.dirs.mounts.items(), key=lambda kv: -len(str(kv[1]))):
            root = str(host)
            if host_path == root:
                return inside
            if host_path.startswith(root.rstrip("/") + "/"):
                return inside.rstrip("/") + "/" + host_path[len(root.rstrip("/")) + 1 :]
        return host_path

    def _map_entries(self, entries: list | None) -> list | None:
        if entries is None:
            return None
        return [{**e, "path": self._task(e["path"])} if str(e.get("path", "")).startswith("/") else e for e in entries]

    def ls(self, path: str) -> LsResult:
        try:
            result = super().ls(self._host(path))
        except _Refused as exc:
            return LsResult(error=str(exc))
        result.entries = self._map_entries(result.entries)
        return result

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        try:
            return super().read(self._host(file_path), offset, limit)
        except _Refused as exc:
            return ReadResult(error=str(exc))

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        try:
            result = super().edit(self._host(file_path), old_string, new_string, replace_all)
        except _Refused as exc:
            return EditResult(error=str(exc))
        if result.path is not None:
            result.path = file_path
        return result

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        try:
            result = super().grep(pattern, self._host(path), glob, max_count=max_count)
        except _Refused as exc:
            return GrepResult(error=str(exc))
        result.matches = self._map_entries(result.matches)
        return result

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        try:
            result = super().glob(pattern, self._host(path))
        except _Refused as exc:
            return GlobResult(error=str(exc))
        result.matches = self._map_entries(result.matches)
        return result

    # BaseSandbox's async tools call aexecute directly, bypassing the mapping above.
    async def als(self, path: str) -> LsResult:
        return await asyncio.to_thread(self.ls, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await asyncio.to_thread(self.read, file_path, offset, limit)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        return await asyncio.to_thread(self.edit, file_path, old_string, new_string, replace_all)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        return await asyncio.to_thread(lambda: self.grep(pattern, path, glob, max_count=max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await asyncio.to_thread(self.glob, pattern, path)


class _Refused(Exception):
    """A task path outside the sandbox's directories (message: path and error code)."""
