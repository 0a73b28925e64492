"""Where a Docker sandbox's writable directories live: host directories bound into the
container, on the sandbox's size-capped volume when the task sets ``storage_mb``.

The workspace (``spec.workdir``), ``/logs``, ``/tests``, ``/solution`` and ``/tmp`` (HOME is
``/tmp``) are :class:`~milo_ray.boundary.sandbox.hostdirs.HostDirs` directories, as under
bwrap, filled with what the task's image holds there (:func:`docker_image.image_dirs`) and
handed to the container's uid. With ``spec.storage_mb`` and a root worker they lie on one
:class:`~milo_ray.boundary.sandbox.volume.Volume` of that size, so a write past the cap fails
with ENOSPC wherever it lands and the host holds at most the cap; grading keeps the volume
(its directories were made at open) and :func:`grading_root` moves only the workspace into
them. The image's own root stays read-only (``--read-only``): nothing else is writable.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from milo_ray.boundary.sandbox.base import LOGS_DIR, SOLUTION_DIR, TESTS_DIR, SandboxSpec
from milo_ray.boundary.sandbox.hostdirs import HostDirs
from milo_ray.boundary.sandbox.volume import Volume, move_for_grading

# The task directories whose image content a container starts with (the workspace too,
# except in a grading container, which gets the agent's).
IMAGE_FILLED = (LOGS_DIR, TESTS_DIR, SOLUTION_DIR)


def container_dirs(spec: SandboxSpec, root: Path, owner: tuple[int, int] | None,
                   from_image: dict[str, Path]) -> HostDirs:
    """The container's writable directories under ``root`` (made if missing), holding the
    image's files of ``from_image`` (container path -> host copy), handed to ``owner``."""
    copy_in = tuple((str(host), inside.rstrip("/") + "/") for inside, host in from_image.items())
    return HostDirs(dataclasses.replace(spec, copy_in=copy_in), root, owner=owner)


def bind_args(dirs: HostDirs) -> list[str]:
    """``docker run`` arguments binding each writable directory at its container path.
    HOME is ``/tmp`` in a container (a task image's own ``/root`` stays as it is), so the
    home directory HostDirs keeps beside a workspace is not bound."""
    args: list[str] = []
    for inside, host in dirs.mounts.items():
        if inside == dirs.home and inside != dirs.workdir:
            continue
        if ":" in f"{host}{inside}":
            raise ValueError(f"sandbox directory {host} -> {inside}: a path with ':' cannot be bound by docker -v")
        args += ["-v", f"{host}:{inside}"]
    return args


def grading_root(dirs: HostDirs, volume: Volume | None, scratch: Path) -> Path:
    """Move the workspace of ``dirs`` (its container removed, its processes dead) to the
    directory root a grading container's directories are made in, and delete the rest of
    what the agent wrote (``rmtree`` never follows a link). On a volume: the directories
    made at open (:func:`~milo_ray.boundary.sandbox.volume.move_for_grading`), so a full
    volume still grades; otherwise ``scratch/grade``."""
    if volume is not None:
        return move_for_grading(volume, dirs)
    root = scratch / "grade"
    root.mkdir()
    workspace = dirs.mounts[dirs.workdir]
    os.rename(workspace, root / "workspace")  # HostDirs' name for the workspace
    for host in set(dirs.mounts.values()) - {workspace}:
        shutil.rmtree(host, ignore_errors=True)
    return root

