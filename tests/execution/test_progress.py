"""RolloutProgress: counters are exact, the live line renders, pipes stay quiet."""

from __future__ import annotations

import io
import time

from rich.console import Console

from milo_ray.execution.progress import RolloutProgress
from milo_ray.execution.types import RolloutResult


def _result(**kw) -> RolloutResult:
    return RolloutResult("h", "t", 0, score=kw.pop("score", 1.0), **kw)


def test_counters_track_done_running_failures_tokens_and_cost():
    p = RolloutProgress(enabled=False)
    p.add(4, n_cached=2)
    p.started(3)
    p.finished(_result(input_tokens=10, output_tokens=5, cost_usd=0.25))
    p.finished(_result(score=0.0, error_kind="harness"))
    p.retried()  # the third went back to the queue...
    assert p.summary()["running"] == 0
    p.started(1)  # ...and ran again
    p.finished(_result(score=0.0, timed_out=True))
    s = p.summary()
    assert (s["done"], s["total"], s["cached"], s["running"]) == (3, 4, 2, 0)
    assert s["failures"] == 2 and s["retries"] == 1 and s["tokens"] == 15 and s["cost_usd"] == 0.25
    assert p.eta_s() is not None and p.eta_s() >= 0


def test_live_line_renders_to_a_terminal_console():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160)
    p = RolloutProgress(console=console)
    assert p.enabled
    p.add(2)
    p.started(2)
    p.finished(_result(input_tokens=1200, cost_usd=0.5))
    text = p.render().plain
    assert "1/2" in text and "running 1" in text and "1,200" in text and "$0.5000" in text
    p.close()
    assert "rollouts" in buf.getvalue()


def test_quiet_when_stdout_is_not_a_terminal_by_default(capsys):
    p = RolloutProgress()  # pytest captures stdout: not a TTY
    p.add(1)
    p.close()
    out = capsys.readouterr()
    assert not p.enabled and out.out == "" and out.err == ""


def test_enabled_without_a_terminal_writes_plain_periodic_lines_without_control_codes(capsys):
    stream = io.StringIO()
    p = RolloutProgress(enabled=True, stream=stream, interval_s=0.01)
    p.add(3)
    p.started(1)
    p.finished(_result(output_tokens=7))
    deadline = time.monotonic() + 10
    while stream.getvalue().count("[progress]") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    text = stream.getvalue()
    assert text.count("[progress]") >= 3  # periodic lines plus the final one
    assert "\x1b" not in text and text.splitlines()[-1].startswith("[progress] rollouts 1/3")
    assert capsys.readouterr().out == ""
