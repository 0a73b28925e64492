"""What a sandbox leaves on the host, and who owns it: per-rollout scratch directories and
per-sandbox cgroups carry their owner in their name, so that what a dead worker left
behind can be removed by the next one without ever touching a live sandbox's.

A rollout removes its own scratch and cgroups when it ends (normally, by a timeout, a
kill or a harness crash: ``finally`` blocks and :meth:`SandboxCgroup.close`). Only a
worker that dies (SIGKILL, OOM, a lost node) cannot, and for that case each name holds an
:class:`Owner` tag: the kernel's boot id, the PID namespace, the pid and the pid's start
time. A later process removes an entry only when the tag says the owner is dead: same
boot and same PID namespace (so the pid means the same process table), and no process
with that pid and start time exists (a reused pid has another start time). An entry
whose tag cannot be judged from here (another boot -- or another machine sharing the
directory --, another PID namespace, a name without a tag) is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from milo_ray.boundary.sandbox.volume import unmount_below

# Prefix of a per-rollout scratch directory; the owner tag follows it.
SCRATCH_PREFIX = "milo-scratch-"
_TAG = r"own-(?P<boot>[0-9a-f]{12})-(?P<ns>\d+)-(?P<pid>\d+)-(?P<start>\d+)-"


@dataclass(frozen=True)
class Owner:
    """The process an entry belongs to, as recorded in its name."""

    boot: str  # first 12 hex digits of /proc/sys/kernel/random/boot_id
    pidns: int  # inode of the PID namespace
    pid: int
    start: int  # the pid's start time in clock ticks since boot (/proc/PID/stat field 22)

    @property
    def tag(self) -> str:
        return f"own-{self.boot}-{self.pidns}-{self.pid}-{self.start}-"

    def is_dead(self) -> bool:
        """True only when this process is certainly gone (see the module docstring)."""
        me = current_owner()
        if me is None or self.boot != me.boot or self.pidns != me.pidns:
            return False
        return _start_time(self.pid) != self.start


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Field 22 of the line; fields[0] here is field 3 (the state, after "pid (comm)").
    return int(fields[19])


_current: tuple[int, Owner | None] | None = None


def current_owner() -> Owner | None:
    """This process's tag (None when /proc cannot say: nothing is then tagged or reaped)."""
    global _current
    pid = os.getpid()
    if _current is None or _current[0] != pid:  # recomputed in a forked child
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
            pidns = os.stat("/proc/self/ns/pid").st_ino
            start = _start_time(pid)
        except OSError:
            boot, pidns, start = "", 0, None
        ok = re.fullmatch(r"[0-9a-f]{12}", boot) is not None and start is not None
        _current = (pid, Owner(boot, pidns, pid, start) if ok else None)
    return _current[1]


def owner_of(name: str, prefix: str) -> Owner | None:
    """The owner recorded in ``name`` (an entry made with ``prefix``), or None."""
    m = re.match(re.escape(prefix) + _TAG, name)
    if m is None:
        return None
    return Owner(m["boot"], int(m["ns"]), int(m["pid"]), int(m["start"]))


def owned_name(prefix: str, rest: str) -> str:
    """``prefix`` + this process's owner tag + ``rest`` (no tag when there is none to give)."""
    me = current_owner()
    return f"{prefix}{me.tag if me else ''}{rest}"


def make_scratch(label: str = "", dir: str | os.PathLike | None = None) -> Path:
    """A fresh per-rollout scratch directory (mode 0700) under ``dir`` (None: the system
    temp dir), named with this process's owner tag and ``label`` (for a person reading the
    directory). The first call per directory in a process first removes the scratch
    directories there whose owner died (:func:`reap_scratch`)."""
    base = Path(dir) if dir is not None else Path(tempfile.gettempdir())
    reap_once(("scratch", str(base)), lambda: reap_scratch(base))
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:40]
    return Path(tempfile.mkdtemp(prefix=owned_name(SCRATCH_PREFIX, f"{label}-" if label else ""), dir=base))


def dead_owners_dirs(base: str | os.PathLike, prefix: str) -> Iterator[str]:
    """The paths of the real directories (never a link) of this user under ``base`` whose
    names carry ``prefix`` and an owner tag of a process that is dead."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        owner = owner_of(name, prefix)
        if owner is None or not owner.is_dead():
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            yield path


def reap_scratch(base: str | os.PathLike) -> int:
    """Remove the scratch directories under ``base`` whose owner is dead; how many.
    Only real directories of this user are touched (never a link), and their removal
    never follows a link inside (``shutil.rmtree``'s fd-based walk)."""
    removed = 0
    for path in dead_owners_dirs(base, SCRATCH_PREFIX):
        unmount_below(path)  # a storage volume of a sandbox its owner never closed
        shutil.rmtree(path, ignore_errors=True)
        removed += not os.path.lexists(path)
    return removed


_reaped: set[tuple[str, str]] = set()
_reap_lock = threading.Lock()


def reap_once(key: tuple[str, str], reap: Callable[[], object]) -> None:
    """Call ``reap`` unless this process already did for ``key``."""
    # Once per process and place: a worker's first rollout pays for the scan, later ones
    # cannot find anything new (a dead owner's entries do not come back).
    with _reap_lock:
        if key in _reaped:
            return
        _reaped.add(key)
    reap()
