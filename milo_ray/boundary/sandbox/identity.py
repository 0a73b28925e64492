"""Who a bwrap sandbox's processes are on the host: a uid of their own, leased per sandbox.

Kernel objects that belong to a uid rather than to a process tree -- the user keyring and
the user session keyring (the kernel keys them by the host uid, whatever user namespace a
process is in), the persistent keyring, signals and ``/proc`` access between processes,
per-user limits -- are shared by every process of that uid. So when the worker runs as
root, no two sandboxes that are open at the same time on this machine run as the same
uid: each leases one from a range (``sandbox.uid_range``, ``FIRST-LAST``) for its whole
life, and gives it back when it closes (uid == gid, no supplementary groups).

The lease is an exclusive ``flock`` on ``<LEASE_DIR>/<uid>.lock``, so it holds across every
worker process of the machine and ends by itself when the process holding it dies. Giving
a uid back -- and taking one whose last holder died without giving it back (its lock file
is not marked clean) -- clears what a uid can leave in the kernel: every process
still running as it is killed (looked up in ``/proc``; the sandbox's PID namespaces
normally took them already), and its user, user session and persistent keyrings are
emptied (a thread of this process takes the uid for the length of those keyctl calls, as
only the owner may reach them; the thread's credentials change, never the process's).
A sandbox's seccomp filter (:mod:`seccomp`) refuses the keyring calls outright; the
clearing is for what that filter would miss. IPC objects live in the sandbox's own IPC
namespace and end with it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import stat
import threading
import time
import weakref
from dataclasses import dataclass

# Where the leases are kept: root's own, outside every sandbox's view (a sandbox sees only
# the host's read-only system directories and its own binds).
LEASE_DIR = "/run/milo_ray/sandbox-uids"
DEFAULT_UID_RANGE = "100000-101023"
# How long to wait for the processes of a uid to be gone after SIGKILL: they die within
# milliseconds unless in uninterruptible sleep; past this the lease is still given back,
# and the next lease of the uid kills them again.
_KILL_WAIT_S = 2.0

# How long to wait for the kernel to collect a uid's unlinked keys.
_KEY_GC_WAIT_S = 1.0
_CLEAN = b"clean"  # a lock file's content once its last holder cleared the uid
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_SYS_SETRESUID = {"x86_64": 117, "aarch64": 147}
_KEYCTL_GET_KEYRING_ID, _KEYCTL_CLEAR, _KEYCTL_GET_PERSISTENT, _KEYCTL_SETPERM = 0, 7, 22, 5
_KEY_SPEC_THREAD_KEYRING, _KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING = -1, -4, -5
_KEY_POS_ALL, _KEY_USR_ALL = 0x3F000000, 0x003F0000


def parse_uid_range(value: str) -> range:
    """``"FIRST-LAST"`` (inclusive, both > 0) -> range; a clear error naming the field."""
    parts = str(value).split("-")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"sandbox.uid_range={value!r}: give FIRST-LAST, host uids no account uses "
                         f"(e.g. {DEFAULT_UID_RANGE})")
    first, last = int(parts[0]), int(parts[1])
    if first <= 0 or last < first or last >= 2**32 - 1:
        raise ValueError(f"sandbox.uid_range={value!r}: needs 0 < FIRST <= LAST < 4294967295 (e.g. {DEFAULT_UID_RANGE})")
    return range(first, last + 1)


def accounts_in(uids: range, etc: str = "/etc") -> list[str]:
    """Host accounts, groups and subordinate-id ranges (rootless containers' uids) that
    overlap ``uids``: a leased uid must be nobody else's, or clearing it would kill their
    processes."""
    found = []
    for name in ("passwd", "group", "subuid", "subgid"):
        try:
            with open(os.path.join(etc, name)) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(":")
            if name in ("subuid", "subgid"):
                if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                    first, count = int(fields[1]), int(fields[2])
                    if first < uids.stop and uids.start < first + count:
                        found.append(f"{name}:{fields[0]}={first}+{count}")
            elif len(fields) > 2 and fields[2].isdigit() and int(fields[2]) in uids:
                found.append(f"{name}:{fields[0]}={fields[2]}")
    return found


@dataclass
class UidLease:
    """One sandbox's uid (its gid is the same number) while the sandbox is open."""

    uid: int
    _fd: int
    _finalizer: weakref.finalize | None = None

    @property
    def owner(self) -> tuple[int, int]:
        return self.uid, self.uid

    def release(self) -> None:
        """Clear the uid's kernel state and give the uid back (idempotent)."""
        if self._finalizer is None or not self._finalizer.alive:
            return
        try:
            clear_uid(self.uid)
            # Cleared: the next lease of this uid need not clear it again (one /proc scan
            # per sandbox, not two). A holder that dies before this leaves it unmarked.
            os.pwrite(self._fd, _CLEAN, 0)
        finally:
            self._finalizer()


def _lease_dir() -> int:
    """A descriptor of :data:`LEASE_DIR`, made if missing, refused unless it is this
    user's and nobody else can write it (anyone who could would choose our uids)."""
    os.makedirs(LEASE_DIR, mode=0o700, exist_ok=True)
    fd = os.open(LEASE_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise RuntimeError(f"{LEASE_DIR} must belong to uid {os.geteuid()} and be writable by it alone")
    return fd


def lease(uids: range, start: int = 0) -> UidLease:
    """A uid of ``uids`` that no open sandbox of this machine holds, its kernel state
    cleared. ``start``: where to begin looking (spreading callers out saves tries).
    Raises RuntimeError when every uid is taken."""
    dir_fd = _lease_dir()
    try:
        n = len(uids)
        for i in range(n):
            uid = uids[(start + i) % n]
            fd = os.open(f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                if os.pread(fd, len(_CLEAN), 0) != _CLEAN:
                    clear_uid(uid)  # a holder that died may have left something behind
                os.ftruncate(fd, 0)  # held: not known clean until its release says so
            except BaseException:
                os.close(fd)
                raise
            held = UidLease(uid, fd)
            held._finalizer = weakref.finalize(held, os.close, fd)
            return held
    finally:
        os.close(dir_fd)
    raise RuntimeError(f"every uid of sandbox.uid_range ({uids.start}-{uids.stop - 1}: {len(uids)}) is leased to an "
                       "open sandbox on this machine; widen sandbox.uid_range or run fewer sandboxes per node")


def clear_uid(uid: int) -> None:
    """Kill every process running as ``uid`` and empty its keyrings."""
    kill_uid(uid)
    purge_keyrings(uid)


def pids_of(uid: int) -> list[int]:
    """Processes whose real, effective or saved uid is ``uid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        if uid in (int(x) for x in line.split()[1:4]):
                            found.append(int(name))
                        break
        except OSError:
            continue  # gone meanwhile
    return found


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` until none is left (or :data:`_KILL_WAIT_S`
    passed). Repeated, because one may fork between the listing and the kill."""
    deadline = time.monotonic() + _KILL_WAIT_S
    delay = 0.001
    while True:
        pids = pids_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def purge_keyrings(uid: int) -> None:
    """Empty ``uid``'s user, user session and persistent keyrings (where this kernel has
    them). Only the keyrings' owner reaches them, so a thread of ours takes the uid for
    these calls -- through the raw system call, which changes that thread's credentials
    only (the C library's setresuid would change every thread's) -- and the thread ends
    right after. Needs root; a worker that is not root leases no uid either."""
    if os.geteuid() != 0:
        return
    machine = os.uname().machine
    if machine not in _SYS_KEYCTL:
        return
    error: list[BaseException] = []
    thread = threading.Thread(target=_purge_as, args=(uid, machine, error), name=f"purge-keys-{uid}")
    thread.start()
    thread.join()
    if error:
        raise error[0]


def _purge_as(uid: int, machine: str, error: list[BaseException]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    keyctl, setresuid = _SYS_KEYCTL[machine], _SYS_SETRESUID[machine]
    # The saved uid stays 0, so the thread can take root back (and keeps its permitted
    # capabilities meanwhile); a thread that could not would end anyway.
    if syscall(setresuid, ctypes.c_long(uid), ctypes.c_long(uid), ctypes.c_long(0)) != 0:
        error.append(OSError(ctypes.get_errno(), f"cannot take uid {uid} to clear its keyrings"))
        return
    try:
        rings = []
        for spec in (_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING):
            ring = syscall(keyctl, _KEYCTL_GET_KEYRING_ID, ctypes.c_long(spec), 0)
            if ring > 0:
                rings.append(ring)
        # Linked into a thread keyring of this thread's (owned by the uid, gone with the
        # thread), through which the thread possesses it: only a possessor may change it.
        persistent = syscall(keyctl, _KEYCTL_GET_PERSISTENT, ctypes.c_long(-1), ctypes.c_long(_KEY_SPEC_THREAD_KEYRING))
        if persistent > 0:
            rings.append(persistent)
        for ring in rings:
            # Its owner may set the permissions back, whatever a process of the uid did to them.
            syscall(keyctl, _KEYCTL_SETPERM, ctypes.c_long(ring), ctypes.c_long(_KEY_POS_ALL | _KEY_USR_ALL))
            if syscall(keyctl, _KEYCTL_CLEAR, ctypes.c_long(ring)) != 0:
                code = ctypes.get_errno()
                if code not in (errno.ENOKEY, errno.EKEYREVOKED, errno.EKEYEXPIRED):
                    error.append(OSError(code, f"cannot clear keyring {ring} of uid {uid}: {os.strerror(code)}"))
        # A key unlinked from every keyring stays listed in /proc/keys, description and
        # all, until the kernel's key collector runs (milliseconds): wait until the uid's
        # own listing (read as the uid: root is not shown other users' keys) holds only
        # the keyrings the kernel names (bounded; the keys are unreachable either way).
        deadline, delay = time.monotonic() + _KEY_GC_WAIT_S, 0.001
        while _leftover_keys(uid) and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    finally:
        if syscall(setresuid, ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0)) != 0:
            # Cannot happen with saved uid 0; if it did, the thread ends here anyway.
            error.append(OSError(ctypes.get_errno(), "cannot take root back after clearing keyrings"))


def _leftover_keys(uid: int) -> list[str]:
    """What the calling thread (as ``uid``) sees in ``/proc/keys`` of ``uid``'s keys
    beyond its user, user session, persistent and thread keyrings."""
    own = {f"_uid.{uid}", f"_uid_ses.{uid}", f"_persistent.{uid}", "_tid"}
    left = []
    try:
        with open("/proc/keys") as f:
            for line in f:
                fields = line.split(None, 8)
                if len(fields) == 9 and fields[5] == str(uid):
                    name = fields[8].split(":")[0].strip()
                    if fields[7] != "keyring" or name not in own:
                        left.append(name)
    except OSError:
        pass
    return left
