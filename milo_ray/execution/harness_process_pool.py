"""Warm harness processes: a sandbox opened and a harness process started (its
interpreter up, litellm, langchain and deepagents imported) before the rollout that will
use it is known, so a rollout does not wait seconds for imports.

A warm process is made for a sandbox *shape* -- a task's :class:`SandboxSpec` without its
task id and files (workdir, environment, limits, network, read-only paths): the rollout
that takes it copies its task's files into the workspace and writes its harness files
into the process's read-only harness directory, then hands over the job. Nothing of
another rollout is in it: a warm process has never run anything but its imports. Each
use starts the next one in the background. ``size`` bounds the spares per shape (each
holds a few hundred MB); 0 turns warming off.

Spares belong to the event loop that started them (their pipes do); a loop that ends
leaves its spares to :meth:`WarmPool.close` (or to the process exit, which kills them:
``--die-with-parent``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milo_ray.execution.harness_process_host import HarnessProcess

log = logging.getLogger(__name__)


@dataclass
class Spare:
    sandbox: Any
    process: HarnessProcess
    scratch: Path
    loop: asyncio.AbstractEventLoop


def shape(spec: Any) -> Any:
    """What a warm sandbox has to match (the spec without the task's id and files)."""
    return dataclasses.replace(spec, task_id="warm", copy_in=(), build_context=None, needs_docker=None)


class WarmPool:
    """Spares by shape (see the module docstring)."""

    def __init__(self, factory: Any, size: int, scratch_dir: str | None) -> None:
        if size < 0:
            raise ValueError(f"executor.warm_processes={size}: must be >= 0")
        self.factory, self.size, self.scratch_dir = factory, int(size), scratch_dir
        self._spares: dict[Any, list[Spare]] = {}
        self._filling: dict[Any, int] = {}
        self._tasks: set[asyncio.Task] = set()
        self._socket = ""

    def take(self, spec: Any) -> Spare | None:
        """A live spare of ``spec``'s shape on this loop, or None; starts its replacement."""
        if self.size == 0:
            return None
        key = repr(shape(spec))
        loop = asyncio.get_running_loop()
        found = None
        spares = self._spares.get(key, [])
        while spares:
            spare = spares.pop(0)
            if spare.loop is loop and spare.process.alive():
                found = spare
                break
            self._discard(spare)
        self.refill(spec)
        return found

    def refill(self, spec: Any, gateway_socket: str | None = None) -> None:
        if self.size == 0:
            return
        if gateway_socket is not None:
            self._socket = gateway_socket
        shaped = shape(spec)
        key = repr(shaped)
        missing = self.size - len(self._spares.get(key, [])) - self._filling.get(key, 0)
        for _ in range(max(0, missing)):
            self._filling[key] = self._filling.get(key, 0) + 1
            t = asyncio.ensure_future(self._start(key, shaped))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _start(self, key: str, spec: Any) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="milo-rollout-", dir=self.scratch_dir))
        sandbox = process = None
        try:
            sandbox = await asyncio.to_thread(self.factory.open, spec, scratch / "agent")
            process = HarnessProcess(sandbox, None, scratch, self._socket)
            await process.start()
            self._spares.setdefault(key, []).append(Spare(sandbox, process, scratch, asyncio.get_running_loop()))
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.warning("could not start a warm harness process", exc_info=True)
            if process is not None:
                process.kill()
            if sandbox is not None:
                sandbox.close()
            shutil.rmtree(scratch, ignore_errors=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._filling[key] -= 1

    def _discard(self, spare: Spare) -> None:
        spare.process.kill()
        try:
            spare.sandbox.close()
        finally:
            shutil.rmtree(spare.scratch, ignore_errors=True)

    def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for spares in self._spares.values():
            for spare in spares:
                self._discard(spare)
        self._spares.clear()
