"""What a sandbox sees of the framework's code and of a harness.

A process inside a sandbox that needs this package (the harness process, a child's import
check) gets a private, world-readable copy of its Python files rather than the checkout
(on the worker's neutral root where there is one, :mod:`neutral`): no path of the
checkout is visible, and the package's data (the bundled tasks' tests and
solutions) stays out. Harness files are written world-readable because the sandbox's
commands run as an unprivileged user.

The copy carries its bytecode: the sandbox cannot write ``__pycache__`` (the copy is
read-only there), so without it every harness process would compile the modules it
imports from source. A ``.py`` keeps its source's mtime, so the worker's own up-to-date
``.pyc`` (validated the way the interpreter validates it: source mtime and size) is copied
as it is; any other module is compiled once into the copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import py_compile
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import milo_ray
from milo_ray.boundary.sandbox.neutral import worker_root

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
        root = _fresh_root()
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
            _copy_bytecode(path, dst, data)
        for d, _, files in os.walk(root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        _code_dir = root
        return root


def _fresh_root() -> Path:
    """Where the copy goes: ``lib`` on the worker's neutral root (so a sandbox's mountinfo
    shows the bind's root as ``/lib``, :mod:`neutral`), else a temporary directory."""
    neutral_root = worker_root()
    if neutral_root is None:
        root = Path(tempfile.mkdtemp(prefix="milo-runtime-"))
    else:
        root = neutral_root / "lib"
        shutil.rmtree(root, ignore_errors=True)  # a copy cleanup_runtime_code dropped
        root.mkdir()
    os.chmod(root, 0o755)
    return root


def _copy_bytecode(src: Path, dst: Path, data: bytes) -> None:
    """Give ``dst`` (a copy of ``src`` with content ``data``) its ``.pyc``: the source's own
    when it is current for ``data``, else a fresh compile."""
    st = src.stat()
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    cached, target = importlib.util.cache_from_source(str(src)), importlib.util.cache_from_source(str(dst))
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    try:
        pyc = Path(cached).read_bytes()
    except OSError:
        pyc = b""
    if _current(pyc, st.st_mtime, len(data)):
        Path(target).write_bytes(pyc)
        return
    try:
        py_compile.compile(str(dst), cfile=target, doraise=True)
    except py_compile.PyCompileError:
        pass  # the sandbox compiles it in memory (and reports the syntax error) as before


def _current(pyc: bytes, mtime: float, size: int) -> bool:
    """Whether ``pyc`` is a timestamp-validated ``.pyc`` of this interpreter for a source of
    ``mtime`` and ``size`` (PEP 552's header: magic, flags 0, mtime, size)."""
    return (len(pyc) >= 16 and pyc[:4] == importlib.util.MAGIC_NUMBER and pyc[4:8] == b"\0\0\0\0"
            and int.from_bytes(pyc[8:12], "little") == (int(mtime) & 0xFFFFFFFF)
            and int.from_bytes(pyc[12:16], "little") == (size & 0xFFFFFFFF))


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
