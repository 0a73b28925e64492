"""The process runner every sandbox executes through: output cap without buffering,
timeouts that kill the whole group, and no survivors once a command ends."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox.process import run_capped, start_capped


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead; only its parent (pid 1 here) can reap it


def _wait_dead(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def test_output_and_exit_code_are_reported():
    r = run_capped(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10, output_cap_bytes=1000)
    assert r.output == "out\nerr\n" and r.exit_code == 3
    assert not r.truncated and not r.timed_out and r.seconds < 5


def test_output_beyond_the_cap_is_discarded_not_buffered():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, peak
    start = time.monotonic()
    r = run_capped(["sh", "-c", "yes | head -c 200M"], timeout_s=30, output_cap_bytes=65536)
    assert r.truncated and r.exit_code == 0 and not r.timed_out
    body, marker = r.output.rsplit("\n[output truncated", 1)
    assert len(body.encode()) == 65536 and "209715200 bytes" in marker
    assert time.monotonic() - start < 15
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50 * 1024  # 200 MB went through; well under 50 MB may stay
    # With a tail kept too, the middle is still dropped as it streams by.
    r = run_capped(["sh", "-c", "yes | head -c 200M"], timeout_s=30, output_cap_bytes=65536, tail_bytes=65536)
    assert r.truncated and f"[... {209715200 - 2 * 65536} bytes dropped ...]" in r.output
    assert len(r.output) < 3 * 65536
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50 * 1024


def test_timeout_kills_the_whole_group():
    start = time.monotonic()
    r = run_capped(["sh", "-c", "sleep 30 & echo $!; sleep 30"], timeout_s=0.5, output_cap_bytes=1000)
    assert r.timed_out and r.exit_code is None
    assert time.monotonic() - start < 3
    assert _wait_dead(int(r.output.split()[0]))


def test_background_process_ignoring_sigterm_dies_with_its_command():
    r = run_capped(
        ["sh", "-c", "(trap '' TERM HUP; sleep 30) >/dev/null 2>&1 & echo $!"],
        timeout_s=10,
        output_cap_bytes=1000,
    )
    assert r.exit_code == 0 and not r.timed_out
    assert _wait_dead(int(r.output.split()[0]))


def test_background_process_holding_the_output_pipe_does_not_stall_the_caller():
    start = time.monotonic()
    r = run_capped(["sh", "-c", "sleep 30 & echo done"], timeout_s=20, output_cap_bytes=1000)
    assert r.output == "done\n" and r.exit_code == 0
    assert time.monotonic() - start < 3


def test_leader_that_closes_its_output_is_still_waited_for():
    r = run_capped(["sh", "-c", "exec >&- 2>&-; sleep 0.3; exit 4"], timeout_s=10, output_cap_bytes=100)
    assert r.exit_code == 4 and r.seconds >= 0.3


def test_stdin_env_and_cwd_are_passed(tmp_path):
    r = run_capped(["sh", "-c", "cat; echo \" $FOO $(pwd)\""], timeout_s=10, output_cap_bytes=1000,
                   stdin=b"in", env={"FOO": "bar", "PATH": os.environ["PATH"]}, cwd=str(tmp_path))
    assert r.output == f"in bar {tmp_path}\n"


def test_kill_from_another_thread_ends_the_command():
    proc = start_capped(["sleep", "30"], timeout_s=None, output_cap_bytes=100)
    threading.Timer(0.2, proc.kill).start()
    r = proc.wait()
    assert r.exit_code == 137 and not r.timed_out and r.seconds < 3


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="timeout_s"):
        run_capped(["true"], timeout_s=0, output_cap_bytes=10)
    with pytest.raises(ValueError, match="output_cap_bytes"):
        run_capped(["true"], timeout_s=1, output_cap_bytes=-1)
    with pytest.raises(ValueError, match="tail_bytes"):
        run_capped(["true"], timeout_s=1, output_cap_bytes=10, tail_bytes=-1)
    with pytest.raises(ValueError, match="term_grace_s"):
        run_capped(["true"], timeout_s=1, output_cap_bytes=10, term_grace_s=-1)


def test_head_and_tail_are_kept_and_the_middle_is_counted():
    # 10 lines of 10 bytes: keep the first 25 and the last 15 bytes.
    r = run_capped(["sh", "-c", "for i in 0 1 2 3 4 5 6 7 8 9; do echo line-$i---; done"], timeout_s=10,
                   output_cap_bytes=25, tail_bytes=15)
    assert r.truncated
    assert r.output == "line-0---\nline-1---\nline-\n[... 60 bytes dropped ...]\n8---\nline-9---\n"
    whole = run_capped(["sh", "-c", "echo short"], timeout_s=10, output_cap_bytes=3, tail_bytes=100)
    assert whole.output == "short\n" and not whole.truncated


def test_stderr_can_be_kept_apart_each_stream_with_its_own_cap():
    r = run_capped(["sh", "-c", "echo out; echo err-err-err >&2"], timeout_s=10, output_cap_bytes=5,
                   separate_stderr=True)
    assert r.output == "out\n" and r.stderr.startswith("err-e\n[output truncated: 12 bytes")
    assert r.truncated and r.exit_code == 0


def test_timeout_with_a_grace_sends_sigterm_first_then_kills_what_ignores_it(tmp_path):
    saved = tmp_path / "saved"
    # Traps TERM to save its state: exits within the grace, so no SIGKILL is needed.
    polite = run_capped(["sh", "-c", f"trap 'echo bye > {saved}; exit 0' TERM; sleep 30 & wait"], timeout_s=0.5,
                        output_cap_bytes=100, term_grace_s=5)
    assert polite.timed_out and polite.exit_code is None and saved.read_text() == "bye\n"
    assert polite.seconds < 4
    # Ignores TERM: killed at the grace's end.
    stubborn = run_capped(["sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30"], timeout_s=0.5,
                          output_cap_bytes=100, term_grace_s=0.5)
    assert stubborn.timed_out and 0.9 < stubborn.seconds < 4
    # Without a grace there is no SIGTERM: the trap never runs.
    saved.unlink()
    run_capped(["sh", "-c", f"trap 'echo bye > {saved}; exit 0' TERM; sleep 30 & wait"], timeout_s=0.5,
               output_cap_bytes=100)
    assert not saved.exists()
