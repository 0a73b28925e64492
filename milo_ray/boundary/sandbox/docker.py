"""The Docker sandbox: one container per rollout, from the task's image.

The image is ``spec.docker_image``, or the task's Dockerfile in ``spec.build_context``
built once per content (tagged ``milo-ray-task:<hash of the context>``; a lock per tag
keeps concurrent opens of one task in a process from building it twice). The container's
main process is a long ``sleep`` under Docker's ``--init`` (which reaps orphans); every
command is a ``docker exec`` into it, run through :func:`run_capped` for the per-command
timeout and the output cap.

Hardening: commands run as a non-root user (``user``, default nobody) with no
capabilities and ``no-new-privileges``; the root filesystem is read-only, the task's
directories (workdir, ``/logs``, ``/tests``, ``/solution``) are anonymous volumes filled
from the image and removed with the container, ``/tmp`` is a tmpfs of ``tmpfs_mb``.

What is enforced: every container runs with ``--network none``; one whose task allows the
internet then gets the bwrap sandbox's private egress attached to its own namespace
(:mod:`egress`: public addresses only, no host port; the daemon must run on the worker's
host), never Docker's bridge. CPUs, memory (swap included) and the process count
(``--cpus``, ``--memory``/``--memory-swap``, ``--pids-limit``) from the spec, else the
factory's defaults; the timeout and output cap of each command. ``spec.storage_mb`` caps
``/tmp`` (and HOME, which is there) only: the workspace and the other task directories are
Docker volumes, and Docker caps those (or the writable layer) only on drivers with project
quotas (overlay2 over xfs), which these hosts lack.

Offline hosts cannot pull the public image a task's Dockerfile starts ``FROM``; the
factory's ``base_image_override`` replaces it at build time (tests and offline CI use
:func:`milo_ray.testing.dockerd.local_base_image` with its ``host_mounts``).

The harness process (``executor.agent=harness``) runs in the container too: the executor
passes its read-only binds (the package's code copy, the harness files, the gateway's
socket) to :meth:`DockerSandboxFactory.open`, which mounts them and probes once that the
image runs this worker's interpreter (mounted from the host) as the commands' user;
:meth:`DockerSandbox.process_command` is then a ``docker exec -i`` as that user. Grading:
the workspace is a named volume, and :meth:`DockerSandbox.fresh_for_grading` replaces the
agent's container by a fresh one from the same image that mounts only that volume.

Containers carry the label ``milo-ray.sandbox=docker`` (and the task id and owner pid), so
leftovers are found with ``docker ps -a --filter label=milo-ray.sandbox``. ``close()``
removes the container (and its workspace volume unless a grading container took it); a
``weakref.finalize`` backstop removes them when the sandbox is garbage-collected unclosed or the interpreter exits (a rollout that crashed before
``close``). Only a SIGKILLed process leaves its containers behind.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shlex
import subprocess
import tarfile
import threading
import uuid
import weakref
from pathlib import Path

from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)

from milo_ray.boundary.sandbox.base import LOGS_DIR, SOLUTION_DIR, TESTS_DIR, Sandbox, SandboxSpec, resolve_timeout
from milo_ray.boundary.sandbox.docker_interpreter import PRIVATE_PARENTS, probe_interpreter, skeleton
from milo_ray.boundary.sandbox.egress import container_network
from milo_ray.boundary.sandbox.egress import missing_tools as missing_network_tools
from milo_ray.boundary.sandbox.process import run_capped

log = logging.getLogger(__name__)

LABEL = "milo-ray.sandbox"
IMAGE_REPO = "milo-ray-task"
# Every ``docker exec`` of a command carries this variable with a fresh value, so the
# processes it started (children inherit the environment) can be found and killed when the
# command times out: killing the ``docker exec`` client does not stop them -- dockerd does
# not forward the signal into the container.
EXEC_MARKER = "MILO_RAY_EXEC"
# The main process only has to outlive the rollout (68 years; busybox's sleep lacks
# ``infinity``).
_MAIN = ("sleep", "2147483647")
# Control-plane calls (run, rm, the kill sweep, cp) answer in well under a second on an idle
# daemon; a daemon busy with builds and many containers can stall for tens of seconds.
_CONTROL_TIMEOUT_S = 120.0
_CONTROL_OUTPUT_CAP = 64 * 1024
# Keeps the build log's useful part (the failing step) without holding a huge log.
_BUILD_LOG_CAP = 256 * 1024
_TIMEOUT_EXIT = 124  # what coreutils ``timeout`` reports, so shells and agents read it alike

# One lock per image tag in this process: the second open of a task waits for the first
# one's build and then finds the image.
_BUILD_LOCKS: dict[str, threading.Lock] = {}
_BUILD_LOCKS_GUARD = threading.Lock()

# Kills, as root inside the container, every process except PID 1 (docker-init), the main
# ``sleep`` ($1) and itself -- or with a marker ($2), only the processes whose environment
# holds it. Zombies are skipped (already dead, reaped by their parent). It repeats while it
# finds victims, since a victim may fork between the listing and the kill. Builtins only in
# the loop (busybox-compatible): under ``--pids-limit`` a fork may be refused.
_SWEEP = r"""
main=$1; marker=$2; pass=0
while [ "$pass" -lt 20 ]; do
  found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$p" in 1|"$$"|"$main") continue;; esac
    st=; while read -r k v rest; do [ "$k" = State: ] && { st=$v; break; }; done 2>/dev/null < "$d/status"
    [ -z "$st" ] || [ "$st" = Z ] && continue
    if [ -n "$marker" ]; then
      tr '\000' '\n' < "$d/environ" 2>/dev/null | grep -qxF "$marker" || continue
    fi
    kill -9 "$p" 2>/dev/null && found=1
  done
  [ "$found" = 0 ] && exit 0
  pass=$((pass+1))
done
"""

# Right after ``docker run``, the only child of docker-init (PID 1) is the main process.
_MAIN_PID = r"""
for d in /proc/[0-9]*; do
  while read -r k v rest; do [ "$k" = PPid: ] && { [ "$v" = 1 ] && echo "${d#/proc/}"; break; }; done 2>/dev/null < "$d/status"
done
"""

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


class DockerSandbox(Sandbox):
    """One running container (see the module docstring); build it with
    :meth:`DockerSandboxFactory.open`."""

    def __init__(self, *, docker: tuple[str, ...], container: str, workdir: str, main_pid: str,
                 command_timeout_s: float, output_cap_bytes: int, user: str | None = None,
                 factory: "DockerSandboxFactory | None" = None, spec: SandboxSpec | None = None,
                 image: str | None = None, volume: str | None = None,
                 readonly_binds: dict[str, str] | None = None, env: dict[str, str] | None = None) -> None:
        self._docker, self._container, self._workdir = docker, container, workdir
        self._as_user = ("-u", user) if user else ()
        self._main_pid = main_pid
        self._command_timeout_s, self._output_cap = command_timeout_s, output_cap_bytes
        # What the harness process needs to know (see process_command).
        self.command_timeout_s, self.output_cap_bytes = command_timeout_s, output_cap_bytes
        self.spec = spec if spec is not None else SandboxSpec(task_id=container, workdir=workdir)
        self._factory, self._image = factory, image
        self._binds = dict(readonly_binds or {})
        self._env = dict(env or {})
        self._closed = False
        # The workspace's named volume, removed with the container unless a grading
        # container took it over (fresh_for_grading); a list so the finalizer sees that.
        self._volumes = [volume] if volume else []
        # Not a method of self: a finalizer holding the sandbox would keep it alive forever.
        self._remover = weakref.finalize(self, _remove_container, docker, container, self._volumes)
        self._network_closer: weakref.finalize | None = None  # the private network's, when it has one

    @property
    def id(self) -> str:
        return self._container

    @property
    def env(self) -> dict[str, str]:
        """The environment a command in the container gets (the image's, the task's and
        ``HOME``), as read inside at open; empty when the container was opened without the
        harness process's binds (nothing asked for it)."""
        return dict(self._env)

    def process_command(self, argv: list[str], readonly_binds: dict[str, str] | None = None
                        ) -> tuple[list[str], list[str], list[str]]:
        """How to run ``argv`` as one long-lived process in this container, as the
        commands' user, in the workdir, with the container's environment:
        ``(prefix, [], command)``; run ``prefix + command`` (a ``docker exec -i``). The
        host's environment does not reach the process: ``docker exec`` passes none of
        the client's variables. ``readonly_binds`` must be among those the container was
        opened with (a container's mounts are fixed when it starts)."""
        self._check_open()
        missing = {h: i for h, i in (readonly_binds or {}).items() if self._binds.get(h) != i}
        if missing:
            raise RuntimeError(f"container {self._container} was not opened with the read-only binds {missing}; "
                               "pass them as readonly_binds to DockerSandboxFactory.open")
        prefix = [*self._docker, "exec", "-i", *self._as_user, "-w", self._workdir, self._container]
        return prefix, [], list(argv)

    def fresh_for_grading(self, readonly_binds: dict[str, str] | None = None) -> "DockerSandbox":
        """Remove this container (every process in it dies with it) and start a fresh one
        from the same image with the same limits and only the workspace volume carried
        over: the verifier sees nothing else the agent left (not its /tmp, /logs, /tests,
        /solution, nor any process), and none of the harness process's binds; only
        ``readonly_binds`` (the host's copies of /logs/agent and /logs/artifacts)."""
        self._check_open()
        if self._factory is None or not self._volumes:
            raise RuntimeError(f"container {self._container} has no workspace volume to grade in a fresh container")
        volume = self._volumes.pop()  # this container's removal keeps it now
        self.close()
        return self._factory._start(self.spec, self._image, volume=volume, reuse_volume=True, carried=readonly_binds)

    def export_tar(self, path: str) -> list[str]:
        """The command writing ``path`` as a tar stream to stdout (links archived as links)."""
        return [*self._docker, "cp", f"{self._container}:{path}", "-"]

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``bash -c command`` in the workdir. ``timeout`` (seconds) None or 0 means the
        factory's ``command_timeout_s`` -- a sandbox command is never unbounded. On timeout
        the command's processes inside the container are killed (found by their exec
        marker) and the exit code is 124."""
        self._check_open()
        limit = resolve_timeout(timeout, self._command_timeout_s)
        marker = f"{EXEC_MARKER}={uuid.uuid4().hex}"
        run = run_capped([*self._docker, "exec", *self._as_user, "-e", marker, "-w", self._workdir, self._container,
                          "bash", "-c", command], timeout_s=limit, output_cap_bytes=self._output_cap)
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
                             timeout_s=_CONTROL_TIMEOUT_S, output_cap_bytes=_CONTROL_OUTPUT_CAP)
        if restart.exit_code != 0:
            raise RuntimeError(f"could not interrupt container {self._container}: {restart.output.strip()}")
        self._main_pid = _find_main_pid(self._docker, self._container)

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
                             timeout_s=max(self._command_timeout_s, _CONTROL_TIMEOUT_S),
                             output_cap_bytes=_CONTROL_OUTPUT_CAP, stdin=payload.getvalue())
            errors = _last_json_list(run.output, len(todo))
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
                                  capture_output=True, timeout=_CONTROL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return FileDownloadResponse(path=path, content=None, error=f"docker cp timed out after {_CONTROL_TIMEOUT_S:g} s")
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
        """Remove the container (``docker rm -f``) and end its private network; idempotent."""
        self._closed = True
        self._remover()
        if self._network_closer is not None:
            self._network_closer()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"sandbox {self._container} is closed")

    def _sweep(self, marker: str | None) -> bool:
        """Kill the marked processes (all but the main one when ``marker`` is None)."""
        # A command's processes are found by the marker in their environment, which only
        # their own user may read (root in the container has no CAP_SYS_PTRACE): that
        # sweep runs as the commands' user; the sweep of everything runs as root (CAP_KILL).
        who = self._as_user if marker and self._as_user else ("-u", "0")
        run = run_capped([*self._docker, "exec", *who, self._container, "sh", "-c", _SWEEP, "sh",
                          self._main_pid, marker or ""],
                         timeout_s=_CONTROL_TIMEOUT_S, output_cap_bytes=_CONTROL_OUTPUT_CAP)
        if run.exit_code != 0:
            log.warning("kill sweep in %s failed (exit %s): %s", self._container, run.exit_code, run.output.strip())
        return run.exit_code == 0


def _tmp_mb(tmpfs_mb: int, storage_mb: int | None) -> int:
    """The size of the container's /tmp: the factory's, and never more than the task's
    storage cap (the workspace and the other volumes are not capped: docs/security.md)."""
    return tmpfs_mb if storage_mb is None else max(1, min(tmpfs_mb, int(storage_mb)))


def _remove_container(docker: tuple[str, ...], container: str, volumes: list[str] | None = None) -> None:
    for argv, missing in (([*docker, "rm", "-f", "-v", container], "no such container"),
                          *(([*docker, "volume", "rm", "-f", v], "no such volume") for v in (volumes or ()))):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_CONTROL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("could not remove %s: %s", argv[-1], e)
            continue
        if done.returncode != 0 and missing not in done.stderr.lower():
            log.warning("could not remove %s: %s", argv[-1], done.stderr.strip())


def _find_main_pid(docker: tuple[str, ...], container: str) -> str:
    # docker-init forks the main process right after ``docker run`` returns; give it a
    # moment rather than failing the rollout on that race.
    for _ in range(50):
        run = run_capped([*docker, "exec", "-u", "0", container, "sh", "-c", _MAIN_PID],
                         timeout_s=_CONTROL_TIMEOUT_S, output_cap_bytes=_CONTROL_OUTPUT_CAP)
        pids = run.output.split()
        if run.exit_code == 0 and len(pids) == 1:
            return pids[0]
        threading.Event().wait(0.1)
    raise RuntimeError(f"container {container}: cannot find its main process ({run.output.strip()[-300:]})")


def _last_json_list(output: str, n: int) -> list[str | None] | None:
    lines = output.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, list) and len(value) == n else None


def override_from(dockerfile: str, image: str) -> str:
    """``dockerfile`` with every ``FROM`` of an external image replaced by ``image``
    (flags such as ``--platform`` and ``AS name`` kept; ``FROM`` an earlier stage kept)."""
    stages: set[str] = set()
    out = []
    for line in dockerfile.splitlines(keepends=True):
        m = re.match(r"(?i)^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", line.rstrip("\r\n"))
        if m is None:
            out.append(line)
            continue
        head, flags, source, tail = m.groups()
        alias = re.match(r"(?i)\s+AS\s+(\S+)", tail)
        if source.lower() not in stages:
            source = image
        if alias:
            stages.add(alias.group(1).lower())
        out.append(head + flags + source + tail + line[len(line.rstrip("\r\n")):])
    return "".join(out)


def context_digest(context: Path, dockerfile: str) -> str:
    """sha256 over the effective Dockerfile and every file of the build context (relative
    path, executable bit, content; symlinks by target), in path order."""
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + dockerfile.encode() + b"\0")
    for path in sorted(p for p in context.rglob("*") if not p.is_dir() or p.is_symlink()):
        rel = path.relative_to(context).as_posix().encode()
        if path.is_symlink():
            h.update(b"link\0" + rel + b"\0" + os.readlink(path).encode() + b"\0")
        else:
            data = path.read_bytes()
            mode = b"x" if os.access(path, os.X_OK) else b"-"
            h.update(b"file\0" + rel + b"\0" + mode + b"%d\0" % len(data) + data)
    return h.hexdigest()


def _build_lock(tag: str) -> threading.Lock:
    with _BUILD_LOCKS_GUARD:
        return _BUILD_LOCKS.setdefault(tag, threading.Lock())


class DockerSandboxFactory:
    """Opens :class:`DockerSandbox` es (the ``sandbox=docker`` config group).

    ``command_timeout_s``: default per-command timeout; ``output_cap_bytes``: per-command
    output cap; ``build_timeout_s``: limit of one image build; ``base_image_override``: an
    image that replaces the external ``FROM`` images of task Dockerfiles at build time
    (for offline hosts; None builds them as written); ``host_mounts``: host directories
    mounted read-only at the same path in every container (the host's programs for an
    image made by ``docker import``; empty for real task images); ``cpus``,
    ``memory_mb``: defaults for specs that name none (None: unlimited); ``pids_limit``:
    processes per container; ``docker``: the CLI command (e.g. ``["sudo", "docker"]``);
    ``user``: the non-root ``UID:GID`` commands run as (None: the image's user);
    ``tmpfs_mb``: size of the container's ``/tmp`` (its root filesystem is read-only).
    """

    name = "docker"
    # Can run a long-lived harness process inside (DockerSandbox.process_command); its
    # read-only binds are given to open(), since a container's mounts are fixed at start.
    hosts_harness = True
    binds_at_open = True

    def __init__(self, *, command_timeout_s: float = 600.0, output_cap_bytes: int = 1_000_000,
                 build_timeout_s: float = 1800.0, base_image_override: str | None = None,
                 host_mounts: tuple[str, ...] | list[str] = (), cpus: float | None = None,
                 memory_mb: int | None = None, pids_limit: int = 4096,
                 docker: tuple[str, ...] | list[str] = ("docker",), user: str | None = "65534:65534",
                 tmpfs_mb: int = 1024) -> None:
        for field, value in (("command_timeout_s", command_timeout_s), ("build_timeout_s", build_timeout_s),
                             ("output_cap_bytes", output_cap_bytes), ("pids_limit", pids_limit)):
            if not value > 0:
                raise ValueError(f"sandbox.{field} must be > 0, got {value!r}")
        for field, value in (("cpus", cpus), ("memory_mb", memory_mb)):
            if value is not None and not value > 0:
                raise ValueError(f"sandbox.{field} must be > 0 or null, got {value!r}")
        for mount in host_mounts:
            if not str(mount).startswith("/"):
                raise ValueError(f"sandbox.host_mounts: {mount!r} is not an absolute path")
        if not docker:
            raise ValueError("sandbox.docker must name the docker CLI, got an empty list")
        if base_image_override is not None and not str(base_image_override).strip():
            raise ValueError("sandbox.base_image_override must be an image name or null, got an empty string")
        self.command_timeout_s, self.output_cap_bytes = float(command_timeout_s), int(output_cap_bytes)
        self.build_timeout_s, self.base_image_override = float(build_timeout_s), base_image_override
        self.host_mounts = tuple(str(m) for m in host_mounts)
        self.cpus, self.memory_mb, self.pids_limit = cpus, memory_mb, int(pids_limit)
        self.docker = tuple(str(a) for a in docker)
        if user is not None and not re.fullmatch(r"[1-9][0-9]*:[0-9]+", str(user)):
            raise ValueError(f"sandbox.user={user!r}: give a numeric non-root UID:GID (e.g. 65534:65534) or null "
                             "for the image's own user")
        if not int(tmpfs_mb) > 0:
            raise ValueError(f"sandbox.tmpfs_mb must be > 0, got {tmpfs_mb!r}")
        self.user, self.tmpfs_mb = (None if user is None else str(user)), int(tmpfs_mb)
        self._host_cpus: float | None = None  # the daemon's CPU count, once it answered

    def unsupported(self, spec: SandboxSpec) -> str | None:
        if spec.docker_image is None and spec.build_context is None:
            return (f"task {spec.task_id}: sandbox=docker needs the task's image (spec.docker_image) or a build "
                    f"context with a Dockerfile (spec.build_context); the task has neither -- use sandbox=bwrap")
        if spec.docker_image is None and not (Path(spec.build_context) / "Dockerfile").is_file():
            return f"task {spec.task_id}: build_context {spec.build_context} has no Dockerfile"
        reason = self._daemon()
        if reason is not None:
            return (f"task {spec.task_id}: no Docker daemon answers ({reason}); start one (as root: "
                    f"python -m milo_ray.testing.dockerd) or use sandbox=bwrap")
        if spec.allow_internet and (why := missing_network_tools()):
            return f"task {spec.task_id}: it allows the internet, but {why}"
        return None

    def _daemon(self) -> str | None:
        if self._host_cpus is not None:
            return None
        try:
            done = subprocess.run([*self.docker, "info", "--format", "{{.NCPU}}"], capture_output=True, text=True,
                                  timeout=_CONTROL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            lines = (done.stderr or done.stdout).strip().splitlines()
            return lines[-1] if lines else f"docker info exited with {done.returncode}"
        self._host_cpus = float(done.stdout.strip())
        return None

    def open(self, spec: SandboxSpec, scratch: Path, readonly_binds: dict[str, str] | None = None) -> DockerSandbox:
        """A running container for ``spec``. ``readonly_binds`` (host path -> container
        path) are mounted read-only for a process started later with
        :meth:`DockerSandbox.process_command` (a container's mounts are fixed at start);
        with them, the container is probed once for running this worker's interpreter
        (the harness process runs on it) and its environment is read."""
        reason = self.unsupported(spec)
        if reason is not None:
            raise RuntimeError(reason)
        if not spec.workdir.startswith("/"):
            raise ValueError(f"task {spec.task_id}: spec.workdir must be absolute, got {spec.workdir!r}")
        image = spec.docker_image or self._build(spec, Path(scratch))
        # The workspace is a named volume (filled from the image at first mount), so that
        # grading can mount it into a fresh container (DockerSandbox.fresh_for_grading).
        volume = f"milo-ray-ws-{uuid.uuid4().hex[:16]}"
        return self._start(spec, image, volume=volume, reuse_volume=False, readonly_binds=readonly_binds)

    def _start(self, spec: SandboxSpec, image: str, *, volume: str, reuse_volume: bool,
               readonly_binds: dict[str, str] | None = None, carried: dict[str, str] | None = None) -> DockerSandbox:
        slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", spec.task_id).strip("-.")[:40] or "task"
        container = f"milo-ray-{slug}-{uuid.uuid4().hex[:12]}"
        argv = [*self.docker, "run", "-d", "--init", "--name", container,
                "--label", f"{LABEL}=docker", "--label", f"milo-ray.task={spec.task_id}",
                "--label", f"milo-ray.pid={os.getpid()}",
                "--pids-limit", str(self.pids_limit), "-w", spec.workdir, "--entrypoint", _MAIN[0],
                # Hardening: a read-only root (the task's directories are volumes, filled
                # from the image; /tmp a bounded tmpfs), no privilege gain. Capabilities:
                # only what root's control calls below need (make the directories, kill a
                # command's processes); the agent's commands run as a non-root user, which
                # holds none of them.
                "--read-only", "--tmpfs", f"/tmp:rw,nosuid,nodev,size={_tmp_mb(self.tmpfs_mb, spec.storage_mb)}m",
                "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
                *(a for c in ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL") for a in ("--cap-add", c))]
        # The grading container mounts the agent's workspace as it is: ``nocopy``, or an
        # emptied workspace would be refilled from the image.
        argv += ["-v", f"{volume}:{spec.workdir}" + (":nocopy" if reuse_volume else ""),
                 "--label", f"milo-ray.volume={volume}"]
        for d in dict.fromkeys((LOGS_DIR, TESTS_DIR, SOLUTION_DIR)):
            if d != spec.workdir:
                argv += ["-v", d]
        if self.user is not None and "HOME" not in spec.env:
            argv += ["-e", "HOME=/tmp"]
        # Never Docker's bridge (from which the host's ports are one hop away): a task that
        # allows the internet gets the same private egress as under bwrap, attached to the
        # container's own namespace once it runs (egress.container_network).
        argv += ["--network", "none"]
        cpus = spec.cpus if spec.cpus is not None else self.cpus
        if cpus is not None:
            # Docker refuses more CPUs than the daemon's host has; a task asking for 4 on a
            # 2-core CI machine still runs, with all of them.
            argv += ["--cpus", f"{min(float(cpus), self._host_cpus or float(cpus)):g}"]
        memory = spec.memory_mb if spec.memory_mb is not None else self.memory_mb
        if memory is not None:
            argv += ["--memory", f"{int(memory)}m", "--memory-swap", f"{int(memory)}m"]
        for key, value in spec.env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"task {spec.task_id}: spec.env key {key!r} is not a variable name")
            argv += ["-e", f"{key}={value}"]
        mounts = (*self.host_mounts, *(m for m in spec.host_readonly if m not in self.host_mounts))
        for private in PRIVATE_PARENTS:
            below = tuple(sorted(m for m in mounts if m.startswith(private + "/")))
            if below:
                argv += ["-v", f"{skeleton(private, below)}:{private}:ro"]
        for mount in mounts:
            argv += ["-v", f"{mount}:{mount}:ro"]
        for host, inside in {**(readonly_binds or {}), **(carried or {})}.items():  # carried: no probe
            if not str(inside).startswith("/") or ":" in f"{host}{inside}":
                raise ValueError(f"read-only bind {host} -> {inside}: both must be absolute paths without ':'")
            argv += ["-v", f"{host}:{inside}:ro"]
        argv += [image, *_MAIN[1:]]
        started = run_capped(argv, timeout_s=_CONTROL_TIMEOUT_S, output_cap_bytes=_CONTROL_OUTPUT_CAP)
        if started.exit_code != 0:
            _remove_container(self.docker, container, [volume])  # a created-but-not-started container
            raise RuntimeError(f"task {spec.task_id}: docker run {image} failed: {started.output.strip()[-2000:]}")
        env: dict[str, str] = {}
        try:
            main_pid = _find_main_pid(self.docker, container)
            dirs = " ".join(shlex.quote(d) for d in (spec.workdir, LOGS_DIR, TESTS_DIR, SOLUTION_DIR))
            # The grading container's workspace is the agent's, owned as the agent left it.
            own = f" && chown -R {self.user} {shlex.quote(spec.workdir)}" if self.user and not reuse_volume else ""
            made = run_capped([*self.docker, "exec", "-u", "0", container, "sh", "-c",
                               f"mkdir -p {dirs} && chmod 0777 {LOGS_DIR} {TESTS_DIR} {SOLUTION_DIR}{own}"],
                              timeout_s=_CONTROL_TIMEOUT_S, output_cap_bytes=_CONTROL_OUTPUT_CAP)
            if made.exit_code != 0:
                raise RuntimeError(f"task {spec.task_id}: cannot create the sandbox directories: {made.output.strip()}")
            if readonly_binds:
                env = probe_interpreter(self.docker, self.user, spec.task_id, image, container)
            network = container_network(self.docker, container) if spec.allow_internet else None
        except BaseException:
            _remove_container(self.docker, container, [volume])
            raise
        sandbox = DockerSandbox(docker=self.docker, container=container, workdir=spec.workdir, main_pid=main_pid,
                                command_timeout_s=self.command_timeout_s, output_cap_bytes=self.output_cap_bytes,
                                user=self.user, factory=self, spec=spec, image=image, volume=volume,
                                readonly_binds=readonly_binds, env=env)
        if network is not None:
            sandbox._network_closer = weakref.finalize(sandbox, network.close)
        return sandbox

    def _build(self, spec: SandboxSpec, scratch: Path) -> str:
        context = Path(spec.build_context)
        dockerfile = (context / "Dockerfile").read_text()
        if self.base_image_override is not None:
            dockerfile = override_from(dockerfile, self.base_image_override)
        tag = f"{IMAGE_REPO}:{context_digest(context, dockerfile)[:32]}"
        with _build_lock(tag):
            have = run_capped([*self.docker, "image", "inspect", "--format", "{{.Id}}", tag],
                              timeout_s=_CONTROL_TIMEOUT_S, output_cap_bytes=_CONTROL_OUTPUT_CAP)
            if have.exit_code == 0:
                return tag
            # The effective Dockerfile lives outside the context (it is the task's, maybe
            # rewritten); ``-f`` accepts that.
            scratch.mkdir(parents=True, exist_ok=True)
            effective = scratch / "Dockerfile.milo-ray"
            effective.write_text(dockerfile)
            built = run_capped([*self.docker, "build", "-t", tag, "--label", f"{LABEL}=docker",
                                "--label", f"milo-ray.task={spec.task_id}", "-f", str(effective), str(context)],
                               timeout_s=self.build_timeout_s, output_cap_bytes=_BUILD_LOG_CAP)
            if built.exit_code != 0 or built.timed_out:
                why = f"timed out after {self.build_timeout_s:g} s" if built.timed_out else f"exit {built.exit_code}"
                raise RuntimeError(f"task {spec.task_id}: building its image from {context} failed ({why}):\n"
                                   f"{built.output.strip()[-4000:]}")
            return tag
