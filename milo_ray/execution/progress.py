"""Live rollout progress for people watching a run in a terminal.

One status line (rich) with done/total, running, timed-out and failed rollouts, tokens, cost and an ETA
from the observed completion rate, followed by the lines of an attached run status
(:meth:`RolloutProgress.attach`: any object with ``lines() -> list[str]`` and a
``version`` counter, e.g. :class:`milo_ray.tracking.status.RunStatus` with one line per
MILO island or SSR race and a run line with best-so-far, spend and ETA). ``None`` (the
default) shows it only on a terminal, so logs and CI output stay clean; ``True`` also
reports when stdout is not a terminal, as plain ``[progress]`` lines on stderr (no
control codes, so a log file of a cluster job stays readable): when the status changed,
at most every ``min_interval_s``, and otherwise every ``interval_s``; ``False`` shows
nothing. The scheduler only calls the counting methods; rendering happens on a
background thread.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from milo_ray.core.rollouts import RolloutResult

log = logging.getLogger(__name__)


def fmt_duration(seconds: float | None) -> str:
    """``mm:ss`` (``h:mm:ss`` past an hour); ``--:--`` when unknown."""
    if seconds is None:
        return "--:--"
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class RolloutProgress:
    """Counters plus an optional display.

    The live line is shown when stdout is a TTY (or a rich ``console`` is given) and
    ``enabled`` is not ``False``; ``enabled=True`` without a terminal writes a plain
    status line to ``stream`` (stderr) every ``interval_s`` and once at the end;
    ``False`` never shows anything (the counters are still kept and readable through
    :meth:`summary`).
    """

    def __init__(self, enabled: bool | None = None, *, console: Any = None, stream: Any = None,
                 interval_s: float = 30.0, min_interval_s: float = 5.0) -> None:
        # Never draw control codes into a pipe or a log file, even when asked to.
        self.enabled = enabled is not False and (console is not None or sys.stdout.isatty())
        self.plain = enabled is True and not self.enabled
        self._stream = stream if stream is not None else sys.stderr
        self._interval_s = float(interval_s)
        self._min_interval_s = min(float(min_interval_s), self._interval_s)
        self._status: Any = None
        self._written_version: Any = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._console = console
        self._lock = threading.Lock()
        self.total = 0
        self.done = 0
        self.cached = 0
        self.running = 0
        # A rollout that ran out of time and one that failed (infra, harness or task error)
        # are counted apart: a run whose rollouts all time out has no errors to look for.
        self.timed_out = 0
        self.errors = 0
        self.retries = 0
        self.tokens = 0
        self.cost_usd = 0.0
        self._t0: float | None = None
        self._live: Any = None

    # --- counting -------------------------------------------------------------------
    def add(self, n_execute: int, n_cached: int = 0) -> None:
        with self._lock:
            if self._t0 is None:
                self._t0 = time.monotonic()
            self.total += n_execute
            self.cached += n_cached
        self._ensure_live()

    def started(self, n: int = 1) -> None:
        with self._lock:
            self.running += n

    def retried(self, n: int = 1) -> None:
        with self._lock:
            self.running -= n
            self.retries += n

    def dropped(self, n: int = 1) -> None:
        """Rollouts that will not run (a token/cost cap stopped them)."""
        with self._lock:
            self.total -= n

    def finished(self, result: RolloutResult) -> None:
        with self._lock:
            self.running -= 1
            self.done += 1
            if result.timed_out:
                self.timed_out += 1
            elif result.error_kind is not None:
                self.errors += 1
            self.tokens += result.input_tokens + result.output_tokens
            self.cost_usd += result.cost_usd or 0.0

    def eta_s(self) -> float | None:
        if self._t0 is None or self.done == 0:
            return None
        rate = self.done / max(time.monotonic() - self._t0, 1e-9)
        return max(self.total - self.done, 0) / rate

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "done": self.done,
                "total": self.total,
                "cached": self.cached,
                "running": self.running,
                "timed_out": self.timed_out,
                "errors": self.errors,
                "retries": self.retries,
                "tokens": self.tokens,
                "cost_usd": self.cost_usd,
            }

    # --- display --------------------------------------------------------------------
    def attach(self, status: Any) -> None:
        """Show ``status.lines()`` below the rollout line."""
        self._status = status

    def status_lines(self) -> list[str]:
        if self._status is None:
            return []
        try:
            return list(self._status.lines())
        except Exception:  # a display must never take the run (or its own thread) down
            log.exception("run status lines failed; showing rollout progress only from here on")
            self._status = None
            return []

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        lines = self.status_lines()
        line = self._rollout_line()
        return Group(line, *(Text(x) for x in lines)) if lines else line

    def _rollout_line(self) -> Any:
        from rich.text import Text

        s = self.summary()
        return Text.assemble(
            ("rollouts ", "bold"),
            f"{s['done']}/{s['total']}",
            f" (+{s['cached']} cached)" if s["cached"] else "",
            "  running ",
            (str(s["running"]), "cyan"),
            "  timed out ",
            (str(s["timed_out"]), "yellow" if s["timed_out"] else ""),
            "  errors ",
            (str(s["errors"]), "red" if s["errors"] else ""),
            f"  retries {s['retries']}" if s["retries"] else "",
            f"  tokens {s['tokens']:,}  cost ${s['cost_usd']:.4f}  eta {fmt_duration(self.eta_s())}",
        )

    def _ensure_live(self) -> None:
        if self.plain and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="rollout-progress", daemon=True)
            self._ticker.start()
        if not self.enabled or self._live is not None:
            return
        from rich.live import Live

        self._live = Live(get_renderable=self.render, console=self._console, refresh_per_second=4, transient=False)
        self._live.start()

    def _write_plain(self) -> None:
        self._written_version = getattr(self._status, "version", None)
        text = "\n".join(f"[progress] {x}" for x in [self._rollout_line().plain, *self.status_lines()])
        print(text, file=self._stream, flush=True)

    def _tick(self) -> None:
        # Wake every min_interval_s; write when the status changed, or every interval_s anyway.
        last = time.monotonic()
        while not self._stop.wait(self._min_interval_s):
            changed = getattr(self._status, "version", None) != self._written_version
            if changed or time.monotonic() - last >= self._interval_s - 1e-3:
                self._write_plain()
                last = time.monotonic()

    def close(self) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
            self._write_plain()
        if self._live is not None:
            self._live.stop()
            self._live = None
