"""Child processes in tests and trials: killing a driver the way a crash does (SIGKILL
its process group and every Ray process it started), and reading a child's JSON report.

Ray puts the raylet, the GCS and the workers a driver started in process groups of their
own, so killing the driver's group leaves them running (and the next session could join
them). They are found instead by the session's private ``RAY_TMPDIR``, which is on each
of their command lines.
"""

from __future__ import annotations

import json
import os
import signal
import time


def reap_session(pgid: int, ray_tmp: str) -> None:
    """SIGKILL the process group ``pgid`` and every process whose command line names
    ``ray_tmp``, until none is left (about 5 s at most)."""
    for _ in range(100):
        left = [pid for pid in pids_mentioning(ray_tmp) if pid != os.getpid()]
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            if not left:
                return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def kill_driver_when(argv: list[str], env: dict[str, str], ray_tmp: str, ready, *, what: str,
                     timeout_s: float = 240.0) -> None:
    """Start a driver (``argv``, in a session of its own, with ``env``, whose
    ``RAY_TMPDIR`` is ``ray_tmp``), wait until ``ready()`` is true, then kill it and
    every Ray process it started as a crash does. An AssertionError naming ``what`` and
    the driver's last output when it exits or ``timeout_s`` passes first."""
    import subprocess

    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                return
            time.sleep(0.2)
        tail = proc.stdout.read().decode()[-3000:] if proc.poll() is not None else "still running"
        raise AssertionError(f"the driver never got {what}: {tail}")
    finally:
        reap_session(proc.pid, ray_tmp)
        proc.wait()


def pids_mentioning(text: str) -> list[int]:
    """Every process whose command line holds ``text`` followed by a slash."""
    needle = text.rstrip("/").encode() + b"/"
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        out.append(int(entry))
            except OSError:
                pass
    return out


def last_json(stdout: str) -> object:
    """The last line of a child process's ``stdout`` that is a JSON object or list.

    Ray's node processes can write their own log lines to a driver's stdout (even with
    ``log_to_driver=False``), so a test's child cannot count on its report being last."""
    for line in reversed(stdout.splitlines()):
        value = _json_line(line)
        if value is not None:
            return value
    raise ValueError(f"no JSON line in the child's output:\n{stdout[-3000:]}")


def next_json(stream) -> object:
    """The next line of a child's stdout ``stream`` that is a JSON object or list,
    skipping Ray's log lines; raises EOFError if the stream ends first."""
    for line in iter(stream.readline, ""):
        value = _json_line(line)
        if value is not None:
            return value
    raise EOFError("the child's stdout ended before it printed a JSON line")


def _json_line(line: str):
    line = line.strip()
    if not line.startswith(("{", "[")):
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
