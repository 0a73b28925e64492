"""The bubblewrap sandbox: each command runs in fresh Linux namespaces with the host's
system directories read-only and only the task's directories writable.

What a :class:`BwrapSandbox` mounts is :mod:`bwrap_mounts`' (the host's system
directories read-only, the task's writable directories, nothing else: the host's home
directories, ``/sys`` and every other path do not exist); this module is the process
side. A command gets a clean environment (never the host's, which
holds API keys), no network unless ``spec.allow_internet`` -- and then its own network
namespace with egress to public addresses only (:mod:`egress`: never the host's loopback,
ports or sockets, nor link-local or private ranges) --, no capabilities (as root,
bwrap would otherwise keep them all), a new session (no terminal injection), and it dies
with its parent. Every command is its own bwrap with its own PID namespace: when the
command ends (or is killed) every process it started ends with it, background ones
included, so state carries over between commands only through files.

No kernel state is shared between sandboxes: every command has its own IPC namespace (SysV
IPC, POSIX message queues); a worker running as root gives each open sandbox a host uid of
its own, leased from ``uid_range`` and cleared when it closes (:mod:`identity`: keyrings
and other per-uid objects are keyed by the host uid, which a user namespace would not
change); and every command runs under a seccomp filter (:mod:`seccomp`) refusing the
keyring calls, ptrace, mounts, new namespaces, BPF, perf events and the like, as Docker's
default profile does.

Limits (what :attr:`BwrapSandbox.limits` reports as enforced):

* ``pids_limit`` (fork bombs), ``spec.memory_mb`` and ``spec.cpus``: a cgroup per
  sandbox when this process may create one (cgroup v1, or a delegated v2 subtree).
  Without a memory cgroup, memory falls back to RLIMIT_AS per process (``prlimit``).
  Without a pids cgroup the process count falls back to RLIMIT_NPROC, but only when not
  running as root: the kernel never applies RLIMIT_NPROC to uid 0, so a root host without
  cgroups bounds a fork bomb only by the command timeout. CPU has no fallback.
* ``spec.storage_mb``: the total of every writable directory (workspace, ``/tmp``, home,
  ``/logs``, ``/tests``, ``/solution``): all of them live on one volume of that size
  (:mod:`volume`, root only), which grading keeps (``fresh_for_grading``). Without root
  only RLIMIT_FSIZE holds, i.e. the size of any one file (kept with a volume as well).
* Per-command timeout and output cap: :mod:`process`.

Cost: a command takes ~4 ms more than a bare subprocess (namespaces and mounts), plus,
with a cgroup, the move into it (on cgroup v1 an RCU grace period: ~5-15 ms, growing
with the machine's load); ``scripts/bench_sandbox.py`` measures both. The seccomp filter
adds one exec of bash per command (it opens the filter's descriptor for bwrap; 2.5-9.5 ms
more per ``execute("true")`` in interleaved runs on a loaded 2-core machine), and a
sandbox's uid lease, /proc scan and keyring clearing 3-9 ms per sandbox opened and closed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import shutil
import threading
import uuid
from pathlib import Path
from typing import Sequence

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse

from milo_ray.boundary.sandbox.base import Sandbox, SandboxSpec, resolve_timeout
from milo_ray.boundary.sandbox.cgroups import CgroupSupport, SandboxCgroup, probe_cgroups
from milo_ray.boundary.sandbox.bwrap_limits import enforced_limits, to_response
from milo_ray.boundary.sandbox.bwrap_mounts import (_CGROUP_DIR, _EXTRA_BIN, DEFAULT_HOST_READONLY, SANDBOX_PATH,
                                                    BwrapMountPlan, _python_alias, _readonly_args)
from milo_ray.boundary.sandbox.egress import PrivateNetwork
from milo_ray.boundary.sandbox.egress import missing_tools as missing_network_tools
from milo_ray.boundary.sandbox.volume import Volume, move_for_grading, open_volume
from milo_ray.boundary.sandbox.hostdirs import HostDirs
from milo_ray.boundary.sandbox.identity import DEFAULT_UID_RANGE, UidLease, accounts_in, parse_uid_range
from milo_ray.boundary.sandbox.identity import lease as lease_uid
from milo_ray.boundary.sandbox.seccomp import SeccompUnavailable
from milo_ray.boundary.sandbox.seccomp import launcher as seccomp_launcher
from milo_ray.boundary.sandbox.process import CappedProcess, run_capped, start_capped

logger = logging.getLogger(__name__)

# How long the one-time probe of bwrap may take; starting a sandbox takes milliseconds, so
# 30 s only trips on a machine that is hung, and then failing early is right.
_PROBE_TIMEOUT_S = 30.0


class BwrapSandboxFactory:
    """Opens :class:`BwrapSandbox` es. ``command_timeout_s``: default per-command timeout
    (None: none); ``output_cap_bytes``: output kept per command; ``host_readonly``: host
    paths visible read-only at the same path (symlinks are recreated as symlinks);
    ``pids_limit``: processes per sandbox (None: no limit); ``cgroups``: use cgroups for
    the limits when the machine allows; ``bwrap_path``: the bwrap executable;
    ``uid_range``: ``FIRST-LAST``, host uids no account uses, from which each sandbox
    leases one of its own for as long as it is open when the worker runs as root
    (:mod:`identity`; a worker that is not root runs them as itself, in a user namespace);
    ``own_volume``: a root worker puts the writable directories of a task without
    ``storage_mb`` on a volume of the sandbox's own too (no cap: :func:`volume.open_volume`),
    so that no bind shows a host path; the workspace is then read through
    ``fresh_for_grading``, not at ``scratch/workspace`` (False: callers that prepare or read
    ``scratch/workspace`` themselves)."""

    name = "bwrap"
    # Can run a long-lived harness process inside (process_command).
    hosts_harness = True

    def __init__(
        self,
        command_timeout_s: float | None = 600.0,
        output_cap_bytes: int = 100_000,
        host_readonly: Sequence[str] = DEFAULT_HOST_READONLY,
        pids_limit: int | None = 1024,
        cgroups: bool = True,
        bwrap_path: str = "bwrap",
        uid_range: str = DEFAULT_UID_RANGE,
        own_volume: bool = False,
    ) -> None:
        if command_timeout_s is not None and command_timeout_s <= 0:
            raise ValueError(f"sandbox.command_timeout_s must be > 0 or null, got {command_timeout_s}")
        if output_cap_bytes <= 0:
            raise ValueError(f"sandbox.output_cap_bytes must be > 0, got {output_cap_bytes}")
        if pids_limit is not None and pids_limit < 8:
            raise ValueError(f"sandbox.pids_limit must be >= 8 (bwrap and a shell need a few) or null, got {pids_limit}")
        for p in host_readonly:
            if not str(p).startswith("/"):
                raise ValueError(f"sandbox.host_readonly entries must be absolute paths, got {p!r}")
        self._uids = parse_uid_range(uid_range)
        self.uid_range = str(uid_range)
        self.command_timeout_s = command_timeout_s
        self.output_cap_bytes = int(output_cap_bytes)
        self.host_readonly = tuple(str(p) for p in host_readonly)
        self.pids_limit = pids_limit
        self.cgroups = cgroups
        self.bwrap_path = bwrap_path
        self.own_volume = bool(own_volume)
        self._lock = threading.Lock()
        self._probed: tuple[str | None, CgroupSupport] | None = None

    def __getstate__(self) -> dict:
        # Picklable (to ship the factory to a worker): the lock is per process.
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _probe(self) -> tuple[str | None, CgroupSupport]:
        """(why bwrap cannot run here or None, cgroup support), computed once."""
        with self._lock:
            if self._probed is None:
                support = probe_cgroups() if self.cgroups else CgroupSupport()
                self._probed = (self._probe_bwrap() or _probe_identity(self._uids), support)
                logger.info("bwrap sandbox: cgroup controllers usable here: %s", sorted(support.parents) or "none")
                if self.pids_limit is not None and not support.has("pids") and os.geteuid() == 0:
                    logger.warning(
                        "bwrap sandbox: pids_limit=%s cannot be enforced (no pids cgroup, and RLIMIT_NPROC "
                        "does not apply to root); a fork bomb is bounded only by the command timeout",
                        self.pids_limit,
                    )
            return self._probed

    def _lease_uid(self) -> UidLease | None:
        """A uid of the sandbox's own while it is open (root only: nobody else may switch)."""
        return lease_uid(self._uids) if os.geteuid() == 0 else None

    def _probe_bwrap(self) -> str | None:
        exe = shutil.which(self.bwrap_path)
        if exe is None:
            return f"{self.bwrap_path!r} is not installed (apt-get install bubblewrap)"
        self.bwrap_path = exe
        argv = [exe, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
        argv += _readonly_args(self.host_readonly) + ["--proc", "/proc", "--dev", "/dev", "python3", "-c", "pass"]
        run = run_capped(argv, timeout_s=_PROBE_TIMEOUT_S, output_cap_bytes=4096, env={"PATH": SANDBOX_PATH})
        if run.exit_code != 0:
            return f"bwrap cannot create namespaces or run python3 here: {run.output.strip()[:300]}"
        return None

    def unsupported(self, spec: SandboxSpec) -> str | None:
        if spec.needs_docker:
            return f"task {spec.task_id}: its image cannot be replaced by the host ({spec.needs_docker}); run it with sandbox=docker"
        if spec.docker_image and not spec.build_context:
            return f"task {spec.task_id}: it runs in the prebuilt image {spec.docker_image}, which the host cannot stand in for; run it with sandbox=docker"
        workdir = posixpath.normpath(spec.workdir)
        for ro in self.host_readonly:
            if workdir == ro or workdir.startswith(ro.rstrip("/") + "/"):
                return (
                    f"task {spec.task_id}: its workdir {spec.workdir} lies under the read-only host path {ro} "
                    "(sandbox.host_readonly); run it with sandbox=docker"
                )
        error, _ = self._probe()
        if error:
            return f"task {spec.task_id}: {error}; run it with sandbox=docker"
        if spec.allow_internet and (why := missing_network_tools()):
            return f"task {spec.task_id}: it allows the internet, but {why}"
        return None

    def open(self, spec: SandboxSpec, scratch: Path, readonly_binds: dict[str, str] | None = None) -> "BwrapSandbox":
        """A sandbox for ``spec``; ``readonly_binds`` (host path -> sandbox path) are shown
        read-only to every command (the grading sandbox's copies of the agent phase's
        /logs/agent and /logs/artifacts)."""
        why = self.unsupported(spec)
        if why:
            raise RuntimeError(why)
        return BwrapSandbox(self, spec, Path(scratch), self._probe()[1], readonly_binds)


class BwrapSandbox(BwrapMountPlan, Sandbox):
    """One task's bwrap sandbox (see the module docstring for what it isolates)."""

    def __init__(self, factory: BwrapSandboxFactory, spec: SandboxSpec, scratch: Path, support: CgroupSupport,
                 readonly_binds: dict[str, str] | None = None, *, volume: Volume | None = None,
                 dirs_root: Path | None = None) -> None:
        self._factory = factory
        self._scratch, self._support = scratch, support
        self._binds = dict(readonly_binds or {})
        self.spec = spec
        self._id = f"bwrap-{uuid.uuid4().hex[:16]}"
        # Dropping to the sandbox's own uid takes root; a worker that is not root already is one.
        self._lease = factory._lease_uid()
        self.owner = self._lease.owner if self._lease is not None else None
        # Every writable directory on one volume of spec.storage_mb (:mod:`volume`); None
        # without a cap or where none can be mounted (then RLIMIT_FSIZE only: see limits).
        self._volume = volume if volume is not None else open_volume(spec, scratch, own=factory.own_volume)
        # The worker's own directory (never mounted writable) for the skeletons of
        # _late_binds: on the neutral root where there is one (made when first needed).
        self._mountpoints: Path | None = None
        # Copies on the neutral root of the read-only binds given at open (host path -> copy).
        self._staged: dict[str, Path] = {}
        try:
            self.dirs = HostDirs(spec, dirs_root or (self._volume.path / "sandbox" if self._volume else scratch),
                                 owner=self.owner)
            self._binds = {self._neutral_source(host): inside for host, inside in self._binds.items()}
        except BaseException:
            self._release_volume()
            self._release_neutral()
            raise
        self._lock = threading.Lock()
        self._running: set[CappedProcess] = set()
        self._closed = False
        self._cgroup = SandboxCgroup(
            support, f"milo_ray_{self._id}", pids_limit=factory.pids_limit, memory_mb=spec.memory_mb, cpus=spec.cpus
        )
        self.limits, self._launcher = enforced_limits(self._cgroup, spec, factory.pids_limit, self._volume)
        self._python = _python_alias()
        self._env = {
            "PATH": SANDBOX_PATH + (f":{_EXTRA_BIN}" if self._python else ""),
            "HOME": self.dirs.home,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "TERM": "dumb",
            **spec.env,
        }
        self._bwrap_argv = self._build_bwrap_argv(self._binds)
        self.command_timeout_s = factory.command_timeout_s
        self.output_cap_bytes = factory.output_cap_bytes
        # The host directory behind the workspace: grading moves it into a fresh sandbox.
        self.workspace_dir = self.dirs.mounts[self.dirs.workdir]
        try:
            self._network = self._private_network()
        except BaseException:
            self._release_volume()
            raise
        if self._volume is not None:
            # The executor grades a workspace by renaming it next to a fresh sandbox's
            # directories, which cannot leave a volume: a sandbox on one offers
            # fresh_for_grading instead (as Docker's does), keeping the workspace on it.
            self.fresh_for_grading = self._fresh_on_volume

    @property
    def id(self) -> str:
        return self._id

    @property
    def env(self) -> dict[str, str]:
        """The environment every process inside gets."""
        return dict(self._env)

    def _release_volume(self) -> None:
        if self._volume is not None:
            self._volume.close()
            self._volume = None

    def _fresh_on_volume(self, readonly_binds: dict[str, str] | None = None) -> "BwrapSandbox":
        """End this sandbox (every process dies) and open a fresh one for grading on the
        same volume, with only the workspace carried over: the agent's /tmp, home, /logs,
        /tests and /solution are deleted (its processes are dead; ``rmtree`` never follows
        a link) so the verifier has the cap less the workspace, and sees nothing else the
        agent left; ``readonly_binds`` are the host's copies of what the format carries."""
        volume, self._volume = self._volume, None  # the fresh sandbox owns it from here
        try:
            self.close()
            root = move_for_grading(volume, self.dirs)
            scratch = self._scratch / root.name
            return BwrapSandbox(self._factory, dataclasses.replace(self.spec, copy_in=()), scratch, self._support,
                                readonly_binds, volume=volume, dirs_root=root)
        except BaseException:
            volume.close()
            raise

    def _private_network(self) -> PrivateNetwork | None:
        """A task that allows the internet gets its own network namespace with filtered
        user-mode egress (:mod:`egress`), made once and joined by every command (``nsenter``
        ahead of bwrap, which then shares that namespace rather than making an empty one):
        never the host's namespace, its loopback or its sockets."""
        if not self.spec.allow_internet:
            return None
        network = PrivateNetwork()
        self._launcher = [*self._launcher, *network.join_prefix]
        return network

    def _launch(self) -> list[str]:
        """What runs ahead of bwrap: the launchers (rlimits, network) and, last, the one
        handing bwrap its seccomp filter (:mod:`seccomp`), whose ``--seccomp`` it puts
        right after the bwrap executable."""
        return [*self._launcher, *seccomp_launcher()]

    def _release_identity(self) -> None:
        """Give the sandbox's uid back, its processes killed and its keyrings emptied
        (every command's PID namespace has ended by now; this catches what did not)."""
        if self._lease is not None:
            self._lease.release()

    def _wrap(self, argv: list[str]) -> list[str]:
        """What runs inside for ``argv``: join the sandbox's cgroups, become the sandbox
        user, then exec ``argv``."""
        if self.owner is not None:
            uid, gid = self.owner
            argv = [_SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", "--no-new-privs", "--", *argv]
        if not self._cgroup.procs_files:
            return argv
        # 125 = the sandbox, not the command, failed (as docker run reports it).
        joins = " && ".join(f"echo $$ > {_CGROUP_DIR}/{i}.procs" for i in range(len(self._cgroup.procs_files)))
        script = f"{{ {joins}; }} 2>/dev/null || {{ echo 'sandbox: cannot join its cgroup' >&2; exit 125; }}\nexec \"$@\""
        return ["/bin/sh", "-c", script, "sh", *argv]

    def _command(self, command: str) -> list[str]:
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        return self._wrap([shell, "-c", command])

    def process_command(self, argv: list[str], readonly_binds: dict[str, str] | None = None
                        ) -> tuple[list[str], list[str], list[str]]:
        """How to run ``argv`` as one long-lived process inside this sandbox (same mounts,
        environment, user, limits and cgroup as its commands), with ``readonly_binds``
        (host path -> sandbox path) shown read-only on top: ``(prefix, options, command)``.
        Run ``prefix + ["--args", FD] + command`` with ``options`` NUL-separated in the file
        descriptor FD (bwrap's own way of taking its arguments), so that bwrap's command
        line -- which its PID 1 inside shows in ``/proc/1/cmdline`` -- names no host path.
        Start it with the environment :data:`LAUNCH_ENV` in a new session; killing its
        process group (or closing the sandbox) ends everything it started."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"sandbox {self._id} is closed")
        base = self._build_bwrap_argv({**self._binds, **readonly_binds}) if readonly_binds else self._bwrap_argv
        return self._launch() + base[:1], base[1:], self._wrap(list(argv))

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        timeout_s = resolve_timeout(timeout, self._factory.command_timeout_s)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"sandbox {self._id} is closed")
            # The host environment is not passed on: bwrap gets only what it needs to start.
            proc = start_capped(
                self._launch() + self._bwrap_argv + self._command(command),
                timeout_s=timeout_s,
                output_cap_bytes=self._factory.output_cap_bytes,
                env={"PATH": SANDBOX_PATH},
            )
            self._running.add(proc)
        try:
            run = proc.wait()
        finally:
            with self._lock:
                self._running.discard(proc)
                alone = not self._running
        if run.timed_out and alone:
            # Killing bwrap ends the PID namespace, but its processes die asynchronously:
            # wait until they are gone, so a timed-out command holds nothing afterwards.
            # (Only when no other command runs: the cgroup is shared by all of them.)
            self._cgroup.kill_all()
        return to_response(run, timeout_s)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self.dirs.upload(files)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self.dirs.download(paths)

    def oom_kills(self) -> int | None:
        return self._cgroup.oom_kills()

    def interrupt(self) -> None:
        with self._lock:
            running = list(self._running)
        for proc in running:
            proc.kill()
        # A process can only leave the group by setsid (bwrap's --new-session does), but it
        # stays in the PID namespace and the cgroup: killing bwrap ends the namespace, and
        # the cgroup, when there is one, catches anything in between.
        self._cgroup.kill_all()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.interrupt()
        self._cgroup.close()
        self._release_identity()
        if self._network is not None:
            self._network.close()
        self._release_volume()
        self._release_neutral()


LAUNCH_ENV = {"PATH": SANDBOX_PATH}
_SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"


def _probe_identity(uids: range) -> str | None:
    """Why sandboxes cannot get their own identity and seccomp filter here, or None."""
    try:
        seccomp_launcher()
    except SeccompUnavailable as e:
        return f"the sandbox's seccomp filter cannot be built: {e}"
    if not os.path.exists("/bin/bash"):
        return "the seccomp filter is handed to bwrap by /bin/bash, which is not installed"
    if os.geteuid() == 0 and (taken := accounts_in(uids)):
        return (f"sandbox.uid_range {uids.start}-{uids.stop - 1} holds ids of host accounts ({', '.join(taken[:5])}); "
                "give a range no account, group or subordinate-id range uses")
    return None


