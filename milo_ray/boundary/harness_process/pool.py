"""Warm harness processes: a sandbox opened and a harness process started (its
interpreter up, langchain and deepagents imported) before the rollout that will use it is
known, so a rollout does not wait seconds for imports.

A warm process is made for a sandbox *shape* -- a task's :class:`SandboxSpec` without its
task id and files (workdir, environment, limits, network, read-only paths): the rollout
that takes it copies its task's files into the workspace and writes its harness files
into the process's read-only harness directory, its grant's socket is made in the
process's own gateway directory (bound, empty, when the sandbox opened: see
:mod:`.host`), then it hands over the job. Nothing of
another rollout is in it: a warm process has never run anything but its imports, and
:meth:`WarmPool.take` hands each one out once (the rollout's end kills it).

How many spares a shape keeps (``size``): a number, or ``"auto"`` -- as many as this
executor has had rollouts of that shape in flight at once (a worker's slots, once they
have all been busy), so that every concurrent rollout finds one. Each use starts its
replacement in the background; at most :data:`MAX_STARTING` spares import at once (more
would only share the same cores and make each one later). Opening and closing sandboxes
runs in threads, never on the event loop, and the imports run in the spare's own process.
0 turns warming off.

The pool is not tied to the harness process: ``process_factory(sandbox, scratch)`` makes
the process a spare holds (default :class:`HarnessProcess`); the optimizer executor's
spares are runners with numpy imported (:mod:`milo_ray.boundary.optimizer_process`). A
process offers ``start()``, ``ready`` (an event set once its imports are done),
``_readers[0]`` (a task that ends when it exits), ``alive()``, ``kill()`` and ``finish()``.

Spares belong to the event loop that started them (their pipes do); a loop that ends
leaves its spares to :meth:`WarmPool.close` (or to the process exit, which kills them:
``--die-with-parent``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milo_ray.boundary.harness_process.host import HarnessProcess
from milo_ray.boundary.sandbox.leftovers import make_scratch

log = logging.getLogger(__name__)

AUTO = "auto"
# Spares importing at once: one per core (imports are CPU-bound and single-threaded).
MAX_STARTING = max(1, os.cpu_count() or 1)


@dataclass
class Spare:
    sandbox: Any
    process: HarnessProcess
    scratch: Path
    loop: asyncio.AbstractEventLoop


def shape(spec: Any) -> Any:
    """What a warm sandbox has to match (the spec without the task's id and files)."""
    return dataclasses.replace(spec, task_id="warm", copy_in=(), build_context=None, needs_docker=None)


def parse_size(size: Any) -> int | str:
    """``executor.warm_processes`` as the pool takes it: an int >= 0 or ``"auto"``."""
    if isinstance(size, str) and size.strip().lower() == AUTO:
        return AUTO
    try:
        n = int(size)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or isinstance(size, bool):
        raise ValueError(f"executor.warm_processes={size!r}: must be 'auto' (as many spares as rollouts in "
                         "flight) or a number >= 0 (0: no warm processes)")
    return n


class WarmPool:
    """Spares by shape (see the module docstring)."""

    def __init__(self, factory: Any, size: Any, scratch_dir: str | None, *, max_starting: int = MAX_STARTING,
                 process_factory: Any = None) -> None:
        self.factory, self.scratch_dir = factory, scratch_dir
        self.process_factory = process_factory or (lambda sandbox, scratch: HarnessProcess(sandbox, None, scratch))
        self.mode = parse_size(size)
        self.max_starting = max(1, int(max_starting))
        self._spares: dict[str, list[Spare]] = {}
        self._shapes: dict[str, Any] = {}
        self._in_flight: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self._opening: dict[str, int] = {}  # being started, not yet in _spares
        self._opening_here: dict[tuple[str, int], int] = {}  # the same by (shape, event loop)
        self._importing = 0  # started (in _spares or handed out), imports not yet done
        self._waiters: dict[str, list[asyncio.Future]] = {}  # rollouts waiting for a spare being opened
        self._tasks: set[asyncio.Task] = set()
        self.handed_out = 0  # spares given to rollouts (each once)

    @property
    def size(self) -> int:
        """Spares per shape when fixed; for ``auto``, 1 when enabled (callers test truth)."""
        return 1 if self.mode == AUTO else int(self.mode)

    def target(self, key: str) -> int:
        """Spares the shape ``key`` keeps."""
        if self.mode == AUTO:
            return max(1, self._peak.get(key, 0))
        return int(self.mode)

    # --- a rollout's side ---------------------------------------------------------------------
    async def take(self, spec: Any) -> Spare | None:
        """A live spare of ``spec``'s shape on this loop (possibly still importing), or None;
        counts the rollout as in flight until :meth:`release` and starts replacements.
        With none held but one being opened that no other rollout waits for, it waits for
        that one (begun earlier, it is ready sooner than a process of its own, and it does
        not start the same imports twice). A spare is removed from the pool as it is handed
        out: no other rollout gets it."""
        if self.size == 0:
            return None
        key = self._key(spec)
        # Counted before anything can be cancelled: the caller's release() always follows.
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._peak[key] = max(self._peak.get(key, 0), self._in_flight[key])
        loop = asyncio.get_running_loop()
        found = None
        spares = self._spares.get(key, [])
        while spares:
            spare = spares.pop(0)
            if spare.loop is loop and spare.process.alive():
                found = spare
                break
            self._discard(spare)
        # Only a start on this loop can be waited for (its spare's pipes are this loop's).
        waiting = [w for w in self._waiters.get(key, []) if w.get_loop() is loop and not w.done()]
        if found is None and self._opening_here.get((key, id(loop)), 0) > len(waiting):
            waiter = loop.create_future()
            self._waiters.setdefault(key, []).append(waiter)
            self._fill()
            try:
                found = await waiter  # None: that start failed
            except asyncio.CancelledError:
                # Handed over just as this rollout was cancelled: nobody else may have it.
                if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                    self._discard(waiter.result())
                raise
        else:
            self._fill()
        if found is not None:
            self.handed_out += 1
        return found

    def release(self, spec: Any) -> None:
        """The rollout :meth:`take` counted has ended."""
        if self.size == 0:
            return
        key = self._key(spec)
        self._in_flight[key] = max(0, self._in_flight.get(key, 0) - 1)

    def refill(self, spec: Any) -> None:
        """Start spares of ``spec``'s shape up to its target (without taking one)."""
        if self.size == 0:
            return
        self._key(spec)
        self._fill()

    def _key(self, spec: Any) -> str:
        shaped = shape(spec)
        key = repr(shaped)
        self._shapes.setdefault(key, shaped)
        return key

    def _fill(self) -> None:
        """Start what is missing, shape by shape, within :attr:`max_starting`."""
        for key, shaped in self._shapes.items():
            while (sum(self._opening.values()) + self._importing < self.max_starting
                   and len(self._spares.get(key, [])) + self._opening.get(key, 0) < self.target(key)):
                self._opening[key] = self._opening.get(key, 0) + 1
                here = (key, id(asyncio.get_running_loop()))
                self._opening_here[here] = self._opening_here.get(here, 0) + 1
                t = asyncio.ensure_future(self._start(key, shaped))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)

    async def _start(self, key: str, spec: Any) -> None:
        sandbox = process = scratch = None
        listed = False
        here = (key, id(asyncio.get_running_loop()))
        try:
            # Directories and the sandbox (mounts, cgroup) in a thread: never on the loop.
            scratch, sandbox, process = await asyncio.to_thread(self._open, spec)
            await process.start()
            spare = Spare(sandbox, process, scratch, asyncio.get_running_loop())
            if not self._hand_to_waiter(key, spare):
                self._spares.setdefault(key, []).append(spare)
            self._opening[key] -= 1
            self._opening_here[here] -= 1
            self._importing += 1
            listed = True
            # Counted as importing until its imports are done (or it died), so that at most
            # max_starting import at once; it can be handed out before that.
            ready = asyncio.ensure_future(process.ready.wait())
            try:
                await asyncio.wait({ready, process._readers[0]}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.warning("could not start a warm harness process", exc_info=True)
            if sandbox is not None and not listed:
                if process is not None:
                    process.kill()
                await asyncio.to_thread(close_sandbox, sandbox, scratch)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if listed:
                self._importing -= 1
            else:
                self._opening[key] -= 1
                self._opening_here[here] -= 1
                self._hand_to_waiter(key, None)  # it goes cold instead
        self._fill()

    def _hand_to_waiter(self, key: str, spare: Spare | None) -> bool:
        loop = asyncio.get_running_loop()
        waiters = self._waiters.get(key, [])
        for waiter in list(waiters):
            if waiter.done():  # a rollout cancelled while waiting leaves a done future
                waiters.remove(waiter)
            elif waiter.get_loop() is loop:
                waiters.remove(waiter)
                waiter.set_result(spare)
                return True
        return False

    def _open(self, spec: Any) -> tuple[Path, Any, HarnessProcess]:
        scratch = make_scratch("rollout", self.scratch_dir)
        try:
            sandbox = self.factory.open(spec, scratch / "agent")
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        try:
            return scratch, sandbox, self.process_factory(sandbox, scratch)
        except BaseException:
            close_sandbox(sandbox, scratch)
            raise

    def _discard(self, spare: Spare) -> None:
        """Kill a spare that will not be used and close its sandbox in a thread."""
        spare.process.kill()
        try:
            t = asyncio.ensure_future(asyncio.to_thread(close_sandbox, spare.sandbox, spare.scratch))
        except RuntimeError:  # no running loop: close() at the end of a run
            close_sandbox(spare.sandbox, spare.scratch)
            return
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        for t in list(self._tasks):
            t.cancel()
        for spares in self._spares.values():
            for spare in spares:
                spare.process.kill()
                close_sandbox(spare.sandbox, spare.scratch)
        self._spares.clear()

    async def aclose(self) -> None:
        """:meth:`close` on the spares' own loop: also waits until their processes are reaped."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        spares = [s for v in self._spares.values() for s in v]
        self._spares.clear()
        for spare in spares:
            await spare.process.finish()
            await asyncio.to_thread(close_sandbox, spare.sandbox, spare.scratch)

    def spares(self) -> int:
        """Spares held now (started or importing), all shapes."""
        return sum(len(s) for s in self._spares.values())


def close_sandbox(sandbox: Any, scratch: Path | None) -> None:
    """Close a spare's sandbox, then remove its scratch (None: keep it), whatever the close raised."""
    try:
        sandbox.close()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
