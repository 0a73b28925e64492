"""A tracking backend whose server is gone: it starts, then every metric upload raises."""

from __future__ import annotations


class FailingTracker:
    name = "failing"

    def start(self, **_: object) -> None:
        pass

    def log_metrics(self, metrics: object, step: object, at: object = None) -> None:
        raise ConnectionError("tracking server unreachable")

    def finish(self, **_: object) -> None:
        raise AssertionError("finish must not be called once tracking failed")
