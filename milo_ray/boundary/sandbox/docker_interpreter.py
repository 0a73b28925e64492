"""What the Docker sandbox needs to run the harness process on this worker's interpreter.

The interpreter is mounted read-only from the host at its own path (see
:func:`milo_ray.boundary.sandbox.interpreter.with_interpreter`); the image must be able to
run it (its C library at least as new as the host's) and the commands' user must reach it.
:func:`probe_interpreter` checks both once per container, at open; :func:`skeleton` makes a
mount under a private home directory reachable.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading

from milo_ray.boundary.sandbox.process import run_capped

_CONTROL_TIMEOUT_S = 120.0
_CONTROL_OUTPUT_CAP = 64 * 1024

# Prints the environment a ``docker exec`` into the container gets (the harness process's
# commands get the same one), once it found the interpreter's packages (a stdlib that
# loads is not enough: site-packages may lie behind a directory the user cannot enter).
_ENV_PROBE = ("import importlib.util, json, os, sys\n"
              "missing = [m for m in ('deepagents', 'langchain', 'litellm') if importlib.util.find_spec(m) is None]\n"
              "if missing: sys.exit(f'cannot import {missing} (sys.path: {sys.path})')\n"
              "print(json.dumps(dict(os.environ)))")
# Home directories images keep private (0700) and the commands' user cannot enter anyway:
# a host path mounted under one (an interpreter under /root, as pyenv installs it) is
# reached through a world-readable skeleton of empty directories bound over it (a tmpfs
# would not do: runc gives a tmpfs the mode of the directory it covers).
PRIVATE_PARENTS = ("/root",)
_SKELETONS: dict[tuple[str, tuple[str, ...]], str] = {}
_SKELETONS_GUARD = threading.Lock()


def skeleton(parent: str, mounts: tuple[str, ...]) -> str:
    """A host directory (0755, made once per process) holding the empty directories on
    the way to each of ``mounts`` below ``parent``: their mount points."""
    key = (parent, mounts)
    with _SKELETONS_GUARD:
        if key not in _SKELETONS or not os.path.isdir(_SKELETONS[key]):
            root = tempfile.mkdtemp(prefix="milo-docker-skeleton-")
            for m in mounts:
                os.makedirs(os.path.join(root, os.path.relpath(m, parent)), exist_ok=True)
            for d, _, _ in os.walk(root):
                os.chmod(d, 0o755)
            _SKELETONS[key] = root
        return _SKELETONS[key]


def probe_interpreter(docker: tuple[str, ...], user: str | None, task_id: str, image: str,
                      container: str) -> dict[str, str]:
    """The container's command environment, read by this worker's interpreter run
    inside as the commands' user -- which is also the check that the image can run it
    at all (an image whose C library is older than the host's cannot)."""
    who = ("-u", user) if user else ()
    run = run_capped([*docker, "exec", *who, container, sys.executable, "-I", "-c", _ENV_PROBE],
                     timeout_s=_CONTROL_TIMEOUT_S, output_cap_bytes=_CONTROL_OUTPUT_CAP)
    lines = run.output.strip().splitlines()
    try:
        env = json.loads(lines[-1]) if run.exit_code == 0 and lines else None
    except ValueError:
        env = None
    if not isinstance(env, dict):
        raise RuntimeError(
            f"task {task_id}: the image {image} cannot run the harness process: this worker's interpreter "
            f"{sys.executable} (mounted read-only from the host) fails inside it (exit {run.exit_code}: "
            f"{run.output.strip()[-500:]}); the image needs a C library at least as new as the host's -- use "
            "sandbox=bwrap for this task, or executor.agent=oracle")
    return {str(k): str(v) for k, v in env.items() if k != "HOSTNAME"}
