"""What a bubblewrap sandbox mounts: the plan behind each command's bwrap arguments.

Inside a :class:`~milo_ray.boundary.sandbox.bwrap.BwrapSandbox` a command sees
``host_readonly`` (``/usr``, ``/etc``, ..., so the host's ``python3`` and shell work) with
the files no task needs masked, the workspace at ``spec.workdir``, ``/logs``, ``/tests``,
``/solution``, a private ``/tmp`` and ``HOME`` (:mod:`hostdirs`, on the sandbox's
:mod:`volume` where there is one), its own ``/proc`` and a minimal ``/dev``, and read-only
binds of the worker's (the package's code copy, harness files, a gateway directory: on
the worker's :mod:`neutral` root, so no mountinfo root field names a host path of the
run). The rest of the root is an empty read-only tmpfs. :class:`BwrapMountPlan` builds
those arguments; the process side (identity, limits, launching, killing) is
:mod:`bwrap`'s.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path
from typing import Sequence

from milo_ray.boundary.sandbox import neutral
from milo_ray.boundary.sandbox.hostdirs import _under

DEFAULT_HOST_READONLY = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# Host files and directories under a read-only directory that a task never needs and the
# sandbox must not read (they are unreadable to the sandbox's user anyway; masked as well,
# in case the sandbox runs as the host's user).
_MASKED = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/security/opasswd",
           "/etc/machine-id")
_MASKED_DIRS = ("/etc/sudoers.d", "/etc/ssh", "/etc/ssl/private", "/etc/credstore", "/etc/credstore.encrypted")
# Where the sandbox finds ``python`` when the host has only ``python3`` (task verifiers
# call ``python``, which every task image has): on the root tmpfs, last on PATH.
_EXTRA_BIN = "/run/sandbox/bin"
# Namespaces of a sandbox started by root: all but the user namespace, in which root
# could not set up mounts over directories owned by the sandbox's user.
_ROOT_UNSHARE = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
_CGROUP_DIR = "/.sandbox_cgroup"  # where the command's shell finds its cgroup.procs files
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BwrapMountPlan:
    """The bwrap arguments of a :class:`~milo_ray.boundary.sandbox.bwrap.BwrapSandbox`
    (its base class): what it mounts where, and the worker-side directories that takes
    (skeletons of mount points, copies of read-only binds on the neutral root). Reads the
    sandbox's ``_factory``, ``spec``, ``dirs``, ``owner``, ``_cgroup``, ``_python``,
    ``_env`` and ``_scratch``."""

    def _build_bwrap_argv(self, extra_readonly: dict[str, str] | None = None) -> list[str]:
        if self.owner is not None:
            argv = [self._factory.bwrap_path, *_ROOT_UNSHARE]
            if self.spec.allow_internet:
                argv.remove("--unshare-net")
            # Only what setpriv needs to become the sandbox user (and then drop everything).
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                    "--cap-add", "CAP_SETPCAP"]
        else:
            argv = [self._factory.bwrap_path, "--unshare-all"]
            if self.spec.allow_internet:
                argv.append("--share-net")
            caps = ["--cap-drop", "ALL"]
        argv += ["--die-with-parent", "--new-session", *caps, "--hostname", "sandbox"]
        # A read-only host path under one of the sandbox's own writable directories (an
        # interpreter in a venv under /tmp, a directory under the home) is bound after
        # that directory, or the private mount would hide it.
        readonly = [*self._factory.host_readonly,
                    *(p for p in self.spec.host_readonly if p not in self._factory.host_readonly)]
        late = [p for p in readonly if any(_under(p, inside) for inside in self.dirs.mounts)]
        # Directories leading to a mount that nothing else provides (/root for a workdir
        # /root/x, or an interpreter under /root) are made on the root tmpfs, readable by
        # the sandbox user (bwrap would make them 0700 root).
        made: set[str] = set()
        covered = [*readonly, *self.dirs.mounts]
        for target in [*(p for p in readonly if p not in late), *self.dirs.mounts]:
            argv += _dirs_for(_top_parent(target, covered), made)
        argv += _readonly_args([p for p in readonly if p not in late])
        argv += ["--proc", "/proc", "--dev", "/dev"]
        # Parents before children, so a nested mount is not hidden by its parent's.
        for inside, host in sorted(self.dirs.mounts.items(), key=lambda kv: len(kv[0])):
            argv += ["--bind", str(host), inside]
        argv += self._late_binds(late)
        for host, inside in (extra_readonly or {}).items():
            argv += _dirs_for(posixpath.dirname(inside), made) + ["--ro-bind", host, inside]
        if self._python:
            argv += _dirs_for(_EXTRA_BIN, made) + ["--symlink", self._python, f"{_EXTRA_BIN}/python"]
        for d in _MASKED_DIRS:
            if os.path.isdir(d) and any(_under(d, ro) for ro in readonly):
                argv += ["--tmpfs", d, "--remount-ro", d]
        # The command's shell joins the sandbox's cgroups before it runs anything (see
        # _command), through these files alone: writing a pid there can only move a process
        # of this sandbox (the only ones it can name) into this sandbox's cgroup. Joining
        # from inside rather than from a launcher before bwrap saves an exec per command;
        # bwrap and its PID-1 stay outside, and they never fork more than the command.
        for i, procs in enumerate(self._cgroup.procs_files):
            argv += ["--bind", procs, f"{_CGROUP_DIR}/{i}.procs"]
        # bwrap's root is a writable tmpfs: make it read-only so nothing can be created
        # outside the binds (remounting / does not touch the binds, they are own mounts).
        argv += ["--remount-ro", "/", "--chdir", self.dirs.workdir, "--clearenv"]
        for key, value in self._env.items():
            argv += ["--setenv", key, value]
        return argv


    def _late_binds(self, late: list[str]) -> list[str]:
        """bwrap arguments binding read-only host paths that lie inside one of the
        sandbox's writable mounts (an interpreter under /root when the workdir is /root, a
        venv under /tmp). Their mount points are made neither by the worker nor by bwrap
        inside the sandbox's tree: bwrap (root, its old root still reachable) follows links
        when it makes missing directories, so a directory the agent swapped for a link
        would be made -- and a host directory changed -- outside. Each path is reached
        through the one entry right below its mount (``top``): bwrap makes that one with
        ``mkdir``, which never follows its last component, and binds over it a skeleton
        of the worker's own (on its neutral root, else ``ro-mountpoints/`` in the scratch;
        read-only) holding every further mount point. A ``top`` the agent swapped for a
        link is mounted over in the sandbox's own mount namespace only; no host directory
        is created or changed."""
        args: list[str] = []
        tops: dict[str, list[str]] = {}
        for p in late:
            inside = max((m for m in self.dirs.mounts if _under(p, m)), key=len)
            if p == inside:
                args += _readonly_args([p])
                continue
            tops.setdefault(posixpath.join(inside, posixpath.relpath(p, inside).split("/")[0]), []).append(p)
        for i, (top, paths) in enumerate(sorted(tops.items())):
            paths = sorted(paths, key=len)
            if top in paths:  # the others lie inside a read-only bind of the host's own
                args += _readonly_args(paths)
                continue
            skeleton = self._skeletons() / str(i)
            for p in paths:
                target = skeleton / posixpath.relpath(p, top)
                target.parent.mkdir(parents=True, exist_ok=True)
                if os.path.islink(p):
                    if not os.path.lexists(target):
                        os.symlink(os.readlink(p), target)
                elif os.path.isdir(p):
                    target.mkdir(exist_ok=True)
                elif os.path.exists(p):
                    target.touch(exist_ok=True)
            for d, _, _ in os.walk(skeleton):  # reachable by the sandbox user (a umask may say otherwise)
                os.chmod(d, 0o755)
            args += ["--ro-bind", str(skeleton), top]
            args += _readonly_args([p for p in paths if not os.path.islink(p)])
        return args


    def _release_neutral(self) -> None:
        """Remove what this sandbox made on the neutral root (its processes are dead)."""
        for made in [self._mountpoints, *self._staged.values()]:
            neutral.remove(made)

    def _skeletons(self) -> Path:
        """The directory holding this sandbox's skeletons (see :meth:`_late_binds`)."""
        if self._mountpoints is None:
            self._mountpoints = neutral.fresh_dir("m") or self._scratch / "ro-mountpoints"
        return self._mountpoints

    def _neutral_source(self, host: str) -> str:
        """What to bind for the read-only ``host`` path given at open: itself when it lies
        on the neutral root (or there is none), else a copy there, made once (the grading
        sandbox's carried directories: small, bounded, the host's own), so that the
        sandbox's mountinfo does not name the rollout's scratch. A process's binds
        (:meth:`process_command`) are bound as they are: a gateway directory must stay the
        directory its socket is made in later."""
        if neutral.worker_root() is None or neutral.is_neutral(host):
            return host
        if host not in self._staged:
            copy = neutral.stage_copy(host)
            if copy is None:
                return host
            self._staged[host] = copy
        return str(self._staged[host])


def _dirs_for(path: str, made: set[str]) -> list[str]:
    """bwrap arguments creating ``path`` and its parents on the sandbox's root tmpfs,
    readable by the sandbox user (bwrap would create them 0700)."""
    args: list[str] = []
    if not path:
        return args
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if d not in made:
            made.add(d)
            args += ["--perms", "0755", "--dir", d]
    return args


def _top_parent(path: str, covered: Sequence[str]) -> str:
    """The deepest directory above ``path`` that no other entry of ``covered`` provides
    ("" when every parent is provided or is the root)."""
    parent, keep = posixpath.dirname(path), ""
    chain = []
    while parent not in ("/", ""):
        chain.append(parent)
        parent = posixpath.dirname(parent)
    for d in reversed(chain):  # outermost first
        if any(_under(d, c) for c in covered if c != path):
            break
        keep = d
    return keep


def _python_alias() -> str | None:
    """The sandbox's ``python3`` when its PATH has no ``python`` (else None)."""
    base = SANDBOX_PATH
    if shutil.which("python", path=base):
        return None
    return shutil.which("python3", path=base)


def _readonly_args(paths: Sequence[str]) -> list[str]:
    args: list[str] = []
    for p in paths:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.exists(p):
            args += ["--ro-bind", p, p]
    if "/etc" in paths:
        for f in _MASKED:
            if os.path.exists(f):
                args += ["--ro-bind", "/dev/null", f]
    return args
