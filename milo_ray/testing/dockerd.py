"""A Docker daemon and a base image for the Docker sandbox's tests and for offline CI.

:func:`ensure_dockerd` starts ``dockerd`` when none answers (CI runs as root and installs
``docker.io``; a developer machine usually has a daemon already) and returns why it
cannot when that is impossible. :func:`local_base_image` makes an image without pulling
anything: an empty root filesystem (``docker import``) that gets the host's programs
through read-only bind mounts of :func:`local_host_mounts` -- so ``bash`` and ``python3``
work inside, which the deepagents file tools need. Task Dockerfiles start ``FROM`` a public
image that cannot be pulled offline; the sandbox factory's ``base_image_override`` swaps it
for this one.

Run as a script (``python -m milo_ray.testing.dockerd``) it does both and prints the base
image, or the reason on stderr with exit status 1.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LOCAL_BASE_IMAGE = "milo-ray-base:local"
DOCKERD_LOG = Path("/tmp/milo-ray-dockerd.log")

# How long a freshly started dockerd may take to answer: it sets up its storage driver
# and the bridge network first (~2 s here; slow CI disks need more).
_START_WAIT_S = 60.0
# ``docker info`` against a live daemon answers in well under a second; a daemon that has
# not answered in this long is treated as absent.
_INFO_TIMEOUT_S = 20.0

# Top-level host directories the base image borrows. On a merged-/usr host /bin, /lib and
# /lib64 are symlinks into /usr; the image gets the same symlinks and only /usr is mounted.
_BORROWED = ("bin", "lib", "lib32", "lib64", "libx32")


def daemon_answers(docker: tuple[str, ...] = ("docker",)) -> str | None:
    """None when ``docker info`` answers, else the reason (its first error line)."""
    if shutil.which(docker[0]) is None:
        return f"the docker CLI ({docker[0]}) is not installed (apt-get install docker.io)"
    try:
        done = subprocess.run([*docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=_INFO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"docker info did not answer within {_INFO_TIMEOUT_S:.0f} s"
    if done.returncode == 0 and done.stdout.strip():
        return None
    lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else f"docker info exited with {done.returncode}"


def _start(storage_driver: str | None) -> subprocess.Popen:
    argv = ["dockerd"] + ([f"--storage-driver={storage_driver}"] if storage_driver else [])
    log = DOCKERD_LOG.open("ab")
    # A new session: the daemon outlives the test session (or CI step) that started it,
    # and a Ctrl-C in the terminal does not reach it.
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def _wait(proc: subprocess.Popen) -> str | None:
    deadline = time.monotonic() + _START_WAIT_S
    reason = "dockerd did not answer"
    while time.monotonic() < deadline:
        reason = daemon_answers()
        if reason is None:
            return None
        if proc.poll() is not None:
            return f"dockerd exited with {proc.returncode} (see {DOCKERD_LOG})"
        time.sleep(0.5)
    return f"{reason} after {_START_WAIT_S:.0f} s (see {DOCKERD_LOG})"


def ensure_dockerd() -> str | None:
    """Make a Docker daemon answer; None when one does, else why none can.

    Starts ``dockerd`` in the background when none answers, it is installed, this process
    is root and ``DOCKER_HOST`` does not point elsewhere. The default storage driver
    (overlay2) is tried first; when that daemon dies -- overlay mounts are refused inside
    some containers -- it is restarted with ``--storage-driver=vfs`` (slow, copies every
    layer, but works everywhere)."""
    first = daemon_answers()
    if first is None:
        return None
    if os.environ.get("DOCKER_HOST"):
        return f"no Docker daemon answers at DOCKER_HOST={os.environ['DOCKER_HOST']}: {first}"
    if shutil.which("docker") is None or shutil.which("dockerd") is None:
        return "Docker is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return f"no Docker daemon answers ({first}) and starting dockerd needs root"
    reasons = []
    for driver in (None, "vfs"):
        proc = _start(driver)
        reason = _wait(proc)
        if reason is None:
            return None
        if proc.poll() is None:  # alive but mute: do not start a second daemon beside it
            proc.terminate()
            proc.wait(timeout=30)
        reasons.append(f"{driver or 'default storage driver'}: {reason}")
    return "could not start dockerd: " + "; ".join(reasons)


def local_host_mounts() -> tuple[str, ...]:
    """The host directories :data:`LOCAL_BASE_IMAGE` needs mounted read-only: /usr, /etc
    and those of /bin, /lib, ... that are real directories (not symlinks into /usr).

    /sbin is never mounted: Docker's ``--init`` binary is mounted at /sbin/docker-init,
    which needs a writable /sbin in the image (the host's sbin programs stay reachable
    through /usr/sbin on a merged-/usr host)."""
    mounts = ["/usr", "/etc"]
    mounts += [f"/{name}" for name in _BORROWED if Path(f"/{name}").is_dir() and not Path(f"/{name}").is_symlink()]
    return tuple(mounts)


def _base_rootfs() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in _BORROWED:
            host = Path(f"/{name}")
            if host.is_symlink():
                link = tarfile.TarInfo(name)
                link.type, link.linkname = tarfile.SYMTYPE, os.readlink(host)
                tar.addfile(link)
            elif host.is_dir():
                tar.addfile(_dir(name, 0o755))
        for name, mode in (("sbin", 0o755), ("tmp", 0o1777), ("root", 0o700)):
            tar.addfile(_dir(name, mode))
    return buf.getvalue()


def _dir(name: str, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info


def local_base_image(docker: tuple[str, ...] = ("docker",)) -> str:
    """The tag of :data:`LOCAL_BASE_IMAGE`, imported first if missing (needs a daemon)."""
    have = subprocess.run([*docker, "image", "inspect", LOCAL_BASE_IMAGE], capture_output=True, timeout=60)
    if have.returncode != 0:
        done = subprocess.run([*docker, "import", "-", LOCAL_BASE_IMAGE], input=_base_rootfs(),
                              capture_output=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"docker import of {LOCAL_BASE_IMAGE} failed: {done.stderr.decode(errors='replace')}")
    return LOCAL_BASE_IMAGE


def main() -> int:
    reason = ensure_dockerd()
    if reason is not None:
        print(f"dockerd: {reason}", file=sys.stderr)
        return 1
    print(local_base_image())
    return 0


if __name__ == "__main__":
    sys.exit(main())
