"""The worker's neutral root: a filesystem of its own for what the worker shows a sandbox
read-only, so that no bind names a host path of the run, the rollout or the checkout.

Inside a sandbox ``/proc/self/mountinfo`` gives, for every mount, its *root*: the path of
the bound directory relative to the root of the filesystem it lives on. A directory bound
from the host's disk shows its host path there (a rollout's scratch, the package's code
copy under ``/tmp``, ...). A root worker therefore keeps what it binds read-only -- the
package's code copy (:mod:`runtime_code`), harness files and gateway directories
(:mod:`milo_ray.boundary.harness_process.host`), the skeletons of mount points
(:mod:`bwrap_mounts`) and copies of other read-only binds -- on a tmpfs of its own mounted
at ``/run/milo_ray/w-<owner tag>``: the root field of such a bind is then a path relative
to that tmpfs (``/lib``, ``/r/3f...``), built from fixed words and random hex only. The
writable directories get the same from the sandbox's volume (:mod:`volume`).

Only the worker writes here (0755, root's): a sandbox sees these directories read-only.
The tmpfs is unmounted when the process exits; one left by a worker killed outright is
unmounted by the next worker that finds its owner dead (the owner tag, :mod:`leftovers`).
A worker that is not root cannot mount: :func:`worker_root` is None and callers keep their
directories where they were (on the host's disk, at host paths).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import subprocess
import threading
from pathlib import Path

from milo_ray.boundary.sandbox.leftovers import current_owner, dead_owners_dirs, owned_name

logger = logging.getLogger(__name__)

BASE = "/run/milo_ray"
PREFIX = "w-"
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
_TOOL_TIMEOUT_S = 60.0  # a tmpfs mount takes milliseconds; only a hung machine trips this

_lock = threading.Lock()
_root: tuple[int, Path | None] | None = None  # (pid that mounted it, where)


def worker_root() -> Path | None:
    """This process's neutral root (mounted on first use), or None where it cannot be had
    (not root, no owner tag, the mount failed: logged once)."""
    global _root
    with _lock:
        pid = os.getpid()
        if _root is not None and _root[0] == pid:
            return _root[1]
        _root = (pid, _mount())
        return _root[1]


def _mount() -> Path | None:
    if os.geteuid() != 0 or current_owner() is None:
        return None
    base = Path(BASE)
    try:
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)  # a sandbox user passes through it to a gateway socket
    except OSError as exc:
        logger.warning("sandbox: no neutral root under %s (%s); binds show host paths", BASE, exc)
        return None
    reap_worker_roots(base)
    where = base / owned_name(PREFIX, secrets.token_hex(4))
    where.mkdir(mode=0o755)
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", str(where)],
                         capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, env=_ENV)
    if run.returncode != 0:
        logger.warning("sandbox: cannot mount a neutral root (%s); binds show host paths", run.stderr.strip()[:200])
        where.rmdir()
        return None
    atexit.register(_unmount, str(where))
    return where


def _unmount(where: str) -> None:
    subprocess.run(["umount", "-l", where], capture_output=True, timeout=_TOOL_TIMEOUT_S, env=_ENV)
    try:
        os.rmdir(where)
    except OSError:
        pass


def reap_worker_roots(base: str | os.PathLike = BASE) -> int:
    """Unmount and remove the neutral roots under ``base`` whose owner is dead; how many."""
    removed = 0
    for path in dead_owners_dirs(base, PREFIX):
        _unmount(path)
        removed += not os.path.lexists(path)
    return removed


def fresh_dir(kind: str) -> Path | None:
    """A new empty directory ``<root>/<kind>/<random hex>`` (0755) on the neutral root, or
    None without one. ``kind`` is a fixed word: it shows in the sandbox's mountinfo."""
    root = worker_root()
    if root is None:
        return None
    parent = root / kind
    parent.mkdir(mode=0o755, exist_ok=True)
    where = parent / secrets.token_hex(8)
    where.mkdir(mode=0o755)
    os.chmod(where, 0o755)  # whatever the umask
    return where


def is_neutral(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies on this process's neutral root."""
    root = worker_root()
    if root is None:
        return False
    p = os.path.abspath(path)
    return p == str(root) or p.startswith(str(root) + os.sep)


def stage_copy(src: str | os.PathLike) -> Path | None:
    """A copy of the host's own tree ``src`` (trusted: its links stay links) on the neutral
    root, to be bound in its place; None without a neutral root. Removed with
    :func:`remove`."""
    where = fresh_dir("c")
    if where is None:
        return None
    target = where / "d"
    if os.path.isdir(src):
        shutil.copytree(src, target, symlinks=True)
        for d, _, _ in os.walk(target):
            os.chmod(d, os.stat(d).st_mode | 0o755)
    else:
        shutil.copy2(src, target, follow_symlinks=False)
    return target


def remove(path: Path | None) -> None:
    """Remove a directory made here (``fresh_dir``/``stage_copy``), its random-named parent
    included."""
    root = worker_root()
    if path is None or root is None or not is_neutral(path):
        return
    parts = Path(path).relative_to(root).parts
    if len(parts) >= 2:  # <kind>/<hex>: never the root or a kind's directory itself
        shutil.rmtree(root / parts[0] / parts[1], ignore_errors=True)
