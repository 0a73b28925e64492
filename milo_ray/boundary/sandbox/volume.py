"""The size-capped filesystem that holds every writable directory of one sandbox, so that
``spec.storage_mb`` bounds the total a sandbox writes, not one file.

A bwrap sandbox's workspace, ``/logs``, ``/tests``, ``/solution``, ``/tmp`` and home are
host directories (:mod:`hostdirs`); when the task sets ``storage_mb`` they all live on one
:class:`Volume` mounted on a host directory under the rollout's scratch, so a write past
the cap fails with ENOSPC wherever inside it lands. The volume is a sparse file of
``storage_mb`` MiB formatted ext4 (no journal, no reserved blocks) and loop-mounted
``nosuid,nodev``: it persists across the sandbox's commands (each is its own bwrap), the
host reads it for grading like any directory, it takes disk, not memory (a task may ask
for 10 GiB), and the host's disk holds at most ``storage_mb`` MiB of it whatever the
sandbox does. ext4's own metadata takes a few percent of a small volume (14.7 MiB of a
16 MiB one are free to write). Making one takes ~20 ms (mkfs + mount); unmounting ~5 ms.
When a loop device cannot be had (a container without them) the fallback is a tmpfs with
``size=storage_mb`` -- the same cap, held in memory. Mounting takes root; without it there
is no volume and the caller says what it enforces instead.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import subprocess
import weakref
from pathlib import Path

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.hostdirs import HostDirs

logger = logging.getLogger(__name__)

_TOOL_TIMEOUT_S = 60.0  # mkfs of a sparse file and a mount take milliseconds; only a hung machine trips this
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
_GRADE_DIRS = "grade"  # on a volume: the grading sandbox's directories, made when it opens


def unavailable() -> str | None:
    """Why no volume can be made here, or None."""
    if os.geteuid() != 0:
        return "mounting a per-sandbox volume takes a root worker"
    if shutil.which("mount", path=_ENV["PATH"]) is None:
        return "mount (util-linux) is not installed"
    return None


class Volume:
    """A filesystem of ``size_mb`` MiB mounted at ``mountpoint`` (created here, must not
    exist), backed by the file ``image`` (created here). ``mechanism`` says which cap it
    is (None for a volume that is no cap: ``capped=False``, which takes ext4 or nothing,
    never a tmpfs of that size in memory). :meth:`close` unmounts it; the image file stays
    for whoever removes the scratch."""

    def __init__(self, image: Path, mountpoint: Path, size_mb: int, *, capped: bool = True) -> None:
        if int(size_mb) < 1:
            raise ValueError(f"SandboxSpec.storage_mb must be >= 1 MiB or null, got {size_mb}")
        why = unavailable()
        if why:
            raise RuntimeError(why)
        self.path = Path(mountpoint)
        self.size_mb = int(size_mb)
        self.path.mkdir(mode=0o755)
        self._mounted = False
        failure = self._mount_ext4(Path(image))
        # Unmounted by close(), or else when the sandbox is collected unclosed or the
        # interpreter exits; only a worker killed outright leaves it (reap_scratch then).
        self._finalizer = weakref.finalize(self, _unmount, str(self.path))
        if failure is not None and not capped:
            self._finalizer.detach()
            self.path.rmdir()
            raise RuntimeError(f"no ext4 loop volume: {failure}")
        if failure is not None:
            logger.warning("sandbox volume: no ext4 loop volume (%s); using a tmpfs of %d MiB instead",
                           failure, self.size_mb)
            self._run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755,nosuid,nodev", "tmpfs",
                       str(self.path)], "mount a tmpfs")
            self.mechanism = f"tmpfs of {self.size_mb} MiB (in memory) for all writable directories"
        self._mounted = True
        if not capped:
            self.mechanism = None

    def _mount_ext4(self, image: Path) -> str | None:
        """Make and mount the ext4 image; why not, or None."""
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, self.size_mb * 1024 * 1024)  # sparse: disk is used only as the sandbox writes
        finally:
            os.close(fd)
        mkfs = shutil.which("mkfs.ext4", path=_ENV["PATH"])
        if mkfs is None:
            return "mkfs.ext4 is not installed"
        # nodiscard: the image is a fresh sparse file, so discarding its blocks frees
        # nothing and takes time that grows with its size (an uncapped volume's is a disk's).
        steps = ([mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard", str(image)],
                 ["mount", "-o", "loop,nosuid,nodev", str(image), str(self.path)])
        for argv in steps:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, env=_ENV)
            if run.returncode != 0:
                return f"{argv[0]}: {run.stderr.strip()[:200]}"
        self.mechanism = f"ext4 loop volume of {self.size_mb} MiB for all writable directories"
        return None

    def _run(self, argv: list[str], what: str) -> None:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, env=_ENV)
        if run.returncode != 0:
            raise RuntimeError(f"the sandbox's storage volume: could not {what}: {run.stderr.strip()[:300]}")

    def close(self) -> None:
        """Unmount (idempotent). Every process of the sandbox is dead by now; should
        something still hold the mount, it is detached lazily (freed when let go)."""
        if not self._mounted:
            return
        self._mounted = False
        self._finalizer()


def _unmount(path: str) -> None:
    run = subprocess.run(["umount", path], capture_output=True, timeout=_TOOL_TIMEOUT_S, env=_ENV)
    if run.returncode != 0:
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=_TOOL_TIMEOUT_S, env=_ENV)


def unmount_below(root: str | os.PathLike) -> int:
    """Detach every mount at or below ``root`` (deepest first), e.g. the volume of a dead
    worker's sandbox before its scratch is removed; how many. Root only (nobody else can
    have mounted one)."""
    if os.geteuid() != 0:
        return 0
    root = os.path.realpath(root)
    try:
        with open("/proc/self/mountinfo") as f:
            points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in f]
    except OSError:
        return 0
    below = sorted({p for p in points if p == root or p.startswith(root.rstrip("/") + "/")}, key=len, reverse=True)
    for point in below:
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=_TOOL_TIMEOUT_S, env=_ENV)
    return len(below)


def open_volume(spec: SandboxSpec, scratch: Path, *, own: bool = False) -> Volume | None:
    """The volume for a sandbox of ``spec`` in ``scratch`` (``volume.img``, mounted at
    ``volume/``), or None when the task sets no ``storage_mb`` or no volume can be made
    here (logged: then only a per-file RLIMIT_FSIZE holds). ``own``: a task without
    ``storage_mb`` gets one too, the size of the free space on the scratch's filesystem
    (no cap: that disk holds no more), so that its sandbox's binds come from a filesystem of its own whose
    paths name nothing of the host (``BwrapSandboxFactory(own_volume=True)``); None where
    none can be made (not root, no loop device: logged)."""
    if spec.storage_mb is None and not own:
        return None
    why = unavailable()
    if why:
        if spec.storage_mb is not None:
            logger.warning("sandbox: storage_mb=%s bounds each file only, not the total: %s", spec.storage_mb, why)
        return None
    scratch.mkdir(parents=True, exist_ok=True)
    if spec.storage_mb is None:
        st = os.statvfs(scratch)
        try:
            volume = Volume(scratch / "volume.img", scratch / "volume", max(16, st.f_bfree * st.f_frsize >> 20),
                            capped=False)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            logger.warning("sandbox: its writable directories stay on the host's disk (binds show their host "
                           "paths): %s", exc)
            return None
    else:
        volume = Volume(scratch / "volume.img", scratch / "volume", spec.storage_mb)
    try:
        # The grading sandbox's directories, made now: once the agent has filled the
        # volume not even an empty directory could be made. They are the host's, in a
        # directory of the volume the sandbox never sees.
        HostDirs(dataclasses.replace(spec, copy_in=()), volume.path / _GRADE_DIRS)
    except BaseException:
        volume.close()
        raise
    return volume


def move_for_grading(volume: Volume, dirs: HostDirs) -> Path:
    """Move the workspace of ``dirs`` (a sandbox on ``volume`` whose processes are all
    dead) into the grading directories made at open, and delete the rest of what the
    agent wrote (its /tmp, home, /logs, ...: ``rmtree`` never follows a link), so the
    verifier has the cap less the workspace and sees nothing else the agent left. The
    grading sandbox's directory root is returned."""
    root = volume.path / _GRADE_DIRS
    workspace = dirs.mounts[dirs.workdir]
    os.rename(workspace, root / "workspace")  # onto the empty directory made at open
    for host in set(dirs.mounts.values()) - {workspace}:
        shutil.rmtree(host, ignore_errors=True)
    return root
