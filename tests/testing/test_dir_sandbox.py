"""The test sandbox runs each command through the shared process runner: a timeout kills
the command's whole tree and reads exit code 124, the output keeps its last bytes, and
interrupt() ends a running command from another thread."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="DirSandbox needs bwrap")


def _sandbox(tmp_path):
    from milo_ray.testing.dir_sandbox import DirSandbox

    return DirSandbox(tmp_path / "sb", workdir="/app")


def test_a_command_past_its_timeout_reads_124_with_a_note(tmp_path):
    sb = _sandbox(tmp_path)
    t0 = time.monotonic()
    r = sb.execute("echo started; sleep 30 & sleep 30", timeout=1)
    assert r.exit_code == 124 and r.output.startswith("started\n") and r.output.endswith("[timed out after 1s]")
    assert time.monotonic() - t0 < 10
    ok = sb.execute("echo fine; exit 3")
    assert ok.exit_code == 3 and ok.output == "fine\n" and not ok.truncated


def test_long_output_keeps_its_end(tmp_path):
    from milo_ray.testing.dir_sandbox import OUTPUT_CAP

    r = _sandbox(tmp_path).execute(f"head -c {3 * OUTPUT_CAP} /dev/zero | tr '\\0' a; echo; echo the-end")
    assert r.truncated and r.exit_code == 0
    assert r.output.endswith("a\nthe-end\n") and len(r.output) < OUTPUT_CAP + 100


def test_interrupt_ends_a_running_command(tmp_path):
    sb = _sandbox(tmp_path)
    threading.Timer(0.5, sb.interrupt).start()
    t0 = time.monotonic()
    r = sb.execute("sleep 30", timeout=60)
    assert r.exit_code == 137 and time.monotonic() - t0 < 10
