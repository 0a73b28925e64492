"""Harness validation: is a candidate harness loadable, self-contained and general?

Owns :class:`ValidationResult`, :func:`validate`, :func:`validate_many` and the
generality check. Checks, in order:

1. *files*: every path is relative and stays inside the harness directory;
2. *generality* (text only, in this process): no source file contains a task id or
   a verbatim fragment of a task instruction, so a harness cannot memorize the
   tasks it is scored on (MILO §4.1.2 keeps mutations task-agnostic);
3. in a fresh sandbox (:mod:`milo_ray.harness._validate_child`), under an
   address-space limit, a CPU-time limit and a wall-clock timeout: every ``.py``
   compiles (a SyntaxError names file:line), every import resolves to the standard
   library, an installed distribution or a module inside the harness directory,
   ``harness.py`` imports, and its entry function accepts the runner's call:
   ``build_agent(model, backend)`` for an agent harness (``entry="build_agent"``),
   ``optimize(values, *, seed, deadline)`` for an optimizer program
   (``entry="optimize"``).

Harness code is untrusted (a mutator wrote it) and never runs in the caller's process:
the import check runs in the same kind of sandbox as rollouts (the run's ``sandbox``
group, bubblewrap by default; see :func:`sandbox_factory_from`), with an empty
environment (PATH, LANG and a HOME inside the sandbox's scratch: no key, no run
directory), no network, the harness files, the interpreter and the ``milo_ray`` package
read-only, an empty writable working directory, and the whole process tree killed at the
time cap. Validation never raises for a bad harness; it returns ``ok=False`` with a
one-line reason. A hostile child can still forge its own verdict (its code runs in the
checking interpreter), so a pass means "imports, in the sandbox": what it may do is
bounded by the rollout's sandbox, not by this check.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from milo_ray.boundary.sandbox.interpreter import interpreter_env, interpreter_paths
from milo_ray.boundary.sandbox.leftovers import make_scratch
from milo_ray.boundary.sandbox.process import ProcessEnd, waited
from milo_ray.boundary.sandbox.runtime_code import runtime_code_dir, write_harness
from milo_ray.harness._validate_child import ENTRIES
from milo_ray.harness.model import Harness

CHILD_MODULE = "milo_ray.harness._validate_child"
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


# --------------------------------------------------------------------------- sandbox

# The environment of the child, on top of what every sandbox sets (PATH, HOME inside the
# sandbox's own scratch, LANG, TMPDIR, TERM): nothing of the caller's, so no key, no run
# directory and no home reach harness code.
_CHILD_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    # Each BLAS/OpenMP thread reserves address space that counts against the limit.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_WORKDIR = "/validate"  # the child's (empty, writable) working directory inside the sandbox
_RESULT = f"{_WORKDIR}/result.json"  # read back through the sandbox's file transfer
_RESULT_ARG = "result.json"  # as the child is told it: relative to its working directory (the
# local sandbox runs commands on the host, where /validate does not exist)
_EXIT = f"{_WORKDIR}/exit.json"  # how the child ended, as its parent (EXIT_WAITER) saw it
_EXIT_ARG = "exit.json"
_TIMED_OUT_NOTE = "Error: command timed out after"
_fallback_warned = False


@functools.lru_cache(maxsize=1)
def default_sandbox() -> Any:
    """The sandbox validation uses when the run names none: bubblewrap with its defaults.
    Where bwrap cannot run (not installed, no user namespaces), the local sandbox (host
    processes, clean environment, no isolation of the filesystem or network), with a
    warning once per process; ``sandbox=`` of the run decides otherwise. Built (and bwrap
    probed) once per process."""
    from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory

    bwrap = BwrapSandboxFactory()
    why = bwrap.unsupported(_probe_spec())
    if why is None:
        return bwrap
    return _local_fallback(why)


def _local_fallback(why: str) -> Any:
    global _fallback_warned
    from milo_ray.boundary.sandbox.local import LocalSandboxFactory

    if not _fallback_warned:
        _fallback_warned = True
        logging.getLogger(__name__).warning(
            "harness validation cannot use bwrap here (%s): children are imported as host processes with an empty "
            "environment but without filesystem or network isolation; install bubblewrap", why)
    return LocalSandboxFactory(command_timeout_s=None)


def sandbox_factory_from(node: Any) -> Any:
    """The sandbox factory validation uses for a run's ``sandbox`` config (a ``_target_``
    mapping, a factory object, or None for :func:`default_sandbox`). A factory that cannot
    host the import check (Docker needs an image; it has none) gives way to the default."""
    if node is None:
        return default_sandbox()
    factory = node
    if not hasattr(node, "open"):
        from hydra.utils import instantiate

        try:
            factory = instantiate(node, _convert_="all")
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise ValueError(f"sandbox: {str(cause).strip().splitlines()[0] if str(cause).strip() else cause}") from None
    if factory.unsupported(_probe_spec()) is not None:
        return default_sandbox()
    return factory


def _spec(task_id: str, host_dir: Path | None, memory_mb: int | None) -> Any:
    from milo_ray.boundary.sandbox.base import SandboxSpec

    # The package as a private copy of its code (never the checkout, whose data holds the
    # bundled tasks' tests and solutions), importable first.
    code = str(runtime_code_dir())
    readonly = [*interpreter_paths(), code]
    env = {**_CHILD_ENV, **interpreter_env(), "PYTHONPATH": code}
    if host_dir is not None:
        # The harness's files: read-only, at their host path.
        readonly.append(str(host_dir))
    return SandboxSpec(task_id=task_id, workdir=_WORKDIR, allow_internet=False, memory_mb=memory_mb, env=env,
                       host_readonly=tuple(readonly))


def _probe_spec() -> Any:
    return _spec("harness-validation", None, None)


def _command(host_dir: Path, entry: str, timeout_s: float, memory_mb: int | None) -> str:
    # ulimit: a CPU-time limit, and an address-space limit that turns a huge allocation into
    # a MemoryError the child reports (a memory cgroup alone would kill it without a word,
    # or never notice an untouched allocation).
    limits = ["ulimit -c 0", f"ulimit -t {int(math.ceil(timeout_s)) + 1}"]
    if memory_mb is not None:
        limits.append(f"ulimit -v {int(memory_mb) * 1024}")
    argv = waited(sys.executable, _EXIT_ARG,
                  [sys.executable, "-P", "-m", CHILD_MODULE, str(host_dir), entry, _RESULT_ARG])
    return " && ".join(limits) + " && exec " + " ".join(shlex.quote(a) for a in argv)


def _validate_in_sandbox(factory: Any, harness: Harness, entry: str, timeout_s: float,
                         memory_mb: int | None) -> ValidationResult:
    """Import-check one harness in a fresh sandbox of ``factory``; never raises for a bad
    harness. The sandbox's scratch and the harness's host copy are removed afterwards."""
    t0 = time.monotonic()
    # Named with their owner: a process killed mid-check leaves them to the next one to remove.
    host_dir = make_scratch("validate-harness")
    scratch = make_scratch("validate")
    sandbox = None
    try:
        # World-readable: the sandbox's commands run as an unprivileged user.
        os.chmod(host_dir, 0o755)
        write_harness(harness, host_dir / "src")
        try:
            sandbox = factory.open(_spec(f"validate-{harness.harness_id}", host_dir, memory_mb), scratch)
        except Exception as e:  # the sandbox, not the harness, failed
            return ValidationResult(False, f"could not start the validation sandbox: {e}", time.monotonic() - t0,
                                    "crash")
        # The wall-clock cap is the command's timeout: the sandbox kills the whole process
        # tree at it (background processes included).
        oom_kills = getattr(sandbox, "oom_kills", lambda: None)
        oom_before = oom_kills()
        run = sandbox.execute(_command(host_dir, entry, timeout_s, memory_mb), timeout=max(1, math.ceil(timeout_s)))
        oom_after = oom_kills()
        seconds = time.monotonic() - t0
        got, ended = sandbox.download_files([_RESULT, _EXIT])
        oom = None if oom_before is None or oom_after is None else max(0, oom_after - oom_before)
        end = _observed_end(ended.content if ended.error is None else None, run, oom)
        return _verdict(run, got.content if got.error is None else None, seconds, timeout_s, end)
    finally:
        if sandbox is not None:
            sandbox.close()
        shutil.rmtree(host_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _observed_end(recorded: bytes | None, run: Any, oom_kills: int | None) -> ProcessEnd:
    """How the child ended: what its waiter recorded (an exit code, or the signal that
    killed it); without that record, the command's exit code as a number (a shell or
    bwrap may have made it of a signal, so it is never read as one)."""
    try:
        got = json.loads(recorded) if recorded is not None else None
    except ValueError:
        got = None
    sig = got.get("signal") if isinstance(got, dict) else None
    code = got.get("exit_code") if isinstance(got, dict) else run.exit_code
    if isinstance(sig, int) and not isinstance(sig, bool) and 0 < sig < 128:
        return ProcessEnd(signal=sig, oom_kills=oom_kills, stderr_tail=run.output or "")
    return ProcessEnd(exit_code=code if isinstance(code, int) and not isinstance(code, bool) else run.exit_code,
                      oom_kills=oom_kills, stderr_tail=run.output or "")


def _verdict(run: Any, result: bytes | None, seconds: float, timeout_s: float, end: ProcessEnd) -> ValidationResult:
    output = run.output or ""
    if run.exit_code == 124 and _TIMED_OUT_NOTE in output[-300:]:
        return ValidationResult(False, f"validation timed out after {timeout_s:g}s", seconds, "timeout")
    payload = None
    if result is not None and run.exit_code == 0:
        try:
            payload = json.loads(result.decode("utf-8", errors="replace"))
        except ValueError:
            payload = None
    if isinstance(payload, dict) and "ok" in payload:
        ok = payload["ok"] is True
        reason = None if ok else str(payload.get("reason") or "validation failed")[:2000]
        check = payload.get("check")
        return ValidationResult(ok, reason, seconds, None if ok else (check if isinstance(check, str) else "crash"))
    if end.signal == signal.SIGXCPU and not end.oom_kills:
        reason = f"validation exceeded its CPU-time limit ({int(math.ceil(timeout_s)) + 1}s)"
    else:
        reason = f"validation process ended without a result: {end.describe()}"
    return ValidationResult(False, reason, seconds, "crash")


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
    sandbox: Any = None,
) -> list[ValidationResult]:
    """Validate several harnesses, at most ``max_workers`` sandboxes at a time.

    ``forbidden_fragments`` may be a prebuilt :class:`ForbiddenIndex` (its own
    ``min_chars`` then applies). ``entry``: the entry function the harnesses must
    define (``build_agent`` or ``optimize``; see the module docstring). ``sandbox``: the
    factory the import checks run in (a :class:`~milo_ray.boundary.sandbox.base.SandboxFactory`,
    a ``sandbox`` config mapping, or None: :func:`default_sandbox`). Results are in input
    order; each sandbox is driven from its own thread (the sandbox starts and times out the
    process tree itself)."""
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
    if pending:
        factory = sandbox_factory_from(sandbox)

        def one(i: int) -> ValidationResult:
            return _validate_in_sandbox(factory, harnesses[i], entry, timeout_s, memory_mb)

        if len(pending) == 1 or max_workers == 1:
            for i in pending:
                results[i] = one(i)
        else:
            with ThreadPoolExecutor(max_workers=min(max_workers, len(pending)), thread_name_prefix="validate") as pool:
                for i, r in zip(pending, pool.map(one, pending)):
                    results[i] = r
    return [r for r in results if r is not None]


def validate(
    harness: Harness,
    *,
    forbidden_fragments: Sequence[str] | ForbiddenIndex = (),
    timeout_s: float = 60,
    memory_mb: int | None = 2048,
    min_fragment_chars: int = 40,
    entry: str = "build_agent",
    sandbox: Any = None,
) -> ValidationResult:
    """Validate one harness in a fresh sandbox (see the module docstring)."""
    return validate_many(
        [harness],
        forbidden_fragments=forbidden_fragments,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        min_fragment_chars=min_fragment_chars,
        max_workers=1,
        entry=entry,
        sandbox=sandbox,
    )[0]
