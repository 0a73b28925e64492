"""The Docker sandbox's images: building a task's Dockerfile once per content, and the
image's own files of the directories a container gets as host directories.

:func:`build_image` tags ``milo-ray-task:<hash of the context>`` (:func:`context_digest`); a
lock per tag keeps concurrent opens of one task in a process from building it twice.
Offline hosts cannot pull the public image a Dockerfile starts ``FROM``:
:func:`override_from` replaces it.

A container's writable directories are host directories bound in (:mod:`docker`), which
hide what the image holds there -- the task's files its Dockerfile put in the workdir.
:func:`image_dirs` copies those out of the image once per image id and process, through a
created (never started) container and ``docker cp``'s tar stream, extracted with tarfile's
``data`` filter (no absolute names, no ``..``, no hard link leaving the tree, no device, no
set-id bit; a member it refuses is left out) into an owner-tagged scratch directory of this
process (:func:`~milo_ray.boundary.sandbox.leftovers.make_scratch`: removed at exit, or by a
later process if this one is killed). Symbolic links are kept as the image has them (they
point inside the sandbox) and made last, fd-relative, so nothing is written through one.
Each sandbox gets the copies as its ``copy_in``
(:class:`~milo_ray.boundary.sandbox.hostdirs.HostDirs`), as a bwrap sandbox gets the
Dockerfile's COPY sources.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tarfile
import threading
import uuid
from pathlib import Path

from milo_ray.boundary.nofollow import UnsafePath, open_dir_nofollow
from milo_ray.boundary.sandbox.docker_control import CONTROL_OUTPUT_CAP, CONTROL_TIMEOUT_S, LABEL, remove_container
from milo_ray.boundary.sandbox.leftovers import make_scratch
from milo_ray.boundary.sandbox.process import run_capped

log = logging.getLogger(__name__)

IMAGE_REPO = "milo-ray-task"
# Keeps the build log's useful part (the failing step) without holding a huge log.
_BUILD_LOG_CAP = 256 * 1024

# One lock per image tag in this process: the second open of a task waits for the first
# one's build and then finds the image.
_BUILD_LOCKS: dict[str, threading.Lock] = {}
_BUILD_LOCKS_GUARD = threading.Lock()
# (image id, path) -> the host copy of the image's directory, or None when it has none.
_EXPORTS: dict[tuple[str, str], Path | None] = {}
_EXPORTS_GUARD = threading.Lock()
_EXPORT_ROOT: list[str] = []


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


def _build_lock(tag: str) -> threading.Lock:
    with _BUILD_LOCKS_GUARD:
        return _BUILD_LOCKS.setdefault(tag, threading.Lock())


def build_image(docker: tuple[str, ...], task_id: str, context: Path, scratch: Path, *,
                base_image_override: str | None, timeout_s: float) -> str:
    """The tag of the image of the task's Dockerfile in ``context``, built if missing."""
    dockerfile = (context / "Dockerfile").read_text()
    if base_image_override is not None:
        dockerfile = override_from(dockerfile, base_image_override)
    tag = f"{IMAGE_REPO}:{context_digest(context, dockerfile)[:32]}"
    with _build_lock(tag):
        have = run_capped([*docker, "image", "inspect", "--format", "{{.Id}}", tag],
                          timeout_s=CONTROL_TIMEOUT_S, output_cap_bytes=CONTROL_OUTPUT_CAP)
        if have.exit_code == 0:
            return tag
        # The effective Dockerfile lives outside the context (it is the task's, maybe
        # rewritten); ``-f`` accepts that.
        scratch.mkdir(parents=True, exist_ok=True)
        effective = scratch / "Dockerfile.milo-ray"
        effective.write_text(dockerfile)
        built = run_capped([*docker, "build", "-t", tag, "--label", f"{LABEL}=docker",
                            "--label", f"milo-ray.task={task_id}", "-f", str(effective), str(context)],
                           timeout_s=timeout_s, output_cap_bytes=_BUILD_LOG_CAP)
        if built.exit_code != 0 or built.timed_out:
            why = f"timed out after {timeout_s:g} s" if built.timed_out else f"exit {built.exit_code}"
            raise RuntimeError(f"task {task_id}: building its image from {context} failed ({why}):\n"
                               f"{built.output.strip()[-4000:]}")
        return tag


def image_dirs(docker: tuple[str, ...], image: str, paths: tuple[str, ...]) -> dict[str, Path]:
    """Host copies of what ``image`` holds at each of ``paths`` (absolute directories),
    for those it holds anything at; made once per image id in this process."""
    done = run_capped([*docker, "image", "inspect", "--format", "{{.Id}}", image],
                      timeout_s=CONTROL_TIMEOUT_S, output_cap_bytes=CONTROL_OUTPUT_CAP)
    image_id = done.output.strip()
    if done.exit_code != 0 or not image_id:
        raise RuntimeError(f"docker image inspect {image} failed: {done.output.strip()[-500:]}")
    with _EXPORTS_GUARD:  # one export at a time: concurrent opens of one image wait for the first
        missing = [p for p in paths if (image_id, p) not in _EXPORTS]
        if missing:
            _export(docker, image, image_id, missing)
        return {p: where for p in paths if (where := _EXPORTS[(image_id, p)]) is not None}


def _export(docker: tuple[str, ...], image: str, image_id: str, paths: list[str]) -> None:
    if not _EXPORT_ROOT:
        # 0700, this process's own; removed at exit, or, should this process be killed,
        # by a later one on the machine (its name carries the owner: leftovers.reap_scratch).
        _EXPORT_ROOT.append(str(make_scratch("docker-image-dirs")))
        atexit.register(shutil.rmtree, _EXPORT_ROOT[0], True)
    holder = f"milo-ray-export-{uuid.uuid4().hex[:12]}"
    # Created, never started: its filesystem is the image's, nothing runs in it.
    made = run_capped([*docker, "create", "--name", holder, "--label", f"{LABEL}=export", "--entrypoint", "/",
                       "--network", "none", image], timeout_s=CONTROL_TIMEOUT_S, output_cap_bytes=CONTROL_OUTPUT_CAP)
    if made.exit_code != 0:
        remove_container(docker, holder)
        raise RuntimeError(f"docker create {image} (to copy its task directories out) failed: "
                           f"{made.output.strip()[-500:]}")
    try:
        for path in paths:
            dest = Path(_EXPORT_ROOT[0]) / uuid.uuid4().hex
            dest.mkdir()
            _EXPORTS[(image_id, path)] = dest if _copy_out(docker, holder, path, dest) else None
    finally:
        remove_container(docker, holder)


def _copy_out(docker: tuple[str, ...], holder: str, path: str, dest: Path) -> bool:
    """Extract ``holder``'s ``path`` into ``dest``; False when the image has nothing there."""
    proc = subprocess.Popen([*docker, "cp", "-L", f"{holder}:{path}", "-"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    links: list[tuple[str, str]] = []
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            # The archive's top entry is the directory itself (its base name): strip it.
            for member in tar:
                parts = member.name.split("/", 1)
                if len(parts) == 1:
                    continue
                member.name = parts[1]
                if member.issym():
                    # Made after everything else, fd-relative: no member is written
                    # through one, and an absolute link (kept as the task made it; the
                    # data filter would refuse it) points into the sandbox, not here.
                    links.append((member.name, member.linkname))
                    continue
                if member.islnk():
                    member.linkname = member.linkname.split("/", 1)[-1]
                try:
                    tar.extract(member, dest, filter="data")
                except tarfile.FilterError as e:
                    # A device, or a hard link out of the tree: not a task file; left out.
                    log.warning("image %s: %s left out of the sandbox's copy: %s", holder, member.name, e)
    except tarfile.ReadError:
        pass  # nothing was written: the path does not exist in the image
    finally:
        proc.stdout.close()
        stderr = proc.stderr.read().decode(errors="replace")
        proc.wait(timeout=CONTROL_TIMEOUT_S)
    if proc.returncode != 0:
        if "could not find" in stderr.lower() or "no such" in stderr.lower():
            return False
        raise RuntimeError(f"docker cp {holder}:{path} failed: {stderr.strip()[-500:]}")
    for name, target in links:
        parent, _, base = name.rstrip("/").rpartition("/")
        try:
            fd = open_dir_nofollow(dest, parent)
        except (OSError, UnsafePath):
            continue  # under another link, or not a directory: not the task's layout
        try:
            os.symlink(target, base, dir_fd=fd)
        except FileExistsError:
            pass
        finally:
            os.close(fd)
    return any(dest.iterdir())
