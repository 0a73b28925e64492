"""A warm optimizer runner: one sandbox, one interpreter with numpy and the runner
imported, started before the program it will run is known, used for exactly one program.

The optimizer executor's floor per candidate is mostly an interpreter starting and
importing numpy (scipy only when a program calls what needs it: see
:mod:`milo_ray.boundary.inside.optimizer_runner`). A spare pays that ahead of need, in its own
freshly opened sandbox: :meth:`OptimizerProcess.start` uploads the runner, the formulas
and the blocks into the sandbox's workdir and starts ``optimizer_runner.serve()`` there
(:meth:`~milo_ray.boundary.sandbox.bwrap.BwrapSandbox.process_command`: same mounts,
user, limits and cgroup as the sandbox's commands). The rollout that takes it (through
:class:`~milo_ray.boundary.harness_process.pool.WarmPool`, which hands each spare out
once) uploads its program and start, then :meth:`OptimizerProcess.run` sends the job;
the runner runs that one program and exits, and the rollout closes the sandbox. Nothing
of another candidate is in a spare: it has run nothing but its imports, and its sandbox
(files, /tmp, processes) is discarded with it.

The program's stdout and stderr come back through pipes, of which only the last
``TAIL_BYTES`` each are kept (a program printing without end costs reading, not
memory).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from milo_ray.boundary.inside import optimizer_runner as runner
from milo_ray.boundary.sandbox.interpreter import interpreter_paths, under_any

RUNNER_FILE = "optimizer_runner.py"
# Bytes of the program's stdout and stderr kept in the trace.
TAIL_BYTES = 4000


def runner_files(runner_name: str = RUNNER_FILE) -> dict[str, bytes]:
    """The files a program runs with, uploaded beside it (file name -> content): the
    runner as ``runner_name``, and the formulas and the building blocks it gives the
    program under the names it imports them by."""
    return {runner_name: Path(runner.__file__).read_bytes(), runner.KIT_FILE: Path(runner.kit.__file__).read_bytes(),
            runner.BLOCKS_FILE: Path(runner.blocks.__file__).read_bytes()}


# What the spare runs: the runner uploaded into the workdir, imported as a module. The
# interpreter starts with -S and is given its site-packages directly: ``site`` would run
# every .pth file of the host's site-packages (import hooks of editable installs and the
# like: ~30 ms of CPU per candidate here) for nothing a program needs.
_BOOT = ("import sys; sys.path[:0] = [{workdir!r}]; sys.path += {site!r}; import optimizer_runner as r; "
         "sys.exit(r.serve())")
# Bytes per read from a pipe (one pipe buffer).
_CHUNK = 65536


@functools.lru_cache(maxsize=1)
def site_paths() -> list[str]:
    """What ``site`` would add to ``sys.path`` that a sandbox can see: this interpreter's
    site-packages and the directories their .pth files name (their ``import`` lines,
    which run code, are not followed), those under the interpreter's own directories only
    (the sandbox shows nothing else of the host)."""
    import site

    visible = interpreter_paths()
    out: list[str] = []
    for sp in site.getsitepackages():
        if not os.path.isdir(sp) or not under_any(sp, visible):
            continue
        out.append(sp)
        for pth in sorted(Path(sp).glob("*.pth")):
            try:
                lines = pth.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                d = os.path.normpath(os.path.join(sp, line))
                if os.path.isdir(d) and under_any(d, visible) and d not in out:
                    out.append(d)
    return out


class OptimizerProcess:
    """One warm runner in one sandbox (see the module docstring); ``workdir`` is where the
    sandbox's runner files and program go."""

    def __init__(self, sandbox: Any, scratch: Path, workdir: str) -> None:
        self.sandbox, self.scratch, self.workdir = sandbox, scratch, workdir
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self._readers: list[asyncio.Future] = []
        self._tails = {"stdout": bytearray(), "stderr": bytearray()}
        self.job_sent = False

    async def start(self) -> None:
        files = [(f"{self.workdir}/{name}", content) for name, content in runner_files().items()]
        uploaded = await asyncio.to_thread(self.sandbox.upload_files, files)
        errors = [f"{r.path}: {r.error}" for r in uploaded if getattr(r, "error", None)]
        if errors:
            raise RuntimeError(f"a warm runner's sandbox cannot hold the runner: {'; '.join(errors[:3])}")
        boot = _BOOT.format(workdir=self.workdir, site=site_paths())
        prefix, args, command = self.sandbox.process_command([sys.executable, "-I", "-S", "-c", boot])
        if not args:
            raise RuntimeError("a warm optimizer runner needs a sandbox that takes its options through a file "
                               "descriptor (bwrap)")
        from milo_ray.boundary.sandbox.bwrap import LAUNCH_ENV

        fd = os.memfd_create("bwrap-args")
        try:
            os.write(fd, b"".join(a.encode() + b"\0" for a in args))
            os.lseek(fd, 0, os.SEEK_SET)
            self.proc = await asyncio.create_subprocess_exec(
                *prefix, "--args", str(fd), *command, env=dict(LAUNCH_ENV), pass_fds=(fd,),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
        finally:
            os.close(fd)
        self._readers = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr())]

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        # The first line is the runner's READY (printed before any program exists); the
        # rest is the program's output.
        first = await self.proc.stdout.readline()
        if first.rstrip(b"\n") == runner.READY.encode():
            self.ready.set()
        else:
            self._keep("stdout", first)
        await self._drain(self.proc.stdout, "stdout")

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        await self._drain(self.proc.stderr, "stderr")

    async def _drain(self, stream: asyncio.StreamReader, name: str) -> None:
        while True:
            chunk = await stream.read(_CHUNK)
            if not chunk:
                return
            self._keep(name, chunk)

    def _keep(self, name: str, chunk: bytes) -> None:
        tail = self._tails[name]
        tail += chunk
        if len(tail) > TAIL_BYTES:
            del tail[:-TAIL_BYTES]

    def tail(self, name: str) -> str:
        return self._tails[name].decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and not self.job_sent

    async def run(self, argv: list[str], timeout_s: float, exit_file: str | None = None) -> tuple[int | None, bool]:
        """Send the runner's ``argv`` (its one job; ``exit_file``: where its waiter records
        how it ended, see ``optimizer_runner.serve``) and wait until it exits or
        ``timeout_s`` passes (then kill it). Returns (exit code, killed at the timeout)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.job_sent = True
        job = {"argv": [str(a) for a in argv], "exit_file": exit_file}
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")
        try:
            await self.proc.stdin.drain()
            self.proc.stdin.close()
        except (ConnectionError, BrokenPipeError):
            pass  # it died already: its exit code says how
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            await self.finish()
            return 124, True  # as the sandbox's execute reports a command it killed at its timeout
        # The readers end when every writer closed the pipes (the PID namespace is gone).
        await self.finish()
        return (128 - code if code < 0 else code), False

    def kill(self) -> None:
        """SIGKILL bwrap's process group: its PID namespace, and so the runner, dies with it."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    async def finish(self) -> None:
        """Kill whatever is left, reap, and let the readers take the last output."""
        self.kill()
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                pass
        if self._readers:
            done, pending = await asyncio.wait(self._readers, timeout=1.0)
            for r in pending:
                r.cancel()
