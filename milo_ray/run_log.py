"""``run.log``, the run directory's own log: appended to by every session of a run, with its
secrets redacted like the console's lines, and quiet on a full disk."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from milo_ray import redaction

# The run directory's log file.
RUN_LOG = "run.log"
# Its lines carry the entry point's logger name, as the console's do.
log = logging.getLogger("milo_ray.run")


class _RunLog(logging.FileHandler):
    """``run.log``: on a full disk its lines are dropped quietly (the console still gets
    them) instead of a traceback per line, and closing it never masks the run's error."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError:
            pass


def to_run_log(handler: logging.Handler, message: str, *args: Any) -> None:
    """A line in run.log only: the session's opening and closing lines, whose facts the
    console shows in its own form (the run directory line, the summary)."""
    handler.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, args, None))


def attach_run_log(run_dir: Path) -> logging.Handler:
    """``run.log`` in the run directory (appended to by every session of the run). It and
    every handler already on the root logger (the console) redact the run's secrets."""
    handler = _RunLog(run_dir / RUN_LOG)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    for existing in root.handlers:
        redaction.install_log_redaction(existing)
    root.addHandler(redaction.install_log_redaction(handler))
    return handler
