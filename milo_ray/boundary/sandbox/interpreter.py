"""This Python interpreter, made visible inside a sandbox.

Programs the project runs in a sandbox on the host's behalf (an optimizer program, the
runner that grades it) import numpy and scipy, which a task's stand-in system
interpreter (``/usr/bin/python3`` under bwrap) may not have. They run with the
interpreter the worker itself runs on, shown read-only: its prefixes and site-packages.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

# The sandbox's PATH without the interpreter (bwrap's default).
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def interpreter_paths() -> list[str]:
    """Host directories a sandbox needs to run this interpreter with its packages (none
    nested in another)."""
    paths = sorted({str(Path(p)) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *_site_packages())
                    if p and Path(p).is_dir()})
    return [p for p in paths if not under_any(p, [q for q in paths if q != p])]


def interpreter_env() -> dict[str, str]:
    """Environment under which ``python3`` (and ``python``) inside the sandbox is this
    interpreter: its bin directory first on PATH. A venv's bin directory has both names;
    a base install has at least ``python3``."""
    return {"PATH": f"{Path(sys.executable).parent}:{BASE_PATH}"}


def under_any(path: str, roots: Any) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def with_interpreter(factory: Any) -> Any:
    """A copy of ``factory`` whose sandboxes see this interpreter read-only: bwrap's
    ``host_readonly``, Docker's ``host_mounts`` (a factory with neither, e.g. the local
    one, runs commands on the host, which sees it already)."""
    for attr in ("host_readonly", "host_mounts"):
        have = getattr(factory, attr, None)
        if have is None:
            continue
        have = tuple(have)
        missing = tuple(p for p in interpreter_paths() if not under_any(p, have))
        if missing:
            factory = copy.copy(factory)
            setattr(factory, attr, have + missing)
    return factory


def _site_packages() -> list[str]:
    import site

    return list(site.getsitepackages())
