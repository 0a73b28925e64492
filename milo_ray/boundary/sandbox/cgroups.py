"""Per-sandbox control groups: a process-count, memory and CPU limit for everything one
sandbox runs, and a way to find (and kill) all of it.

Works with cgroup v1 (one hierarchy per controller, the layout of many VMs and older
hosts) and with a delegated cgroup v2 subtree (our own cgroup already enables the
controllers for its children, as systemd's ``Delegate=yes`` or a container runtime does).
When neither is writable, :func:`probe_cgroups` reports nothing available and the caller
falls back to rlimits; it never half-applies a limit.

A sandbox's cgroups are removed when it closes. Their names carry the creating process's
owner tag (:mod:`leftovers`), and the first sandbox a process opens under a parent first
removes the cgroups there whose owner died (:func:`reap_cgroups`): a worker that was
killed cannot close its sandboxes, the next one cleans up after it, and a live sandbox's
cgroup (empty between two commands) is never taken for a leftover.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from milo_ray.boundary.sandbox.leftovers import owned_name, owner_of, reap_once

CONTROLLERS = ("pids", "memory", "cpu")
# Every per-sandbox cgroup's name starts with this, then its owner tag.
CGROUP_PREFIX = "milo_ray_"
# CFS period for the CPU quota: the kernel default (100 ms); quota = cpus * period.
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupSupport:
    """Where a new cgroup for each controller can be created: controller -> parent
    directory (v1: one per controller; v2: the same directory for all)."""

    parents: dict[str, Path] = field(default_factory=dict)
    v2: bool = False

    def has(self, controller: str) -> bool:
        return controller in self.parents


def _mounts() -> list[tuple[str, str, set[str]]]:
    out = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                out.append((parts[1], parts[2], set(parts[3].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for ctrl in ctrls.split(",") if ctrls else [""]:
                out[ctrl] = path
    return out


def _writable_parent(parent: Path) -> bool:
    # The only reliable test of "may we create cgroups here" is to create one.
    probe = parent / f"milo_ray_probe_{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        probe.rmdir()
    except OSError:
        pass
    return True


def probe_cgroups() -> CgroupSupport:
    """Which controllers this process can put a child cgroup under (v1 first, since a
    host with both mounts places the v1 controllers there)."""
    try:
        mounts = _mounts()
        own = _own_paths()
    except OSError:
        return CgroupSupport()
    parents: dict[str, Path] = {}
    for mountpoint, fstype, opts in mounts:
        if fstype != "cgroup":
            continue
        for ctrl in CONTROLLERS:
            if ctrl in opts and ctrl not in parents and ctrl in own:
                parent = Path(mountpoint) / own[ctrl].lstrip("/")
                if _writable_parent(parent):
                    parents[ctrl] = parent
    if parents:
        return CgroupSupport(parents)
    for mountpoint, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        parent = Path(mountpoint) / own[""].lstrip("/")
        try:
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
        except OSError:
            continue
        usable = [c for c in CONTROLLERS if c in enabled]
        if usable and _writable_parent(parent):
            return CgroupSupport({c: parent for c in usable}, v2=True)
    return CgroupSupport()


class SandboxCgroup:
    """The cgroup(s) of one sandbox, with its limits written. ``procs_files`` are the
    ``cgroup.procs`` files a process writes its pid to in order to join (a bwrap
    sandbox's command shell does that first thing, so nothing it runs is outside them)."""

    def __init__(
        self,
        support: CgroupSupport,
        name: str,
        *,
        pids_limit: int | None,
        memory_mb: int | None,
        cpus: float | None,
    ) -> None:
        wanted: dict[str, dict[str, str]] = {}
        if pids_limit is not None and support.has("pids"):
            wanted["pids"] = {"pids.max": str(pids_limit)}
        if memory_mb is not None and support.has("memory"):
            limit = str(memory_mb * 1024 * 1024)
            wanted["memory"] = {"memory.max" if support.v2 else "memory.limit_in_bytes": limit}
        if cpus is not None and support.has("cpu"):
            quota = max(1000, int(cpus * _CPU_PERIOD_US))
            wanted["cpu"] = (
                {"cpu.max": f"{quota} {_CPU_PERIOD_US}"}
                if support.v2
                else {"cpu.cfs_period_us": str(_CPU_PERIOD_US), "cpu.cfs_quota_us": str(quota)}
            )
        self.enforced = tuple(sorted(wanted))
        self.dirs: list[Path] = []
        self._memory_dir: Path | None = None
        for parent in {support.parents[ctrl] for ctrl in wanted}:
            reap_once(("cgroup", str(parent)), lambda parent=parent: reap_cgroups(parent))
        name = owned_name(CGROUP_PREFIX, name)
        # A sandbox dropped without close() must not leave its cgroups behind for good
        # (the list is shared, so close() emptying it disarms this). Not a method of self:
        # a finalizer holding self would keep it alive.
        self._finalizer = weakref.finalize(self, _rmdirs, self.dirs)
        try:
            for ctrl, files in wanted.items():
                d = support.parents[ctrl] / name
                if d not in self.dirs:
                    d.mkdir()
                    self.dirs.append(d)
                if ctrl == "memory":
                    self._memory_dir = d
                for fname, value in files.items():
                    (d / fname).write_text(value)
        except OSError:
            self.close()
            raise

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        return _pids(self.dirs)

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer has killed in this sandbox's memory
        cgroup so far (``oom_kill`` of v2's ``memory.events``, of v1's
        ``memory.oom_control``), or None when there is no memory cgroup to ask (or the
        kernel does not count them)."""
        return None if self._memory_dir is None else _oom_kills(self._memory_dir)

    def kill_all(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty (a fork bomb can add
        members between reading the list and killing them; the pids limit bounds how many)
        and wait for the killed ones to be gone, at most ``wait_s`` -- a killed process
        stays listed while the kernel tears it down. True once empty."""
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() >= deadline:
                return False
            _kill(pids)
            time.sleep(0.005)

    def close(self) -> None:
        self.kill_all()
        _rmdirs(self.dirs)


def _kill(pids: set[int]) -> None:
    """SIGKILL each of ``pids``; one that is gone already (or not ours to kill) is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _pids(dirs: list[Path]) -> set[int]:
    out: set[int] = set()
    for d in dirs:
        try:
            out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except OSError:
            pass
    return out


def _oom_kills(memory_dir: Path) -> int | None:
    for fname in ("memory.events", "memory.oom_control"):
        try:
            lines = (memory_dir / fname).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def reap_cgroups(parent: Path) -> int:
    """Remove the per-sandbox cgroups under ``parent`` whose owner is dead (killing what
    is still in them: a process of a dead worker's sandbox that outlived it); how many.
    A cgroup without an owner tag, or whose owner may be alive, is left alone."""
    removed = 0
    try:
        names = [e.name for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    for name in names:
        owner = owner_of(name, CGROUP_PREFIX)
        if owner is None or not owner.is_dead():
            continue
        d = parent / name
        deadline = time.monotonic() + 2.0
        while (pids := _pids([d])) and time.monotonic() < deadline:
            _kill(pids)
            time.sleep(0.005)
        try:
            d.rmdir()
            removed += 1
        except OSError:
            pass  # still busy (a process stuck in the kernel): the next worker tries again
    return removed


def _rmdirs(dirs: list[Path]) -> None:
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            # Gone already, or still busy after kill_all's wait (a process stuck in the
            # kernel): leave it rather than fail the rollout.
            pass
    dirs.clear()
