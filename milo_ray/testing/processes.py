"""Killing a driver the way a crash does, for tests and trials of resume: SIGKILL its
process group and every Ray process it started.

Ray puts the raylet, the GCS and the workers a driver started in process groups of their
own, so killing the driver's group leaves them running (and the next session could join
them). They are found instead by the session's private ``RAY_TMPDIR``, which is on each
of their command lines.
"""

from __future__ import annotations

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
