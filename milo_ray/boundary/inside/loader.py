"""Importing a harness in the process that runs it: the harness process inside the
rollout's sandbox (:mod:`.harness_process`), never a worker or the driver.

A harness is untrusted, generated code: it is imported only where its rollouts run, from
a private directory, under a module name unique to its content hash, so two harnesses in
one worker never share module state and a harness is imported once per process however
many of its rollouts the worker runs.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from milo_ray.core.executor import ENTRY_FILE

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


class HarnessLoadError(Exception):
    """The harness could not be imported or has no callable ``build_agent`` (a harness
    failure: the rollout scores 0 with ``error_kind="harness"``)."""


def load_harness(harness: Any, root: str | Path) -> ModuleType:
    """The imported ``harness.py`` of ``harness`` (files written under ``root/<id>``).

    A multi-file harness imports its sibling files as a package would: its directory is
    put on ``sys.path`` (after the framework's own entries, so it cannot shadow them)."""
    hid = harness.harness_id
    with _lock:
        if hid in _modules:
            return _modules[hid]
        where = Path(root) / hid
        for rel, text in harness.files.items():
            dst = where / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
        module = import_entry(where, f"milo_harness_{hid}", multi_file=len(harness.files) > 1)
        _modules[hid] = module
        return module


def import_entry(where: str | Path, name: str, *, multi_file: bool) -> ModuleType:
    """Import ``where/harness.py`` as module ``name`` and check it defines a callable
    ``build_agent``; raises :class:`HarnessLoadError` saying why not. A multi-file
    harness's directory goes on ``sys.path`` after the framework's own entries, so its
    siblings import as a package's would and cannot shadow the framework."""
    if multi_file and str(where) not in sys.path:
        sys.path.append(str(where))
    spec = importlib.util.spec_from_file_location(name, Path(where) / ENTRY_FILE)
    if spec is None or spec.loader is None:
        raise HarnessLoadError(f"{ENTRY_FILE} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # SyntaxError, ImportError, SystemExit at import...
        raise HarnessLoadError(f"importing {ENTRY_FILE} failed: {type(exc).__name__}: {exc}") from None
    if not callable(getattr(module, "build_agent", None)):
        raise HarnessLoadError(f"{ENTRY_FILE} has no callable build_agent(model, backend)")
    sys.modules[name] = module
    return module
