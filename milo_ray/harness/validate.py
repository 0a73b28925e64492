"""Harness validation: is a candidate harness loadable, self-contained and general?

Owns :class:`ValidationResult`, :func:`validate`, :func:`validate_many` and the
generality check. Checks, in order:

1. *files*: every path is relative and stays inside the harness directory;
2. *generality* (text only, in this process): no source file contains a task id or
   a verbatim fragment of a task instruction, so a harness cannot memorize the
   tasks it is scored on (MILO §4.1.2 keeps mutations task-agnostic);
3. in a fresh subprocess (:mod:`milo_ray.harness._validate_child`), under an
   address-space limit, a CPU-time limit and a wall-clock timeout: every ``.py``
   compiles (a SyntaxError names file:line), every import resolves to the standard
   library, an installed distribution or a module inside the harness directory,
   ``harness.py`` imports, and its entry function accepts the runner's call:
   ``build_agent(model, backend)`` for an agent harness (``entry="build_agent"``),
   ``optimize(values, *, seed, deadline)`` for an optimizer program
   (``entry="optimize"``).

Harness code never runs in the caller's process. The subprocess isolates the
caller, not the filesystem: sandboxing rollouts is the executor's job. Validation
never raises for a bad harness; it returns ``ok=False`` with a one-line reason.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

import milo_ray
from milo_ray.harness._validate_child import ENTRIES
from milo_ray.harness.model import Harness

CHILD_MODULE = "milo_ray.harness._validate_child"
_POLL_S = 0.02
_WS = re.compile(r"\s+")
_HASH_BASE = np.uint64(1_000_003)


@dataclass(frozen=True)
class ValidationResult:
    """``ok``: the harness passed every check. ``reason``: one line saying what failed
    and where (None when ok). ``seconds``: wall time spent validating.
    ``check``: the failed check (files, generality, syntax, imports, import, entry,
    signature, timeout, crash), None when ok."""

    ok: bool
    reason: str | None
    seconds: float
    check: str | None = None


# --------------------------------------------------------------------------- generality


def _normalize(text: str) -> str:
    return _WS.sub(" ", text.casefold()).strip()


def _window_hashes(text: str, width: int) -> np.ndarray:
    """Polynomial hash (mod 2**64) of every ``width``-character window of ``text``.

    O(len(text) * width) vectorized; numpy's uint64 arithmetic wraps, which is the
    modulus we want."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    n = codes.size - width + 1
    if n <= 0:
        return np.empty(0, dtype=np.uint64)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(width):
        h = h * _HASH_BASE + codes[j : j + n]
    return h


class ForbiddenIndex:
    """Task ids and instruction texts a harness must not contain.

    A fragment without whitespace is an *identifier* (a task id): forbidden as a
    whole token (not inside a longer identifier), case-insensitively. A fragment
    with whitespace is *text* (an instruction): forbidden is any verbatim piece of
    at least ``min_chars`` characters, compared case-insensitively after collapsing
    whitespace; text shorter than ``min_chars`` is too short to prove copying, and a
    piece that every one of several instructions contains is shared boilerplate, not
    any task's (allowed).

    Building hashes every ``min_chars`` window of every text once (200 texts of
    2 KB: ~0.4 M windows, a few MB); checking a source is one vectorized pass plus
    a binary search per window, then an exact string comparison for each hit."""

    def __init__(self, fragments: Iterable[str], *, min_chars: int = 40) -> None:
        if min_chars < 1:
            raise ValueError(f"min_fragment_chars must be >= 1, got {min_chars}")
        self.min_chars = min_chars
        ids: set[str] = set()
        texts: list[str] = []
        for frag in fragments:
            if not isinstance(frag, str):
                raise ValueError(f"forbidden_fragments: expected strings, got {type(frag).__name__}")
            stripped = frag.strip()
            if not stripped:
                continue
            if _WS.search(stripped):
                norm = _normalize(stripped)
                if len(norm) >= min_chars:
                    texts.append(norm)
            else:
                ids.add(stripped.casefold())
        self.identifiers = tuple(sorted(ids))
        self.texts = tuple(texts)
        hashes = [_window_hashes(t, min_chars) for t in texts]
        owners = [np.full(h.size, i, dtype=np.int32) for i, h in enumerate(hashes)]
        all_h = np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64)
        all_o = np.concatenate(owners) if owners else np.empty(0, dtype=np.int32)
        order = np.argsort(all_h, kind="stable")
        self._hashes = all_h[order]
        self._owners = all_o[order]

    def find(self, text: str) -> str | None:
        """A description of the first forbidden content in ``text``, or None."""
        folded = text.casefold()
        for ident in self.identifiers:
            start = folded.find(ident)
            while start >= 0:
                end = start + len(ident)
                before = folded[start - 1] if start else " "
                after = folded[end] if end < len(folded) else " "
                if not (_is_word(before) and _is_word(ident[0])) and not (_is_word(after) and _is_word(ident[-1])):
                    return f"task id {ident!r}"
                start = folded.find(ident, start + 1)
        if not self.texts:
            return None
        norm = _normalize(text)
        hh = _window_hashes(norm, self.min_chars)
        if hh.size == 0:
            return None
        pos = np.searchsorted(self._hashes, hh)
        pos_c = np.minimum(pos, self._hashes.size - 1)
        for i in np.flatnonzero(self._hashes[pos_c] == hh):
            window = norm[i : i + self.min_chars]
            owner = int(self._owners[pos_c[i]])
            # Equal hashes are confirmed by an exact comparison (collisions are possible).
            if window in self.texts[owner] or any(window in t for t in self.texts):
                # Text that every instruction shares is the benchmark's boilerplate (an
                # answer format, a program contract), not any task's: copying it
                # memorizes nothing. With one instruction nothing can be told shared.
                if len(self.texts) > 1 and all(window in t for t in self.texts):
                    continue
                shown = window if len(window) <= 60 else window[:57] + "..."
                return f"a verbatim fragment of a task instruction ({self.min_chars}+ chars): {shown!r}"
        return None


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


@functools.lru_cache(maxsize=8)
def _cached_index(fragments: tuple[str, ...], min_chars: int) -> ForbiddenIndex:
    return ForbiddenIndex(fragments, min_chars=min_chars)


def forbidden_fragments_for(tasks: Iterable) -> tuple[str, ...]:
    """Task ids and instructions of ``tasks`` (objects with ``task_id`` and
    ``instruction``), the usual ``forbidden_fragments`` argument."""
    out: list[str] = []
    for t in tasks:
        out.append(t.task_id)
        out.append(t.instruction)
    return tuple(out)


def generality_violation(
    harness: Harness, forbidden_fragments: Sequence[str] | ForbiddenIndex = (), *, min_fragment_chars: int = 40
) -> str | None:
    """``file: contains ...`` for the first file that names a task, or None. Text only."""
    index = (
        forbidden_fragments
        if isinstance(forbidden_fragments, ForbiddenIndex)
        else _cached_index(tuple(forbidden_fragments), min_fragment_chars)
    )
    for path in sorted(harness.files):
        hit = index.find(harness.files[path])
        if hit:
            return f"{path}: contains {hit}; harnesses must be task-agnostic"
    return None


def _path_violation(harness: Harness) -> str | None:
    for path in sorted(harness.files):
        p = PurePosixPath(path)
        if p.is_absolute() or ".." in p.parts or "\\" in path or not p.parts:
            return f"file path {path!r} must be relative and stay inside the harness directory"
    return None


# --------------------------------------------------------------------------- subprocess


def _apply_limits(memory_bytes: int | None, cpu_seconds: int) -> None:
    """preexec_fn: runs in the forked child before exec; only pre-imported modules."""
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child_env(boot: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Only the milo_ray package is added to the child's path (through a symlink), so
    # the repository's other top-level folders do not look like installed modules.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(boot), env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Each BLAS/OpenMP thread reserves address space that counts against the limit.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


@dataclass
class _Job:
    index: int
    workdir: Path
    proc: subprocess.Popen
    started: float
    deadline: float


def _start(index: int, harness: Harness, entry: str, timeout_s: float, memory_mb: int | None, started: float) -> _Job:
    workdir = Path(tempfile.mkdtemp(prefix="milo_ray_validate_"))
    try:
        harness.write_to(workdir / "src")
        (workdir / "cwd").mkdir()
        (workdir / "boot").mkdir()
        (workdir / "boot" / "milo_ray").symlink_to(Path(milo_ray.__file__).resolve().parent)
        with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", CHILD_MODULE, str(workdir), entry],
                cwd=workdir / "cwd",
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=_child_env(workdir / "boot"),
                preexec_fn=functools.partial(
                    _apply_limits,
                    None if memory_mb is None else int(memory_mb) * 1024 * 1024,
                    int(math.ceil(timeout_s)) + 1,
                ),
                start_new_session=True,  # one process group: a timeout kills its children too
                close_fds=True,
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return _Job(index, workdir, proc, started, started + timeout_s)


def _kill(job: _Job) -> None:
    try:
        os.killpg(job.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    job.proc.wait()


def _tail(path: Path, limit: int = 300) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-limit:] if lines else ""


def _collect(job: _Job, memory_mb: int | None, timeout_s: float, timed_out: bool) -> ValidationResult:
    try:
        seconds = time.monotonic() - job.started
        if timed_out:
            return ValidationResult(False, f"validation timed out after {timeout_s:g}s", seconds, "timeout")
        rc = job.proc.returncode
        try:
            lines = [ln for ln in (job.workdir / "stdout").read_text(errors="replace").splitlines() if ln.strip()]
            payload = json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):
            payload = None
        if isinstance(payload, dict) and "ok" in payload:
            ok = bool(payload["ok"])
            reason = None if ok else str(payload.get("reason") or "validation failed")
            return ValidationResult(ok, reason, seconds, None if ok else payload.get("check"))
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
            if -rc == signal.SIGXCPU:
                reason = f"validation exceeded its CPU-time limit ({int(math.ceil(timeout_s)) + 1}s)"
            elif -rc == signal.SIGKILL and memory_mb is not None:
                reason = "validation process was killed by SIGKILL (out of memory, or killed from outside)"
            else:
                reason = f"validation process was killed by {name}"
        else:
            tail = _tail(job.workdir / "stderr")
            reason = f"validation process exited with code {rc} without a result" + (f": {tail}" if tail else "")
        return ValidationResult(False, reason, seconds, "crash")
    finally:
        shutil.rmtree(job.workdir, ignore_errors=True)


def _check_options(timeout_s: float, memory_mb: int | None, max_workers: int, entry: str) -> None:
    if entry not in ENTRIES:
        raise ValueError(f"entry must be one of {sorted(ENTRIES)}, got {entry!r}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if memory_mb is not None and not (isinstance(memory_mb, int) and memory_mb > 0):
        raise ValueError(f"memory_mb must be a positive integer (MB) or None for no limit, got {memory_mb!r}")
    if not (isinstance(max_workers, int) and max_workers >= 1):
        raise ValueError(f"max_workers must be an integer >= 1, got {max_workers!r}")


def validate_many(
    harnesses: Sequence[Harness],
    *,
    forbidden_fragments: Sequence[str] | ForbiddenIndex = (),
    timeout_s: float = 60,
    memory_mb: int | None = 2048,
    min_fragment_chars: int = 40,
    max_workers: int = 2,
    entry: str = "build_agent",
) -> list[ValidationResult]:
    """Validate several harnesses, at most ``max_workers`` subprocesses at a time.

    ``forbidden_fragments`` may be a prebuilt :class:`ForbiddenIndex` (its own
    ``min_chars`` then applies). ``entry``: the entry function the harnesses must
    define (``build_agent`` or ``optimize``; see the module docstring). Results
    are in input order. The subprocesses are driven from the calling thread
    (no thread pool), so the preexec_fn that sets the resource limits never forks
    from a thread this module started. Callers that validate from worker threads
    (``asyncio.to_thread``) are still safe in practice: the preexec_fn only makes
    setrlimit system calls, and it runs after the new session is created, so even a
    child stuck before exec is killed with its group at the timeout."""
    _check_options(timeout_s, memory_mb, max_workers, entry)
    index = (
        forbidden_fragments
        if isinstance(forbidden_fragments, ForbiddenIndex)
        else _cached_index(tuple(forbidden_fragments), min_fragment_chars)
    )
    results: list[ValidationResult | None] = [None] * len(harnesses)
    pending: list[int] = []
    for i, h in enumerate(harnesses):
        t0 = time.monotonic()
        bad = _path_violation(h)
        check = "files"
        if bad is None:
            bad, check = generality_violation(h, index), "generality"
        if bad is not None:
            results[i] = ValidationResult(False, bad, time.monotonic() - t0, check)
        else:
            pending.append(i)
    pending.reverse()
    running: list[_Job] = []
    try:
        while pending or running:
            while pending and len(running) < max_workers:
                i = pending.pop()
                t0 = time.monotonic()
                try:
                    running.append(_start(i, harnesses[i], entry, timeout_s, memory_mb, t0))
                except OSError as e:
                    results[i] = ValidationResult(False, f"could not start validation: {e}", time.monotonic() - t0, "crash")
            for job in list(running):
                if job.proc.poll() is not None:
                    running.remove(job)
                    results[job.index] = _collect(job, memory_mb, timeout_s, timed_out=False)
                elif time.monotonic() >= job.deadline:
                    _kill(job)
                    running.remove(job)
                    results[job.index] = _collect(job, memory_mb, timeout_s, timed_out=True)
            if running:
                time.sleep(_POLL_S)
    finally:
        for job in running:  # interrupted: leave no validation process behind
            _kill(job)
            shutil.rmtree(job.workdir, ignore_errors=True)
    return [r for r in results if r is not None]


def validate(
    harness: Harness,
    *,
    forbidden_fragments: Sequence[str] | ForbiddenIndex = (),
    timeout_s: float = 60,
    memory_mb: int | None = 2048,
    min_fragment_chars: int = 40,
    entry: str = "build_agent",
) -> ValidationResult:
    """Validate one harness in a fresh subprocess (see the module docstring)."""
    return validate_many(
        [harness],
        forbidden_fragments=forbidden_fragments,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        min_fragment_chars=min_fragment_chars,
        max_workers=1,
        entry=entry,
    )[0]
