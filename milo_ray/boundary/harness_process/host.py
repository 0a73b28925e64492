"""Starting a rollout's harness process inside its sandbox and reading what it says.

The rollout worker never imports a harness. For each rollout it writes the harness files
(:func:`harness_dir_of`), starts :mod:`milo_ray.boundary.inside.harness_process` inside the
rollout's sandbox (:meth:`~milo_ray.boundary.sandbox.bwrap.BwrapSandbox.process_command`)
with three read-only binds -- a private copy of this package's Python code
(:func:`runtime_code_dir`, so no path of the checkout is visible), the harness files and
the process's gateway directory -- writes the job to its stdin, and reads its stdout as
bounded, schema-checked JSON lines (:mod:`milo_ray.boundary.trajectory`).

The gateway directory (:func:`gateway_dir_of`): each process has one of its own, made by
the host beside the harness files (on the worker's neutral root, else in the rollout's
scratch: outside anything a sandbox can write) and shown to the sandbox, read-only, at :data:`INSIDE_GATEWAY_DIR`. The
rollout's grant gets its own listening socket made *in* that directory
(:meth:`~milo_ray.boundary.gateway.server.ModelGateway.issue_bound`) before the job is
sent, and the job names it at the fixed path :data:`INSIDE_GATEWAY`. Binding the directory
rather than the socket is what lets a warm process (:mod:`.pool`), whose
sandbox is made before its rollout's grant exists, get that grant's socket at assignment:
a bind is fixed when the sandbox starts, but a socket made later in a bound directory
appears in it. No other rollout's socket is ever in the directory, so a token learnt
elsewhere has no socket here that would take it.

Caps, all enforced here by killing the process's whole tree (its process group, its PID
namespace and its cgroup):

* ``startup_timeout_s``: importing the harness and ``build_agent`` (a harness whose import
  loops forever costs this, and only its own slot: it is another process);
* the task's agent time, from the moment the process says ``started``;
* the gateway's caps: when the rollout's grant stops (token cap, cap on model calls) the
  process is ended at once, as the in-process executor stopped the agent's stream;
* the protocol: a line longer than :data:`MAX_LINE_BYTES`, more than
  :data:`MAX_STREAM_BYTES` in all, or a line that is not a valid message ends it as a
  harness failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milo_ray.core.storable import storable, storable_text
from milo_ray.boundary.gateway.ledger import GRANT_SOCKET
from milo_ray.boundary.sandbox import neutral
from milo_ray.boundary.sandbox.runtime_code import runtime_code_dir, write_harness
from milo_ray.boundary.trajectory import ProtocolError, StepLog, parse_message

MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_STREAM_BYTES = 64 * 1024 * 1024
STDERR_TAIL_BYTES = 8192
# Where the sandbox sees what this module binds into it (on its root tmpfs).
INSIDE_CODE = "/run/milo/lib"
INSIDE_HARNESS = "/run/milo/harness"
INSIDE_GATEWAY_DIR = "/run/milo/gateway"
INSIDE_GATEWAY = f"{INSIDE_GATEWAY_DIR}/{GRANT_SOCKET}"
TASK_TOOLS_SOCKET = "task-tools.sock"
INSIDE_TASK_TOOLS = f"{INSIDE_GATEWAY_DIR}/{TASK_TOOLS_SOCKET}"
_BOOT = (f"import sys; sys.path.insert(0, {INSIDE_CODE!r}); "
         "from milo_ray.boundary.inside.harness_process import main; main()")

@dataclass
class ProcessRun:
    """How the harness process went. ``status``: completed, step_cap, harness_error,
    timeout, token_cap or call_cap; ``seconds``: agent time (from ``started``);
    ``endpoint_error``: the harness process *says* its agent failed on a model-client
    error (informational only: the gateway's record decides the failure's class); ``startup_s``: from
    launch to ``started``."""

    status: str
    seconds: float = 0.0
    error: str | None = None
    endpoint_error: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: str = ""
    startup_s: float | None = None


class HarnessProcess:
    """One harness process in one sandbox (see the module docstring)."""

    def __init__(self, sandbox: Any, harness: Any, scratch: Path) -> None:
        """``harness`` None: a warm process, started before its rollout is known
        (:meth:`start`); :meth:`assign` gives it its harness. Its grant's socket is made in
        :attr:`gateway_dir` before the job is sent."""
        self.sandbox, self.harness = sandbox, harness
        where = harness_dir_of(scratch)
        self.harness_dir = write_harness(harness, where) if harness is not None else _empty_dir(where)
        self.gateway_dir = _empty_dir(gateway_dir_of(scratch))
        self.proc: asyncio.subprocess.Process | None = None
        self.log = StepLog()
        self.ready, self.started = asyncio.Event(), asyncio.Event()
        self.final: dict[str, Any] | None = None
        self.protocol_error: str | None = None
        self._stderr = bytearray()
        self._launched = 0.0
        self._started_at: float | None = None

    async def start(self) -> None:
        # The first call copies (and compiles) the package's code: off the event loop.
        await asyncio.to_thread(runtime_code_dir)
        prefix, args, command = self.sandbox.process_command([sys.executable, "-I", "-c", _BOOT],
                                                             harness_binds(self.harness_dir, self.gateway_dir))
        from milo_ray.boundary.sandbox.bwrap import LAUNCH_ENV

        pipes = dict(stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                     start_new_session=True, limit=MAX_LINE_BYTES)
        if not args:
            # Docker: a ``docker exec`` client, whose own environment never enters the
            # container; it needs the worker's to find the daemon.
            self._launched = time.monotonic()
            self.proc = await asyncio.create_subprocess_exec(*prefix, *command, **pipes)
        else:
            fd = os.memfd_create("bwrap-args")
            try:
                os.write(fd, b"".join(a.encode() + b"\0" for a in args))
                os.lseek(fd, 0, os.SEEK_SET)
                self._launched = time.monotonic()
                self.proc = await asyncio.create_subprocess_exec(*prefix, "--args", str(fd), *command,
                                                                 env=dict(LAUNCH_ENV), pass_fds=(fd,), **pipes)
            finally:
                os.close(fd)
        self._readers = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr())]

    def assign(self, harness: Any) -> None:
        """Give a warm process its harness (the files appear in its read-only bind)."""
        self.harness = harness
        write_harness(harness, self.harness_dir)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and self.final is None \
            and self.protocol_error is None

    @property
    def task_tools_socket(self) -> Path:
        """Where the host makes the socket of a task's tool channel (an ARE scenario's app
        tools), for this process only: in its gateway directory, beside its grant's socket."""
        return self.gateway_dir / TASK_TOOLS_SOCKET

    def job(self, task: Any, *, token: str, recursion_limit: int, model: dict[str, Any],
            task_tools: bool = False) -> dict[str, Any]:
        """The job line. ``task_tools``: the task's tool channel is being served at
        :attr:`task_tools_socket`, and the harness gets its tools."""
        return {"harness_dir": INSIDE_HARNESS, "harness_id": self.harness.harness_id,
                "task_tools": INSIDE_TASK_TOOLS if task_tools else None,
                "multi_file": len(self.harness.files) > 1, "instruction": task.instruction,
                "recursion_limit": int(recursion_limit), "gateway_socket": INSIDE_GATEWAY, "token": token,
                "model": model, "workdir": self.sandbox.spec.workdir, "env": self.sandbox.env,
                "command_timeout_s": getattr(self.sandbox, "command_timeout_s", None),
                "output_cap_bytes": int(getattr(self.sandbox, "output_cap_bytes", 100_000))}

    async def send_job(self, job: dict[str, Any]) -> None:
        import json

        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")
        try:
            await self.proc.stdin.drain()
            self.proc.stdin.close()
        except (ConnectionError, BrokenPipeError):
            pass  # it died already; the reader reports how

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        total = 0
        try:
            while True:
                try:
                    line = await self.proc.stdout.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    raise ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes") from None
                if not line:
                    return
                total += len(line)
                if total > MAX_STREAM_BYTES:
                    raise ProtocolError(f"more than {MAX_STREAM_BYTES} bytes of trajectory")
                # Where the harness's text enters the host: made storable here, once.
                msg = storable(parse_message(line))
                kind = msg["t"]
                if kind == "ready":
                    self.ready.set()
                elif kind == "started":
                    self._started_at = time.monotonic()
                    self.started.set()
                elif kind == "steps":
                    self.log.apply(msg["start"], msg["steps"])
                elif kind == "final":
                    self.final = msg
                    return
        except ProtocolError as exc:
            self.protocol_error = str(exc)
            self.kill()

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            chunk = await self.proc.stderr.read(65536)
            if not chunk:
                return
            self._stderr += chunk
            if len(self._stderr) > STDERR_TAIL_BYTES:
                del self._stderr[:-STDERR_TAIL_BYTES]

    def kill(self) -> None:
        """SIGKILL the process's group: bwrap, whose PID namespace dies with it, or the
        ``docker exec`` client (what it started in the container is :meth:`finish`'s)."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    async def finish(self) -> None:
        """Kill whatever is left, reap, and stop the readers."""
        self.kill()
        # Killing a ``docker exec`` client leaves its processes running in the container:
        # the sandbox's interrupt kills them (a control call, so off the event loop).
        await asyncio.to_thread(self.sandbox.interrupt)
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                pass
        for r in getattr(self, "_readers", []):
            try:
                await asyncio.wait_for(r, 2)
            except (asyncio.TimeoutError, Exception):
                r.cancel()

    def stderr_tail(self) -> str:
        return storable_text(self._stderr.decode("utf-8", errors="replace"))

    async def run(self, task: Any, *, job: dict[str, Any], startup_timeout_s: float, agent_cap_s: float | None,
                  stopped: asyncio.Event) -> ProcessRun:
        """Start, hand over the job, wait under the caps; always leaves nothing running."""
        try:
            return await self._run(job, startup_timeout_s, agent_cap_s, stopped)
        finally:
            await self.finish()

    async def _run(self, job: dict[str, Any], startup_timeout_s: float, agent_cap_s: float | None,
                   stopped: asyncio.Event) -> ProcessRun:
        if self.proc is None:
            await self.start()
        assert self.proc is not None
        begun = time.monotonic()  # a warm process was launched long before its job
        exited = asyncio.ensure_future(self.proc.wait())
        reader = self._readers[0]
        stop = asyncio.ensure_future(stopped.wait())
        try:
            deadline = begun + startup_timeout_s
            for phase in (self.ready, self.started):
                waiter = asyncio.ensure_future(phase.wait())
                done, _ = await asyncio.wait({waiter, reader, stop}, timeout=max(0.0, deadline - time.monotonic()),
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if waiter not in done:
                    return self._ended_early(startup_timeout_s, done, reader, stop)
                if phase is self.ready:
                    await self.send_job(job)
            startup = time.monotonic() - begun
            done, _ = await asyncio.wait({reader, stop}, timeout=agent_cap_s, return_when=asyncio.FIRST_COMPLETED)
            seconds = time.monotonic() - (self._started_at or time.monotonic())
            if stop in done:
                return self._result("stopped", seconds, startup)
            if not done:
                return self._result("timeout", seconds, startup)
            # The reader ended: the final line, a protocol error, or the process died.
            return self._result("ended", seconds, startup)
        finally:
            stop.cancel()
            exited.cancel()

    def _ended_early(self, startup_timeout_s: float, done: set, reader: Any, stop: Any) -> ProcessRun:
        if stop in done:
            return self._result("stopped", 0.0, None)
        if reader in done:
            return self._result("ended", 0.0, None)
        return ProcessRun("harness_error", error=f"the harness did not start within {startup_timeout_s:g} s "
                          "(its import or build_agent did not return; the process was killed)",
                          stderr_tail=self.stderr_tail())

    def _result(self, how: str, seconds: float, startup: float | None) -> ProcessRun:
        run = ProcessRun("harness_error", seconds=seconds, steps=self.log.steps(), stderr_tail=self.stderr_tail(),
                         startup_s=startup)
        if how == "stopped":
            run.status = "stopped"  # the executor names the gateway's reason
        elif how == "timeout":
            run.status = "timeout"
        elif self.protocol_error:
            run.error = f"the harness process broke the trajectory protocol ({self.protocol_error}) and was killed"
        elif self.final is not None:
            run.status = self.final["status"]
            run.error = self.final.get("error")
            run.endpoint_error = bool(self.final.get("endpoint_error"))
        else:
            code = self.proc.returncode if self.proc is not None else None
            run.error = f"the harness process ended without a result (exit status {code})"
        return run


def harness_dir_of(scratch: Path) -> Path:
    """Where the harness files of the rollout with scratch directory ``scratch`` go."""
    return _place_of(scratch) / "harness"


def gateway_dir_of(scratch: Path) -> Path:
    """Where a rollout's grant socket is made (the directory its sandbox is shown)."""
    return _place_of(scratch) / "gateway"


_places: dict[str, Path] = {}  # a rollout's scratch -> its directory on the neutral root
_places_lock = threading.Lock()


def _place_of(scratch: Path) -> Path:
    """The directory holding a rollout's harness files and gateway directory: a fresh one
    on the worker's neutral root (so the sandbox's mountinfo names no host path, see
    :mod:`milo_ray.boundary.sandbox.neutral`), the same for every call with this scratch;
    without a neutral root, the scratch itself. The directory lives as long as the
    scratch: the owner of a rollout removes its scratch when the rollout ends, and the
    next call here removes the directories of scratches that are gone."""
    key = os.path.abspath(scratch)
    with _places_lock:
        for other, where in list(_places.items()):
            if other != key and not os.path.lexists(other):
                neutral.remove(where)
                del _places[other]
        where = _places.get(key)
        if where is None:
            where = neutral.fresh_dir("r")
            if where is None:
                return Path(scratch)
            _places[key] = where
        return where


def harness_binds(harness_dir: Path, gateway_dir: Path) -> dict[str, str]:
    """What the harness process sees read-only (host path -> sandbox path): the package's
    code copy, the harness files and its own gateway directory (see the module docstring)."""
    return {str(runtime_code_dir()): INSIDE_CODE, str(harness_dir): INSIDE_HARNESS,
            str(gateway_dir): INSIDE_GATEWAY_DIR}


def _empty_dir(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    os.chmod(where, 0o755)
    return where
