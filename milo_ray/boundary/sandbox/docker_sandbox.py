"""One Docker sandbox: a running container and what it holds on the host.

:class:`DockerSandbox` runs commands (``docker exec`` as the container's uid, each with a
marker so a timed-out command's processes can be found and killed), moves files in and out,
reads the container's OOM kills, hands the workspace to a fresh container for grading, and
releases, in order, the container, its private network, its leased uid and its volume
(:class:`_Held`). :class:`~milo_ray.boundary.sandbox.docker.DockerSandboxFactory` opens it;
see that module for what a container is given.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import tarfile
import uuid
import weakref
from pathlib import Path
from typing import Any

from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)

from milo_ray.boundary.sandbox.base import Sandbox, SandboxSpec, resolve_timeout
from milo_ray.boundary.sandbox.docker_control import (CONTROL_OUTPUT_CAP, CONTROL_TIMEOUT_S, SWEEP, find_main_pid,
                                                      last_json_list, oom_kills, remove_container)
from milo_ray.boundary.sandbox.docker_storage import grading_root
from milo_ray.boundary.sandbox.egress import PrivateNetwork
from milo_ray.boundary.sandbox.hostdirs import HostDirs
from milo_ray.boundary.sandbox.identity import UidLease
from milo_ray.boundary.sandbox.process import run_capped
from milo_ray.boundary.sandbox.volume import Volume

log = logging.getLogger(__name__)

# Every ``docker exec`` of a command carries this variable with a fresh value, so the
# processes it started (children inherit the environment) can be found and killed when the
# command times out: killing the ``docker exec`` client does not stop them -- dockerd does
# not forward the signal into the container.
EXEC_MARKER = "MILO_RAY_EXEC"
_TIMEOUT_EXIT = 124  # what coreutils ``timeout`` reports, so shells and agents read it alike

# Runs under the image's python3 as the exec user (so files belong to whoever runs the
# agent's commands). stdin: a JSON line of paths, then per file a decimal length line and
# the bytes. Prints a JSON list: None or the protocol's error per path.
_UPLOAD = r"""
import json, os, sys
src = sys.stdin.buffer
paths = json.loads(src.readline())
errors = []
for path in paths:
    body = src.read(int(src.readline()))
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(body)
        errors.append(None)
    except PermissionError:
        errors.append("permission_denied")
    except IsADirectoryError:
        errors.append("is_directory")
    except (NotADirectoryError, FileExistsError):
        errors.append("invalid_path")
    except OSError as e:
        errors.append(str(e))
print(json.dumps(errors))
"""


class _Held:
    """What one container holds on the host, released in order: the container (every
    process in it dies), its private network, its uid (processes of the uid killed,
    keyrings emptied: nothing of it may outlive the container), its volume. Not the
    sandbox itself, so a finalizer can hold it."""

    def __init__(self, docker: tuple[str, ...], lease: UidLease | None, volume: Volume | None) -> None:
        self.docker, self.lease, self.volume = docker, lease, volume
        self.container: str | None = None
        self.network: PrivateNetwork | None = None

    def release(self) -> None:
        try:
            if self.container is not None:
                remove_container(self.docker, self.container)
            if self.network is not None:
                self.network.close()
        finally:
            try:
                if self.lease is not None:
                    self.lease.release()
            finally:
                if self.volume is not None:
                    self.volume.close()


class DockerSandbox(Sandbox):
    """One running container (see the module docstring); build it with
    :meth:`DockerSandboxFactory.open`."""

    def __init__(self, *, factory: Any, spec: SandboxSpec, image: str, scratch: Path,
                 container: str, user: str, main_pid: str, held: _Held, dirs: HostDirs,
                 readonly_binds: dict[str, str] | None, env: dict[str, str], cgroup: Path | None) -> None:
        # The DockerSandboxFactory that opened it (typed loosely: it imports this module),
        # which starts the grading container.
        self._factory, self.spec, self._image, self._scratch = factory, spec, image, scratch
        self._docker, self._container, self._workdir = factory.docker, container, spec.workdir
        self._user = user
        self._as_user = ("-u", user)
        self._main_pid = main_pid
        self.command_timeout_s, self.output_cap_bytes = factory.command_timeout_s, factory.output_cap_bytes
        # The host directories behind the container's writable paths (docker_storage).
        self.dirs = dirs
        self._binds = dict(readonly_binds or {})
        self._env = dict(env)
        self._cgroup = cgroup
        self._held = held
        self._closed = False
        # Not a method of self: a finalizer holding the sandbox would keep it alive forever.
        self._remover = weakref.finalize(self, held.release)

    @property
    def id(self) -> str:
        return self._container

    @property
    def owner(self) -> tuple[int, int] | None:
        """The (uid, gid) leased to this container, or None when the worker is not root
        (then the container runs as the worker's own uid)."""
        return self._held.lease.owner if self._held.lease is not None else None

    @property
    def env(self) -> dict[str, str]:
        """The environment a command in the container gets (the image's, the task's and
        ``HOME``), as read inside at open; empty when the container was opened without the
        harness process's binds (nothing asked for it)."""
        return dict(self._env)

    def process_command(self, argv: list[str], readonly_binds: dict[str, str] | None = None
                        ) -> tuple[list[str], list[str], list[str]]:
        """How to run ``argv`` as one long-lived process in this container, as its uid,
        in the workdir, with the container's environment: ``(prefix, [], command)``; run
        ``prefix + command`` (a ``docker exec -i``). The host's environment does not reach
        the process: ``docker exec`` passes none of the client's variables.
        ``readonly_binds`` must be among those the container was opened with (a
        container's mounts are fixed when it starts)."""
        self._check_open()
        missing = {h: i for h, i in (readonly_binds or {}).items() if self._binds.get(h) != i}
        if missing:
            raise RuntimeError(f"container {self._container} was not opened with the read-only binds {missing}; "
                               "pass them as readonly_binds to DockerSandboxFactory.open")
        prefix = [*self._docker, "exec", "-i", *self._as_user, "-w", self._workdir, self._container]
        return prefix, [], list(argv)

    def fresh_for_grading(self, readonly_binds: dict[str, str] | None = None) -> "DockerSandbox":
        """Remove this container (every process in it dies, its uid is cleared) and start
        a fresh one from the same image with the same limits, a uid of its own and only
        the workspace carried over (on the same volume, when there is one): the verifier
        sees nothing else the agent left (not its /tmp, /logs, /tests, /solution, nor any
        process), and none of the harness process's binds; only ``readonly_binds`` (the
        host's copies of /logs/agent and /logs/artifacts)."""
        self._check_open()
        volume, self._held.volume = self._held.volume, None  # the fresh container keeps it
        try:
            self.close()
            root = grading_root(self.dirs, volume, self._scratch)
            return self._factory._start(self.spec, self._image, self._scratch, volume=volume, dirs_root=root,
                                        grading=True, carried=readonly_binds)
        except BaseException:
            if volume is not None:
                volume.close()
            raise

    def export_tar(self, path: str) -> list[str]:
        """The command writing ``path`` as a tar stream to stdout (links archived as links)."""
        return [*self._docker, "cp", f"{self._container}:{path}", "-"]

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``bash -c command`` in the workdir. ``timeout`` (seconds) None or 0 means the
        factory's ``command_timeout_s`` -- a sandbox command is never unbounded. On timeout
        the command's processes inside the container are killed (found by their exec
        marker) and the exit code is 124."""
        self._check_open()
        limit = resolve_timeout(timeout, self.command_timeout_s)
        marker = f"{EXEC_MARKER}={uuid.uuid4().hex}"
        run = run_capped([*self._docker, "exec", *self._as_user, "-e", marker, "-w", self._workdir, self._container,
                          "bash", "-c", command], timeout_s=limit, output_cap_bytes=self.output_cap_bytes)
        if not run.timed_out:
            return ExecuteResponse(output=run.output, exit_code=run.exit_code, truncated=run.truncated)
        # The docker exec client was killed; what it started inside still runs.
        self._sweep(marker)
        note = f"\n[command timed out after {limit:g} s; its processes were killed]"
        return ExecuteResponse(output=run.output + note, exit_code=_TIMEOUT_EXIT, truncated=run.truncated)

    def interrupt(self) -> None:
        """Kill every process in the container except docker-init and the main sleep; the
        files stay. When the sweep itself cannot run (e.g. a fork bomb holds every pid the
        container may have), the container is restarted: that kills everything and keeps
        its filesystem."""
        self._check_open()
        if self._sweep(None):
            return
        restart = run_capped([*self._docker, "restart", "-t", "0", self._container],
                             timeout_s=CONTROL_TIMEOUT_S, output_cap_bytes=CONTROL_OUTPUT_CAP)
        if restart.exit_code != 0:
            raise RuntimeError(f"could not interrupt container {self._container}: {restart.output.strip()}")
        self._main_pid = find_main_pid(self._docker, self._container, self._user)

    def oom_kills(self) -> int | None:
        """OOM kills in this container so far, from its memory cgroup
        (:func:`docker_control.oom_kills`); None once closed or without a counter."""
        if self._closed:
            return None
        return oom_kills(self._docker, self._container, self._cgroup)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (creating parent directories) as the user commands run as, in one
        ``docker exec -i`` into the image's python3 (which the file tools need anyway)."""
        self._check_open()
        results: list[str | None] = [None if path.startswith("/") else INVALID_PATH for path, _ in files]
        todo = [(path, data) for (path, data), err in zip(files, results) if err is None]
        if todo:
            payload = io.BytesIO()
            payload.write(json.dumps([path for path, _ in todo]).encode() + b"\n")
            for _, data in todo:
                payload.write(b"%d\n" % len(data))
                payload.write(data)
            run = run_capped([*self._docker, "exec", *self._as_user, "-i", self._container, "python3", "-c", _UPLOAD],
                             timeout_s=max(self.command_timeout_s, CONTROL_TIMEOUT_S),
                             output_cap_bytes=CONTROL_OUTPUT_CAP, stdin=payload.getvalue())
            errors = last_json_list(run.output, len(todo))
            if errors is None:
                errors = [f"upload failed (exit {run.exit_code}): {run.output.strip()[-500:]}"] * len(todo)
            it = iter(errors)
            results = [next(it) if err is None else err for err in results]
        return [FileUploadResponse(path=path, error=err) for (path, _), err in zip(files, results)]

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each file with ``docker cp`` (a tar stream; symlinks followed)."""
        self._check_open()
        return [self._download(path) for path in paths]

    def _download(self, path: str) -> FileDownloadResponse:
        if not path.startswith("/"):
            return FileDownloadResponse(path=path, content=None, error=INVALID_PATH)
        try:
            done = subprocess.run([*self._docker, "cp", "-L", f"{self._container}:{path}", "-"],
                                  capture_output=True, timeout=CONTROL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return FileDownloadResponse(path=path, content=None, error=f"docker cp timed out after {CONTROL_TIMEOUT_S:g} s")
        if done.returncode != 0:
            message = done.stderr.decode(errors="replace").strip()
            missing = "could not find the file" in message.lower() or "no such" in message.lower()
            return FileDownloadResponse(path=path, content=None, error=FILE_NOT_FOUND if missing else message)
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            member = tar.next()
            if member is None:
                return FileDownloadResponse(path=path, content=None, error=FILE_NOT_FOUND)
            if member.isdir():
                return FileDownloadResponse(path=path, content=None, error=IS_DIRECTORY)
            extracted = tar.extractfile(member)
            if extracted is None:  # a device or fifo: nothing to read
                return FileDownloadResponse(path=path, content=None, error=f"{path} is not a regular file")
            return FileDownloadResponse(path=path, content=extracted.read(), error=None)

    def close(self) -> None:
        """Remove the container (``docker rm -f``), end its private network, give its uid
        back (cleared) and unmount its volume; idempotent."""
        self._closed = True
        self._remover()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"sandbox {self._container} is closed")

    def _sweep(self, marker: str | None) -> bool:
        """Kill the marked processes (all but the main one when ``marker`` is None), as
        the container's uid: every process in it is that uid's, so no capability is
        needed to read their environment or kill them."""
        run = run_capped([*self._docker, "exec", *self._as_user, self._container, "sh", "-c", SWEEP, "sh",
                          self._main_pid, marker or ""],
                         timeout_s=CONTROL_TIMEOUT_S, output_cap_bytes=CONTROL_OUTPUT_CAP)
        if run.exit_code != 0:
            log.warning("kill sweep in %s failed (exit %s): %s", self._container, run.exit_code, run.output.strip())
        return run.exit_code == 0
