"""What a sandbox sees of the framework's code and of a harness.

A process inside a sandbox that needs this package (the harness process, a child's import
check) gets a private, world-readable copy of its Python files rather than the checkout: no
path of the checkout is visible, and the package's data (the bundled tasks' tests and
solutions) stays out. Harness files are written world-readable because the sandbox's
commands run as an unprivileged user.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import milo_ray

_code_lock = threading.Lock()
_code_dir: Path | None = None


def runtime_code_dir() -> Path:
    """A private, world-readable copy of this package's ``.py`` files (not its data: the
    bundled tasks' tests and solutions stay out), made once per process."""
    global _code_dir
    with _code_lock:
        if _code_dir is not None and _code_dir.is_dir():
            return _code_dir
        src = Path(milo_ray.__file__).resolve().parent
        root = Path(tempfile.mkdtemp(prefix="milo-runtime-"))
        os.chmod(root, 0o755)
        digest = hashlib.sha256()
        for path in sorted(src.rglob("*.py")):
            rel = path.relative_to(src)
            if rel.parts[0] == "data" or "__pycache__" in rel.parts:
                continue
            dst = root / "milo_ray" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            data = path.read_bytes()
            digest.update(str(rel).encode() + b"\0" + data)
            dst.write_bytes(data)
        for d, _, files in os.walk(root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        _code_dir = root
        return root


def write_harness(harness: Any, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    os.chmod(where, 0o755)
    for rel, text in harness.files.items():
        dst = where / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)
        os.chmod(dst, 0o644)
    for d, _, _ in os.walk(where):
        os.chmod(d, 0o755)
    return where


def cleanup_runtime_code() -> None:
    """Remove this process's copy of the package code (tests; a worker keeps it)."""
    global _code_dir
    with _code_lock:
        if _code_dir is not None:
            shutil.rmtree(_code_dir, ignore_errors=True)
            _code_dir = None
