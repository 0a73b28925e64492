"""Runs one optimizer program inside the sandbox (``executor=optimizer``).

This file is copied into the sandbox's workspace, with the problem's formulas
(:mod:`milo_ray.kernels.autocorr_kit`, uploaded beside it as ``autocorr_kit.py``) and the
optimizer building blocks (:mod:`milo_ray.boundary.inside.optimizer_blocks`, uploaded as
``optimizer_blocks.py``), and run
by the sandbox's interpreter as
``python optimizer_runner.py harness.py start.npy PROBLEM SEED BUDGET_S GRACE_S``, or
started ahead of its program as a warm spare (:func:`serve`). It imports numpy and the
standard library only, and the formulas and the blocks import scipy only when a program
calls what needs it (milo_ray is not visible in the sandbox).

What it does:

* imports scipy only for a program that names a given helper needing it
  (:func:`import_what_it_names`: scipy.fft for the formulas, scipy.optimize for the
  L-BFGS blocks), before ``optimize`` is called so that no stage's share of the time pays
  for it; a program that reaches a helper without naming it gets the import on first use;
* loads ``harness.py`` as a module (:func:`load_program`) whose namespace already holds
  the names the program is given (:func:`given_names`): the formulas' public names
  (exact scores, the smoothed max and its gradient, projections), the building blocks'
  (the ratchet ``offer``/``best``/``best_score``/``reset_best``, ``run_stages``, the L-BFGS
  ladder and polish, upsampling, warm restarts), ``PROBLEM`` (the problem's
  name) and the runner's ``publish``; a name the program defines itself replaces the given
  one, except ``PROBLEM`` and ``publish``, set again after its top level ran. It then calls
  ``optimize(start, seed=SEED, deadline=T0 + BUDGET_S)`` where T0 is this process's
  ``time.monotonic()`` at startup (the program's imports count against its budget);
* a call to ``publish(values)`` only copies the point and timestamps it (a few tens of
  microseconds at 65,536 points), so a program may publish on every improvement. A writer
  thread saves the newest point to ``best.npy`` (atomically: tmp + rename) and appends
  ``[t, score, publishes]`` to ``trajectory.jsonl``, at most every ``FLUSH_S`` seconds and
  never spending more than ~1/``_WRITE_BUDGET_FACTOR`` of the time doing so: bounded work
  however often the program publishes. ``score`` is the FFT score computed here (NaN for
  an infeasible point, with the verifier's tolerances); the executor re-scores the final
  point with the project's kernels;
* the value ``optimize`` returns is published last (None: keep the last published point);
* a watchdog thread ends the process at ``deadline + GRACE_S`` after saving the newest
  point: a program that ignores its deadline still leaves its last published point. (The
  watchdog, not a SIGTERM handler, does this: a Python signal handler runs only in the
  main thread between bytecodes, which is exactly what a stuck program does not give it;
  the watchdog thread needs only the GIL, and the executor's hard kill covers a program
  that never releases even that.)

``status.json`` says how the run ended: ``returned``, ``timeout`` (the watchdog) or
``crashed`` (with the error); missing when the process was killed from outside.

A warm spare (:func:`serve`, :mod:`milo_ray.boundary.optimizer_process`) is this module
imported in a fresh sandbox before its program is known: it prints :data:`READY` once
numpy and the runner are imported, reads one job (the arguments above and an exit file, as
one JSON line) from stdin, restarts its clock (T0) and runs :func:`main` once, in a forked
child whose end it records; then the process ends. It never runs a second program.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import threading
import time
import traceback

T0 = time.monotonic()

import numpy as np  # noqa: E402  (T0 first: the runner's own imports count as startup)

if __package__:  # imported as milo_ray.boundary.inside.optimizer_runner (the executor, tools, tests)
    from milo_ray.boundary.inside import optimizer_blocks as blocks  # noqa: E402
    from milo_ray.kernels import autocorr_kit as kit  # noqa: E402
else:  # run as a script in the sandbox: the copies uploaded beside this file (sys.path[0])
    import autocorr_kit as kit  # noqa: E402
    import optimizer_blocks as blocks  # noqa: E402

BEST_FILE = "best.npy"
TRAJECTORY_FILE = "trajectory.jsonl"
STATUS_FILE = "status.json"
# Newest point saved at least this often while the program publishes.
FLUSH_S = 0.2
# A flush (score + save) may use at most 1/this of the wall time: at 65,536 points a
# flush costs a few ms, so the interval stays FLUSH_S; at millions of points it grows.
_WRITE_BUDGET_FACTOR = 50.0
# Exit code of a run the watchdog ended (the executor reads status.json, this is for logs).
WATCHDOG_EXIT = 3
# The file names the formulas and the building blocks are uploaded under, beside the
# runner (their import names).
KIT_FILE = "autocorr_kit.py"
BLOCKS_FILE = "optimizer_blocks.py"
# What a warm spare prints on stdout once its imports are done (see serve()).
READY = "milo-optimizer-ready"


def _numpy_conv(a, b):
    """Full linear convolution by numpy's FFT: the trajectory's scores are the runner's
    own bookkeeping (the executor re-scores the final point with the project's kernels),
    and numpy's FFT spares a program that never touches scipy its ~0.2 s import."""
    size = a.shape[0] + b.shape[0] - 1
    nfft = 1 << (size - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(a, nfft) * np.fft.rfft(b, nfft), nfft)[:size]


def fft_score(problem: str, h: np.ndarray) -> float:
    """The problem's score by FFT with the verifier's tolerances, NaN when ``h`` is not a
    feasible construction."""
    try:
        h = np.asarray(h, dtype=np.float64)
    except (TypeError, ValueError):
        return float("nan")
    s = kit.score(h, problem, box_tol=kit.VERIFIER_BOX_TOL, convolve=_numpy_conv)
    return s if math.isfinite(s) else float("nan")


# --------------------------------------------------------------------------- what a program is given


def given_names(namespace: dict) -> dict:
    """The names a program finds in its namespace before its own code runs: the
    formulas (:data:`autocorr_kit.GIVEN`) and the building blocks
    (:data:`optimizer_blocks.GIVEN`: the ratchet, ``run_stages``, the L-BFGS ladder and
    polish, upsampling, warm restarts), bound to a fresh record that publishes through
    ``namespace`` (the program's module dict)."""
    names = {name: getattr(kit, name) for name in kit.GIVEN}
    names.update(blocks.Blocks(namespace).given())
    return names


def load_program(path: str, problem: str, publish, *, module_name: str = "optimizer_program"):
    """Import the program at ``path`` with the given names, ``PROBLEM`` and ``publish`` in
    its namespace. A name the program defines replaces the given one (a program written
    before the names were given keeps all its own helpers), except ``PROBLEM`` and
    ``publish``, set again after its top level ran. The given helpers call each other, never
    a program's replacement (the ratchet's ``offer`` projects with the given ``project``).
    Raises what the program's import raises."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    vars(module).update(given_names(vars(module)), PROBLEM=problem, publish=publish)
    spec.loader.exec_module(module)
    # Set again: a program may define placeholders for these two (the seeds' layout did).
    module.PROBLEM = problem
    module.publish = publish
    return module


# Given names that need no scipy: the constants, the projections, the ratchet's record.
_NO_SCIPY = {"FIRST", "THIRD", "ERDOS", "PROBLEMS", "ERDOS_SUM_TOL", "project", "normalize", "jitter", "best",
             "best_score", "reset_best"}


def _names_in(code) -> set[str]:
    """Every global and attribute name the code object and those nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_in(const)
    return names


def import_what_it_names(path: str) -> list[str]:
    """Import the scipy modules the given helpers the program at ``path`` names will need
    (over-approximated by the names its code uses); returns their names. A program that
    names none (or does not compile: its import reports that) imports no scipy here."""
    try:
        with open(path, "rb") as fh:
            names = _names_in(compile(fh.read(), path, "exec", dont_inherit=True))
    except (OSError, SyntaxError, ValueError):
        return []
    given = (set(kit.GIVEN) | set(blocks.GIVEN)) - _NO_SCIPY
    wanted = []
    if names & given:
        wanted.append("scipy.fft")
    if names & set(blocks.USES_LBFGS):
        wanted.append("scipy.optimize")
    for name in wanted:
        importlib.import_module(name)
    return wanted


class Publisher:
    """Keeps the newest published point; :meth:`flush` saves it (bounded work, see the
    module docstring). ``publish`` is what the program calls."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self._lock = threading.Lock()  # guards _latest/_count (publish vs. flush)
        self._flush_lock = threading.Lock()  # one flush at a time (writer, watchdog, main)
        self._latest: tuple[float, np.ndarray] | None = None
        self._count = 0
        self._written = 0
        self.interval = FLUSH_S

    def publish(self, values) -> None:
        """Record an improved point (copied: the program may keep mutating its array)."""
        h = np.array(values, dtype=np.float64)
        t = time.monotonic() - T0
        with self._lock:
            self._latest = (t, h)
            self._count += 1

    def flush(self) -> None:
        with self._flush_lock:
            with self._lock:
                latest, count = self._latest, self._count
            if latest is None or count == self._written:
                return
            began = time.monotonic()
            t, h = latest
            with open(BEST_FILE + ".tmp", "wb") as fh:
                np.save(fh, h, allow_pickle=False)
            os.replace(BEST_FILE + ".tmp", BEST_FILE)
            with open(TRAJECTORY_FILE, "a") as fh:
                fh.write(json.dumps([round(t, 6), fft_score(self.problem, h), count]) + "\n")
            self._written = count
            self.interval = max(FLUSH_S, _WRITE_BUDGET_FACTOR * (time.monotonic() - began))

    def writer(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.flush()


def _write_status(status: str, error: str | None = None) -> None:
    with open(STATUS_FILE + ".tmp", "w") as fh:
        json.dump({"status": status, "error": error, "seconds": round(time.monotonic() - T0, 6)}, fh)
    os.replace(STATUS_FILE + ".tmp", STATUS_FILE)


# Held by whoever ends the run (main after optimize, or the watchdog), so the two never
# both write status.json.
_ending = threading.Lock()


def _watchdog(publisher: Publisher, at: float, grace_s: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    if not _ending.acquire(blocking=False):
        return  # main is already saving the result
    publisher.flush()
    _write_status("timeout", f"still running {grace_s:g} s after its deadline; stopped")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(WATCHDOG_EXIT)


def main(argv: list[str]) -> int:
    program, start_file, problem, seed, budget_s, grace_s = argv
    budget_s, grace_s = float(budget_s), float(grace_s)
    deadline = T0 + budget_s
    publisher = Publisher(problem)
    threading.Thread(target=_watchdog, args=(publisher, deadline + grace_s, grace_s), daemon=True).start()
    stop = threading.Event()
    writer = threading.Thread(target=publisher.writer, args=(stop,), daemon=True)
    writer.start()
    start = np.load(start_file, allow_pickle=False)
    status, error = "returned", None
    try:
        try:
            # The program's sibling files import as from a package directory.
            sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
            module = load_program(program, problem, publisher.publish)
        except BaseException as exc:  # SyntaxError, ImportError, SystemExit at import...
            raise RuntimeError(f"importing {os.path.basename(program)} failed: {type(exc).__name__}: {exc}") from exc
        if not callable(getattr(module, "optimize", None)):
            raise RuntimeError(f"{os.path.basename(program)} defines no optimize(values, *, seed, deadline)")
        import_what_it_names(program)
        result = module.optimize(start, seed=int(seed), deadline=deadline)
        if result is not None:
            try:
                publisher.publish(result)
            except (TypeError, ValueError) as exc:
                raise RuntimeError(f"optimize returned {type(result).__name__}, not a vector of numbers: {exc}") from None
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from the program too
        traceback.print_exc()
        status, error = "crashed", f"{type(exc).__name__}: {exc}"
    _ending.acquire()  # blocks forever if the watchdog is ending the run: it exits the process
    stop.set()
    publisher.flush()
    _write_status(status, error[:2000] if error else None)
    return 0


def serve() -> int:
    """A warm spare's one run: say :data:`READY`, read the job (one JSON line:
    ``{"argv": [the runner's 6 arguments], "exit_file": name or null}``) from stdin,
    restart the clock and run :func:`main` once. Its imports happened before the job came,
    so the program's budget starts when the job arrives.

    With ``exit_file``, :func:`main` runs in a forked child and this process waits for it
    and records how it ended there, as ``process.EXIT_WAITER`` does for a cold runner:
    ``{"exit_code": N}`` or ``{"signal": N}`` (bwrap would fold a signal into 128+N). The
    fork copies the imports already done, so the waiter costs no interpreter start."""
    global T0
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        return 1  # the host discarded this spare unused
    job = json.loads(line)
    argv = job.get("argv") if isinstance(job, dict) else None
    if not (isinstance(argv, list) and len(argv) == 6 and all(isinstance(a, str) for a in argv)):
        raise SystemExit(f"a warm runner's job is {{'argv': [the runner's 6 arguments], 'exit_file': ...}}, "
                         f"got {line[:200]!r}")
    T0 = time.monotonic()
    exit_file = job.get("exit_file")
    if not exit_file:
        return main(argv)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = main(argv)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    with open(exit_file + ".tmp", "w") as fh:
        json.dump({"signal": -code} if code < 0 else {"exit_code": code}, fh)
    os.replace(exit_file + ".tmp", exit_file)
    # os._exit, not a return into sys.exit: finalizing an interpreter that holds numpy
    # takes tens of ms, for nothing (its files are written and closed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
