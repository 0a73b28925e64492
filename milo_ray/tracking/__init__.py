"""Optional experiment tracking: the ``tracking`` config group (``conf/tracking/``).

``tracking=none`` (the default) logs nowhere; ``tracking=mlflow``
(:class:`milo_ray.tracking.mlflow.MlflowTracking`) logs a run's flattened config as
params, a metric set per closed round (fed by :class:`~milo_ray.tracking.status.RunStatus`
from the events the method writes), the final test metrics, and at the end
``manifest.json`` and the run's report. The run directory stays the record: tracking
only mirrors it.

:class:`TrackingSession` drives one backend for one run so that tracking can never
fail the run: metrics are queued by the store listener and written by a background
thread (no tracking I/O under the store's lock or in the method's loop), and the first
failure is logged once, recorded as a ``tracking.failed`` event, and turns the backend
off for the rest of the run.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path
from typing import Any, Mapping, Protocol

from milo_ray.tracking.status import RoundMetrics, RunStatus

log = logging.getLogger(__name__)

TRACKING_FAILED = "tracking.failed"
__all__ = ["NoTracking", "RunStatus", "Tracker", "TrackingSession", "final_metrics", "flatten_config", "start_tracking",
           "TRACKING_FAILED"]


class Tracker(Protocol):
    """A tracking backend (built by Hydra from ``cfg.tracking``; construction checks the
    config only and touches nothing)."""

    name: str

    def start(self, *, run_id: str, run_dir: Path, params: dict[str, str], resumed: bool) -> None:
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None, at: float | None = None) -> None:
        """``at``: when the values were measured (wall-clock seconds; None: now)."""
        ...

    def finish(self, *, status: str, run_dir: Path, report: Path | None = None) -> None:
        """Upload the run's artifacts (``report``: the run's report.html, when written)
        and close the tracked run with ``status``."""
        ...


class NoTracking:
    """``tracking=none``: nothing is logged anywhere (the run directory is the record)."""

    name = "none"


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists and None as JSON text."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return out


def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)) and math.isfinite(float(x)):
        return float(x)
    return None


def final_metrics(summary: Mapping[str, Any], rows: Any = None) -> dict[str, float]:
    """The final test rows of a method's summary (``rows``: the method plugin's
    ``summary_rows``; None: the summary's ``final_test``, MILO's best islands, SSR's final
    and initial harness) as ``test/<row name>/<metric>``; the first row, the run's
    incumbent, also as ``test/<metric>``. Confidence intervals become ``_lo``/``_hi``."""
    out: dict[str, float] = {}
    for i, row in enumerate(summary.get("final_test") or [] if rows is None else rows):
        values: dict[str, float] = {}
        for key, value in row.items():
            if isinstance(value, (list, tuple)) and len(value) == 2:
                for suffix, v in zip(("lo", "hi"), value):
                    if _number(v) is not None:
                        values[f"{key}_{suffix}"] = float(v)
            elif key not in ("island",) and _number(value) is not None:
                values[key] = _number(value)
        name = str(row.get("name") or i)
        out.update({f"test/{name}/{k}": v for k, v in values.items()})
        if i == 0:
            out.update({f"test/{k}": v for k, v in values.items()})
    return out


class TrackingSession:
    """One tracker over one run, failure-proof (see the module doc).

    ``store``: the run store (a failure is recorded there as a ``tracking.failed`` event);
    ``flush_s``: how often queued round metrics are written.
    """

    def __init__(self, tracker: Any, store: Any, *, flush_s: float = 2.0) -> None:
        self.tracker, self.store = tracker, store
        self.name = str(getattr(tracker, "name", type(tracker).__name__))
        self._flush_s = float(flush_s)
        self._queue: list[RoundMetrics] = []
        self._lock = threading.Lock()
        self._io = threading.Lock()  # one backend call at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed: str | None = None
        self._status: RunStatus | None = None

    def _fail(self, stage: str, exc: BaseException) -> None:
        if self.failed is not None:
            return
        self.failed = f"{stage}: {type(exc).__name__}: {exc}"
        log.warning("tracking (%s) failed at %s and is off for the rest of this run, which continues: %s: %s",
                    self.name, stage, type(exc).__name__, exc)
        try:
            self.store.event(TRACKING_FAILED, {"backend": self.name, "stage": stage,
                                               "error": f"{type(exc).__name__}: {exc}"[:2000]})
        except Exception:  # a closed store: the log line above is the record
            log.debug("could not record the tracking failure as an event", exc_info=True)

    def _call(self, stage: str, fn: Any, *args: Any, **kwargs: Any) -> bool:
        if self.failed is not None:
            return False
        try:
            with self._io:
                fn(*args, **kwargs)
            return True
        except Exception as exc:
            self._fail(stage, exc)
            return False

    def start(self, *, run_id: str, run_dir: Path, config: Mapping[str, Any], resumed: bool,
              status: RunStatus) -> None:
        self._status = status
        if self._call("start", self.tracker.start, run_id=run_id, run_dir=Path(run_dir),
                      params=flatten_config(config), resumed=resumed):
            status.subscribe(self.on_round)
            self._thread = threading.Thread(target=self._run, name="tracking-flush", daemon=True)
            self._thread.start()

    def on_round(self, metrics: RoundMetrics) -> None:
        """The status subscriber: queue only (called under the store's lock)."""
        if self.failed is None:
            with self._lock:
                self._queue.append(metrics)

    def flush(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        for m in batch:
            if not self._call("log_metrics", self.tracker.log_metrics, m.metrics, m.step, m.time):
                return

    def _run(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush()

    def finish(self, *, status: str, summary: Mapping[str, Any], run_dir: Path, report: Path | None = None) -> None:
        """Write what is queued, the final test metrics, the artifacts (``report``: the
        report the run wrote, if any); close the run."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.failed is not None:
            return
        self.flush()
        plugin = None if self._status is None else self._status.plugin
        test = final_metrics(summary, None if plugin is None else plugin.summary_rows(summary))
        if test:
            self._call("log_metrics", self.tracker.log_metrics, test, None)
        self._call("finish", self.tracker.finish, status=status, run_dir=Path(run_dir), report=report)


def start_tracking(tracker: Any, *, store: Any, status: RunStatus, run_id: str, run_dir: Path,
                   config: Mapping[str, Any], resumed: bool) -> TrackingSession | None:
    """A started session for ``tracker``, or None when nothing is tracked."""
    if tracker is None or isinstance(tracker, NoTracking):
        return None
    session = TrackingSession(tracker, store)
    session.start(run_id=run_id, run_dir=run_dir, config=config, resumed=resumed, status=status)
    return session
