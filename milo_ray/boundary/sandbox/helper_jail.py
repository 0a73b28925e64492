"""A jail for a host-side helper process: code this project does not control, run on the
host for one rollout, that takes a model's output as input. An ARE scenario's world is
one (:mod:`milo_ray.benchmarks.are.episode`): its app tools are called with the arguments
the harness's model chose, and some of ARE's apps read and write whatever host path they
are given (an email attachment's path, a download directory). Outside a jail such a call
would read a host secret into an email the agent then reads, or write a file anywhere.

The jail (bubblewrap, as the rollout sandboxes): every namespace private (no network: the
helper talks to its parent through pipes and to the harness through a Unix socket in a
directory bound in), a user namespace whose only user is ``nobody`` with no capability,
the host's system directories read-only (the task sandboxes' list, the same secret files
masked), the interpreter and the code it runs read-only, the directories it was given,
a private ``/tmp`` as its home, its own ``/proc`` and a minimal ``/dev``. Nothing else of
the host exists in it, and it dies with its parent.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

from milo_ray.boundary.sandbox.bwrap_mounts import DEFAULT_HOST_READONLY, SANDBOX_PATH, _readonly_args

NOBODY = 65534
HOME = "/tmp"


def interpreter_dirs(python: Path) -> list[str]:
    """The directories interpreter ``python`` needs: its environment's root (a venv's, or
    the installation's) and, for a venv, the installation it was made from."""
    python = Path(python)
    env_root = python.parent.parent  # .../bin/python -> ...
    real_root = python.resolve().parent.parent
    return sorted({str(env_root), str(real_root)})


def jail_argv(argv: Sequence[str], *, readonly: Sequence[str] = (), writable: Sequence[str] = (),
              bwrap: str | None = None) -> list[str]:
    """``argv`` run in the jail (module docstring), with ``readonly`` and ``writable`` host
    paths bound at the same paths inside. ``RuntimeError`` when bubblewrap is missing."""
    bwrap = bwrap or shutil.which("bwrap")
    if not bwrap:
        raise RuntimeError("bubblewrap (bwrap) is not installed: the helper process runs only in its jail "
                           "(apt-get install bubblewrap)")
    args = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
            "--cap-drop", "ALL", "--die-with-parent", "--new-session",
            *_readonly_args(list(DEFAULT_HOST_READONLY)),
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", HOME]
    for p in readonly:
        args += ["--ro-bind", str(p), str(p)]
    for p in writable:
        args += ["--bind", str(p), str(p)]
    args += ["--chdir", HOME, "--setenv", "HOME", HOME, "--setenv", "PATH", SANDBOX_PATH, "--", *argv]
    return args
