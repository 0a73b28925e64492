"""Harness rows: every harness a run evaluates is stored once per key, with its source
in the content-addressed blob store.

The key says what makes a row distinct for the method: the eval method stores a
harness once (key = harness id); SSR stores one row per (harness, round); MILO one per
lineage node (plus one per seed left without an island). On a resumed run the stored keys are read back, so replaying a step
does not write its row again.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

from milo_ray.harness.model import Harness

KeyFn = Callable[[dict[str, Any]], Hashable]


def by_harness(row: dict[str, Any]) -> Hashable:
    return row["harness_id"]


class HarnessRecorder:
    """The one writer of ``harnesses`` rows for a method. ``key(row)`` maps a row (as
    stored) to its identity; the default stores each harness once."""

    def __init__(self, store: Any, *, key: KeyFn = by_harness, resumed: bool = True) -> None:
        self.store, self.key = store, key
        self._lock = threading.Lock()
        self._keys: set[Hashable] = set()
        if resumed:
            self._keys = {key(r) for r in store.read("harnesses").to_pylist()}

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._keys

    def record(self, harness: Harness | None, **columns: Any) -> bool:
        """Store the row unless its key is stored; True if written. The harness's files go
        to the blob store unless the row already names its ``source_ref``; a row without a
        harness (a MILO mutation that produced none) names its own ``harness_id``."""
        row = {"harness_id": harness.harness_id, "name": harness.name, **columns} if harness else dict(columns)
        if "harness_id" not in row:
            raise ValueError("HarnessRecorder.record: a row without a harness needs its harness_id")
        k = self.key(row)
        with self._lock:
            if k in self._keys:
                return False
            # Written before it is marked: a failed write leaves the row to be written again.
            if harness is not None and not row.get("source_ref"):
                row["source_ref"] = self.store.put_harness_source(harness.files)
            self.store.append("harnesses", [row])
            self._keys.add(k)
        return True
