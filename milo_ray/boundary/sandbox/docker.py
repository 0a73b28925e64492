"""The Docker sandbox: one container per rollout, from the task's image.

The image is ``spec.docker_image``, or the task's Dockerfile in ``spec.build_context``
built once per content (:mod:`docker_image`). The container's main process is a long
``sleep`` under Docker's ``--init`` (which reaps orphans); every command is a ``docker
exec`` into it, run through :func:`run_capped` for the per-command timeout and the output
cap.

Identity, as under bwrap (:mod:`identity`): a root worker leases each container a host uid
of its own from ``uid_range`` (gid the same) for as long as it exists, and the whole
container -- docker-init, the main process, every command -- runs as that uid
(``--user``), so no two running containers share a keyring or other per-uid kernel state;
removing the container gives the uid back with its processes killed and its keyrings
emptied. A worker that is not root runs its containers as its own uid (it cannot lease).
Docker's own seccomp profile refuses the keyring calls besides; a daemon without one is
refused before the run (:func:`docker_control.probe_daemon`) unless
``require_daemon_seccomp`` is false.

Hardening: no capabilities at all (``--cap-drop ALL``: every process of the container is
the one uid, so nothing needs any), ``no-new-privileges``, a read-only root. The writable
directories -- workspace, ``/logs``, ``/tests``, ``/solution``, ``/tmp`` (and HOME, which is
``/tmp``) -- are host directories bound in (so the daemon must run on the worker's host),
on one volume of ``spec.storage_mb`` when the task sets it (:mod:`docker_storage`), so that
cap bounds the total written wherever it lands (RLIMIT_FSIZE, one file, as well; that alone
without a root worker).

What is enforced besides: every container runs with ``--network none``; one whose task
allows the internet then gets the bwrap sandbox's private egress attached to its own
namespace (:mod:`egress`: public addresses only, no host port; the daemon must run on the
worker's host), never Docker's bridge. CPUs, memory (swap included) and the process count
(``--cpus``, ``--memory``/``--memory-swap``, ``--pids-limit``) from the spec, else the
factory's defaults; :meth:`DockerSandbox.oom_kills` reads the container's memory cgroup.

The harness process (``executor.agent=harness``) runs in the container too: the executor
passes its read-only binds (the package's code copy, the harness files, the gateway's
socket) to :meth:`DockerSandboxFactory.open`, which mounts them and probes once that the
image runs this worker's interpreter (mounted from the host) as the container's uid
(:mod:`docker_interpreter`); :meth:`DockerSandbox.process_command` is then a ``docker exec
-i``. Grading: :meth:`DockerSandbox.fresh_for_grading` removes the agent's container and
starts a fresh one from the same image, with a uid of its own, that gets only the agent's
workspace.

Containers carry the label ``milo-ray.sandbox=docker`` (and the task id and owner pid), so
leftovers are found with ``docker ps -a --filter label=milo-ray.sandbox``. ``close()``
removes the container, then gives its uid back and unmounts its volume; a
``weakref.finalize`` backstop does the same when the sandbox is garbage-collected unclosed
or the interpreter exits. Only a SIGKILLed process leaves its containers behind.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from pathlib import Path

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.docker_control import (CONTROL_OUTPUT_CAP, CONTROL_TIMEOUT_S, LABEL, DaemonFacts,
                                                      find_main_pid, memory_cgroup, probe_daemon)
from milo_ray.boundary.sandbox.docker_image import build_image, image_dirs
from milo_ray.boundary.sandbox.docker_interpreter import PRIVATE_PARENTS, probe_interpreter, skeleton
from milo_ray.boundary.sandbox.docker_sandbox import DockerSandbox, _Held
from milo_ray.boundary.sandbox.docker_storage import IMAGE_FILLED, bind_args, container_dirs
from milo_ray.boundary.sandbox.egress import container_network
from milo_ray.boundary.sandbox.egress import missing_tools as missing_network_tools
from milo_ray.boundary.sandbox.hostdirs import HostDirs
from milo_ray.boundary.sandbox.identity import DEFAULT_UID_RANGE, accounts_in, parse_uid_range
from milo_ray.boundary.sandbox.identity import lease as lease_uid
from milo_ray.boundary.sandbox.process import run_capped
from milo_ray.boundary.sandbox.volume import Volume, open_volume

__all__ = ["DockerSandbox", "DockerSandboxFactory"]

log = logging.getLogger(__name__)

# The main process only has to outlive the rollout (68 years; busybox's sleep lacks
# ``infinity``).
_MAIN = ("sleep", "2147483647")

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
    ``uid_range``: ``FIRST-LAST``, host uids no account uses, from which a root worker
    leases each container one of its own (:mod:`identity`, shared with bwrap's
    sandboxes on this machine); ``require_daemon_seccomp``: refuse a daemon that applies
    no seccomp profile (false: run without that layer, with a warning).
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
                 docker: tuple[str, ...] | list[str] = ("docker",), uid_range: str = DEFAULT_UID_RANGE,
                 require_daemon_seccomp: bool = True) -> None:
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
        if not isinstance(require_daemon_seccomp, bool):
            raise ValueError(f"sandbox.require_daemon_seccomp must be true or false, got {require_daemon_seccomp!r}")
        self.command_timeout_s, self.output_cap_bytes = float(command_timeout_s), int(output_cap_bytes)
        self.build_timeout_s, self.base_image_override = float(build_timeout_s), base_image_override
        self.host_mounts = tuple(str(m) for m in host_mounts)
        self.cpus, self.memory_mb, self.pids_limit = cpus, memory_mb, int(pids_limit)
        self.docker = tuple(str(a) for a in docker)
        self._uids = parse_uid_range(uid_range)
        self.uid_range, self.require_daemon_seccomp = str(uid_range), require_daemon_seccomp
        self._facts: DaemonFacts | None = None  # the daemon's, once it answered

    def unsupported(self, spec: SandboxSpec) -> str | None:
        if spec.docker_image is None and spec.build_context is None:
            return (f"task {spec.task_id}: sandbox=docker needs the task's image (spec.docker_image) or a build "
                    f"context with a Dockerfile (spec.build_context); the task has neither -- use sandbox=bwrap")
        if spec.docker_image is None and not (Path(spec.build_context) / "Dockerfile").is_file():
            return f"task {spec.task_id}: build_context {spec.build_context} has no Dockerfile"
        reason = self._daemon()
        if reason is not None:
            return f"task {spec.task_id}: {reason}"
        if spec.allow_internet and (why := missing_network_tools()):
            return f"task {spec.task_id}: it allows the internet, but {why}"
        return None

    def _daemon(self) -> str | None:
        """Why this daemon (or this worker) cannot run sandboxes, or None; asked once."""
        if self._facts is not None:
            return None
        facts = probe_daemon(self.docker)
        if isinstance(facts, str):
            return (f"no Docker daemon answers ({facts}); start one (as root: python -m milo_ray.testing.dockerd) "
                    "or use sandbox=bwrap")
        if not facts.seccomp:
            if self.require_daemon_seccomp:
                return (f"the Docker daemon applies no seccomp profile to containers (docker info SecurityOptions: "
                        f"{list(facts.security_options)}), which is the layer refusing the keyring, ptrace, mount "
                        "and namespace calls; run dockerd with its default seccomp profile, use sandbox=bwrap, or "
                        "set sandbox.require_daemon_seccomp=false to run without that layer")
            log.warning("docker sandbox: the daemon applies no seccomp profile (sandbox.require_daemon_seccomp="
                        "false): containers run without the filter on keyring, ptrace, mount and namespace calls")
        if os.geteuid() == 0 and (taken := accounts_in(self._uids)):
            return (f"sandbox.uid_range {self.uid_range} holds ids of host accounts ({', '.join(taken[:5])}); give a "
                    "range no account, group or subordinate-id range uses")
        self._facts = facts
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
        scratch = Path(scratch)
        image = spec.docker_image or build_image(self.docker, spec.task_id, Path(spec.build_context), scratch,
                                                 base_image_override=self.base_image_override,
                                                 timeout_s=self.build_timeout_s)
        volume = open_volume(spec, scratch)
        root = volume.path / "sandbox" if volume is not None else scratch / "sandbox"
        return self._start(spec, image, scratch, volume=volume, dirs_root=root, grading=False,
                           readonly_binds=readonly_binds)

    def _start(self, spec: SandboxSpec, image: str, scratch: Path, *, volume: Volume | None, dirs_root: Path,
               grading: bool, readonly_binds: dict[str, str] | None = None,
               carried: dict[str, str] | None = None) -> DockerSandbox:
        """Start a container whose writable directories are under ``dirs_root`` (a grading
        container's workspace is the agent's, the rest start as the image has them);
        ``volume`` is released with it, also when this fails."""
        lease = lease_uid(self._uids) if os.geteuid() == 0 else None
        held = _Held(self.docker, lease, volume)
        try:
            owner = lease.owner if lease is not None else (os.getuid(), os.getgid())
            user = f"{owner[0]}:{owner[1]}"
            filled = IMAGE_FILLED if grading else (spec.workdir, *IMAGE_FILLED)
            dirs = container_dirs(spec, dirs_root, lease.owner if lease is not None else None,
                                  image_dirs(self.docker, image, tuple(dict.fromkeys(filled))))
            slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", spec.task_id).strip("-.")[:40] or "task"
            held.container = container = f"milo-ray-{slug}-{uuid.uuid4().hex[:12]}"
            started = run_capped(self._run_argv(spec, image, container, user, dirs, {**(readonly_binds or {}),
                                                                                    **(carried or {})}),
                                 timeout_s=CONTROL_TIMEOUT_S, output_cap_bytes=CONTROL_OUTPUT_CAP)
            if started.exit_code != 0:
                raise RuntimeError(f"task {spec.task_id}: docker run {image} failed: {started.output.strip()[-2000:]}")
            main_pid = find_main_pid(self.docker, container, user)
            # carried binds need no probe: the grading container runs no harness process.
            env = probe_interpreter(self.docker, user, spec.task_id, image, container) if readonly_binds else {}
            if spec.allow_internet:
                held.network = container_network(self.docker, container)
            cgroup = memory_cgroup(self.docker, container)
        except BaseException:
            held.release()
            raise
        return DockerSandbox(factory=self, spec=spec, image=image, scratch=scratch, container=container, user=user,
                             main_pid=main_pid, held=held, dirs=dirs, readonly_binds=readonly_binds, env=env,
                             cgroup=cgroup)

    def _run_argv(self, spec: SandboxSpec, image: str, container: str, user: str, dirs: HostDirs,
                  readonly_binds: dict[str, str]) -> list[str]:
        argv = [*self.docker, "run", "-d", "--init", "--name", container,
                "--label", f"{LABEL}=docker", "--label", f"milo-ray.task={spec.task_id}",
                "--label", f"milo-ray.pid={os.getpid()}",
                "--pids-limit", str(self.pids_limit), "-w", spec.workdir, "--entrypoint", _MAIN[0],
                # Hardening: one uid for every process of the container (its own), no
                # capabilities, no privilege gain, a read-only root: only the bound host
                # directories below are writable.
                "--user", user, "--read-only", "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
                *bind_args(dirs)]
        if "HOME" not in spec.env:
            argv += ["-e", "HOME=/tmp"]
        # Never Docker's bridge (from which the host's ports are one hop away): a task that
        # allows the internet gets the same private egress as under bwrap, attached to the
        # container's own namespace once it runs (egress.container_network).
        argv += ["--network", "none"]
        cpus = spec.cpus if spec.cpus is not None else self.cpus
        if cpus is not None:
            # Docker refuses more CPUs than the daemon's host has; a task asking for 4 on a
            # 2-core CI machine still runs, with all of them.
            host_cpus = self._facts.cpus if self._facts is not None else float(cpus)
            argv += ["--cpus", f"{min(float(cpus), host_cpus):g}"]
        memory = spec.memory_mb if spec.memory_mb is not None else self.memory_mb
        if memory is not None:
            argv += ["--memory", f"{int(memory)}m", "--memory-swap", f"{int(memory)}m"]
        if spec.storage_mb is not None:
            # One file's size, as under bwrap; the total is the volume's (docker_storage).
            argv += ["--ulimit", f"fsize={int(spec.storage_mb) * 1024 * 1024}"]
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
        for host, inside in readonly_binds.items():
            if not str(inside).startswith("/") or ":" in f"{host}{inside}":
                raise ValueError(f"read-only bind {host} -> {inside}: both must be absolute paths without ':'")
            argv += ["-v", f"{host}:{inside}:ro"]
        return argv + [image, *_MAIN[1:]]
