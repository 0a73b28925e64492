"""Running one command as a process tree with a timeout and a bounded output buffer.

The one place the framework runs a host command it must be able to stop: every sandbox
executes an agent's commands through :func:`run_capped` (or :func:`start_capped` when
something else must be able to kill the command while it runs), and so do the host-side
CLI mutator and the test sandbox. The child gets its own session, so its whole process
group can be killed at once; its output (stdout and stderr combined, or each on its own
with ``separate_stderr``) is read incrementally and, past what the cap keeps (the first
``output_cap_bytes``, plus the last ``tail_bytes`` when asked), read and thrown away, so a
command printing gigabytes costs CPU, never memory. On timeout the group is SIGKILLed (or
first SIGTERMed, ``term_grace_s`` before, for a command that saves its state on the way
out), and once the command ends any process it left behind in its group is killed too (a
backgrounded process ignoring SIGTERM must not outlive the command it belongs to).

How a process ended is told by what was observed (:class:`ProcessEnd`): its exit code,
the signal that killed it when its parent saw one (:data:`EXIT_WAITER` is such a parent
inside a sandbox, where a shell or bwrap in between would turn a signal into 128+N),
the OOM kills its memory cgroup counted, and a kill by our own timeout. Nothing else is
named as a cause.
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

# Bytes per read from the output pipe: the pipe buffer is 64 KiB on Linux, so one read
# empties it and a flood costs one syscall per buffer.
_READ_CHUNK = 65536
# Without a pidfd, wake up this often even without output, to notice that the leader
# exited while a background child still holds the pipe open (no EOF comes then), or that
# kill() was called. 50 ms keeps the added latency small and the wake-ups (20/s) negligible.
_POLL_S = 0.05
# Without a pidfd, how often to check for the leader's exit once its output has closed:
# the exit usually follows EOF within microseconds, so check often (1 ms).
_EOF_POLL_S = 0.001
# After the group is killed, how long to keep reading for the pipe to close. SIGKILLed
# writers close it within milliseconds; only a process that left the group (setsid) can
# keep it open, and one second is long enough not to cut a dying process's last output
# and short enough that such a process cannot stall the caller.
_DRAIN_GRACE_S = 1.0


class OutputCap:
    """One output stream as kept: its first ``head_bytes`` and its last ``tail_bytes``
    (the end of a log is often what matters: a usage summary, the final error), the bytes
    between counted and dropped. Memory is bounded by the two caps plus one read."""

    def __init__(self, head_bytes: int, tail_bytes: int = 0) -> None:
        self.head_bytes, self.tail_bytes = head_bytes, tail_bytes
        self._head = bytearray()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_len = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_bytes - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_bytes > 0:
            self._tail.append(chunk)
            self._tail_len += len(chunk)
            while self._tail_len - len(self._tail[0]) >= self.tail_bytes:
                self._tail_len -= len(self._tail.popleft())

    def _kept_tail(self) -> bytes:
        return b"".join(self._tail)[-self.tail_bytes:] if self.tail_bytes > 0 else b""

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._kept_tail())

    def text(self) -> str:
        """The kept bytes as utf-8 (undecodable bytes replaced), with a one-line marker
        where bytes were dropped."""
        tail = self._kept_tail()
        dropped = self.total - len(self._head) - len(tail)
        head = self._head.decode("utf-8", errors="replace")
        if not dropped:
            return head + tail.decode("utf-8", errors="replace")
        if not self.tail_bytes:
            return head + f"\n[output truncated: {self.total} bytes, only the first {len(self._head)} kept]\n"
        return head + f"\n[... {dropped} bytes dropped ...]\n" + tail.decode("utf-8", errors="replace")


@dataclass
class CappedRun:
    """What one command did. ``output`` is the combined stdout+stderr (only stdout with
    ``separate_stderr``, then ``stderr`` holds the other, kept the same way), at most
    ``output_cap_bytes`` of it (plus the last ``tail_bytes``; utf-8, undecodable bytes
    replaced), with a one-line marker where it was cut; ``exit_code`` is None when the
    timeout killed it (a death by signal N otherwise reads 128+N, as a shell reports it);
    ``seconds`` is wall-clock time."""

    output: str
    exit_code: int | None
    truncated: bool
    timed_out: bool
    seconds: float
    stderr: str | None = None


class CappedProcess:
    """A started command: :meth:`kill` ends its whole process group from any thread,
    :meth:`wait` reads its output to the end and returns the :class:`CappedRun`."""

    def __init__(
        self,
        argv: list[str],
        *,
        timeout_s: float | None,
        output_cap_bytes: int,
        tail_bytes: int = 0,
        separate_stderr: bool = False,
        term_grace_s: float = 0.0,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> None:
        if output_cap_bytes < 0:
            raise ValueError(f"output_cap_bytes must be >= 0, got {output_cap_bytes}")
        if tail_bytes < 0:
            raise ValueError(f"tail_bytes must be >= 0, got {tail_bytes}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None (no timeout), got {timeout_s}")
        if term_grace_s < 0:
            raise ValueError(f"term_grace_s must be >= 0, got {term_grace_s}")
        self._out = OutputCap(output_cap_bytes, tail_bytes)
        self._err = OutputCap(output_cap_bytes, tail_bytes) if separate_stderr else None
        self._timeout_s = timeout_s
        self._term_grace_s = term_grace_s
        self._start = time.monotonic()
        self._killed = threading.Event()
        # start_new_session: the child leads a new session and process group, so killpg
        # reaches it and every descendant that did not leave the group on purpose.
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
        self.pid = self._proc.pid
        if stdin is not None:
            # A writer thread: a large stdin written inline could fill the child's pipe
            # while the child waits for us to read its output (deadlock).
            threading.Thread(target=self._feed, args=(stdin,), daemon=True).start()

    def _feed(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
        except OSError:
            pass  # the child exited or closed stdin without reading everything
        finally:
            try:
                self._proc.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        """SIGKILL the command's process group (no-op once it is gone)."""
        self._killed.set()
        self._killpg()

    def _killpg(self, sig: int = signal.SIGKILL) -> None:
        # The group id is the leader's pid, which stays reserved as long as the leader is
        # unreaped (wait() reaps it only after this kill), so this never hits a stranger.
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _leader_exited(self) -> bool:
        # WNOWAIT: learn that the leader exited without reaping it, so its pid (the group
        # id) cannot be reused before the leftovers of the group are killed.
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def wait(self) -> CappedRun:
        """Read the output to the end (or the timeout), kill what is left of the group,
        reap the leader and return the result."""
        assert self._proc.stdout is not None
        caps = {self._proc.stdout.fileno(): self._out}
        if self._err is not None:
            assert self._proc.stderr is not None
            caps[self._proc.stderr.fileno()] = self._err
        open_fds = set(caps)
        timed_out = False
        deadline = None if self._timeout_s is None else self._start + self._timeout_s
        term_until: float | None = None  # SIGTERM sent at the timeout: SIGKILL at this time
        drain_until: float | None = None  # set once the group has been killed
        poller = select.poll()
        for fd in caps:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        # A pidfd becomes readable when the leader exits, so its exit wakes us at once even
        # while a background process keeps the pipe open (EOF then never comes). Without
        # pidfds (Linux < 5.3) we poll for the exit instead; see _POLL_S and _EOF_POLL_S.
        pidfd = _open_pidfd(self.pid)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        try:
            while True:
                now = time.monotonic()
                if drain_until is None:
                    if not timed_out and deadline is not None and now >= deadline:
                        timed_out = True
                        if self._term_grace_s > 0:
                            # The command may save its state; the leader's exit or the
                            # grace's end brings the SIGKILL below.
                            self._killpg(signal.SIGTERM)
                            term_until = now + self._term_grace_s
                    graced = timed_out and (term_until is None or now >= term_until)
                    if graced or self._killed.is_set() or self._leader_exited():
                        # The command ended (or must end): kill whatever is left of its group.
                        self._killpg()
                        drain_until = now + _DRAIN_GRACE_S
                        if pidfd is not None:
                            poller.unregister(pidfd)  # stays readable from now on
                if drain_until is not None and (not open_fds or now >= drain_until):
                    break
                if drain_until is not None:
                    waits = [drain_until]
                else:
                    waits = [term_until if timed_out else deadline]
                if pidfd is None or self._killed.is_set():
                    waits.append(now + (_POLL_S if open_fds else _EOF_POLL_S))
                waits = [w for w in waits if w is not None]
                wait_ms = max(0.0, min(waits) - now) * 1000 if waits else None
                for ready, _ in poller.poll(wait_ms):
                    if ready not in caps:
                        continue  # the pidfd: the leader exited, handled at the top
                    if ready not in open_fds:
                        continue
                    chunk = os.read(ready, _READ_CHUNK)
                    if not chunk:
                        # Every writer closed the pipe; the leader's exit is still awaited.
                        open_fds.discard(ready)
                        poller.unregister(ready)
                        continue
                    caps[ready].feed(chunk)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        self._proc.stdout.close()
        if self._proc.stderr is not None:
            self._proc.stderr.close()
        code = self._proc.wait()
        exit_code = None if timed_out else (128 - code if code < 0 else code)
        truncated = self._out.truncated or (self._err is not None and self._err.truncated)
        return CappedRun(self._out.text(), exit_code, truncated, timed_out, time.monotonic() - self._start,
                         stderr=None if self._err is None else self._err.text())


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python/kernel without pidfds
        return None


def start_capped(
    argv: list[str],
    *,
    timeout_s: float | None,
    output_cap_bytes: int,
    tail_bytes: int = 0,
    separate_stderr: bool = False,
    term_grace_s: float = 0.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    stdin: bytes | None = None,
) -> CappedProcess:
    """Start ``argv`` in its own process group; see :class:`CappedProcess`."""
    return CappedProcess(argv, timeout_s=timeout_s, output_cap_bytes=output_cap_bytes, tail_bytes=tail_bytes,
                         separate_stderr=separate_stderr, term_grace_s=term_grace_s, env=env, cwd=cwd, stdin=stdin)


def run_capped(
    argv: list[str],
    *,
    timeout_s: float | None,
    output_cap_bytes: int,
    tail_bytes: int = 0,
    separate_stderr: bool = False,
    term_grace_s: float = 0.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    stdin: bytes | None = None,
) -> CappedRun:
    """Run ``argv`` to completion or ``timeout_s`` (None: no timeout), keeping the first
    ``output_cap_bytes`` (and the last ``tail_bytes``) of its combined output, or of
    stdout and stderr each with ``separate_stderr``; on timeout SIGTERM the group
    ``term_grace_s`` before the SIGKILL (0: SIGKILL at once); ``env`` replaces the
    environment when given. Nothing of the process group survives the call."""
    return start_capped(argv, timeout_s=timeout_s, output_cap_bytes=output_cap_bytes, tail_bytes=tail_bytes,
                        separate_stderr=separate_stderr, term_grace_s=term_grace_s, env=env, cwd=cwd,
                        stdin=stdin).wait()

# A parent that tells an exit from a death by a signal (a shell reports both as a number):
# run through :func:`waited`, it runs argv, writes {"exit_code": N} or {"signal": N} to its
# first argument (atomically) and exits as a shell would (128+N for signal N). Only os and
# sys, under ``python -S``: it costs an interpreter start without site, and it is small
# next to the command it waits for, so an OOM killer choosing by size spares it.
EXIT_WAITER = (
    "import os, sys\n"
    "out, argv = sys.argv[1], sys.argv[2:]\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    try:\n"
    "        os.execvp(argv[0], argv)\n"
    "    finally:\n"
    "        os._exit(127)\n"
    "status = os.waitpid(pid, 0)[1]\n"
    "sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0\n"
    "code = 128 + sig if sig else os.waitstatus_to_exitcode(status)\n"
    "with open(out + '.tmp', 'w') as fh:\n"
    "    fh.write('{\"signal\": %d}' % sig if sig else '{\"exit_code\": %d}' % code)\n"
    "os.replace(out + '.tmp', out)\n"
    "os._exit(code)\n"
)


def waited(python: str, out: str, argv: list[str]) -> list[str]:
    """``argv`` run under :data:`EXIT_WAITER` by ``python``, its end recorded in ``out``."""
    return [python, "-S", "-c", EXIT_WAITER, out, *argv]


@dataclass(frozen=True)
class ProcessEnd:
    """How a process ended, as observed. ``exit_code``: the code it exited with (None when
    it did not exit on its own or nobody saw it); ``signal``: the signal that killed it,
    only when its parent saw it die of one; ``oom_kills``: OOM kills its memory cgroup
    counted while it ran (None: no such counter); ``timeout_s``: set when our own timeout
    killed it; ``stderr_tail``: the end of what it wrote to stderr."""

    exit_code: int | None = None
    signal: int | None = None
    oom_kills: int | None = None
    timeout_s: float | None = None
    stderr_tail: str = ""

    def describe(self) -> str:
        """One line naming only what was observed."""
        if self.timeout_s is not None:
            text = f"killed by the sandbox's timeout after {self.timeout_s:g} s"
        elif self.signal is not None:
            name = _signal_name(self.signal)
            text = f"killed by signal {self.signal}" + (f" ({name})" if name else "")
        elif self.exit_code is not None:
            text = f"exited with code {self.exit_code}"
        else:
            text = "ended without an exit status anyone observed"
        if self.oom_kills:
            oom = (f"out of memory: the sandbox's memory cgroup counted {self.oom_kills} OOM kill"
                   f"{'s' if self.oom_kills > 1 else ''} (its oom_kill counter)")
            # The timeout is what ended it; an OOM kill before it is worth knowing.
            text = f"{text}; {oom}" if self.timeout_s is not None else f"{oom}; {text}"
        tail = _last_lines(self.stderr_tail)
        return f"{text}; stderr ends: {tail}" if tail else text


def _signal_name(sig: int) -> str | None:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return None


def _last_lines(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-limit:]
