"""SSR's side effects on the run: idempotent store rows.

``StoreWriter`` is the only place SSR writes rows; on a resumed run it skips rows
already present (same harness and round, same experience record, same event), so
replaying the deterministic procedure does not duplicate history.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from milo_ray.harness.model import Harness


class StoreWriter:
    """Writes harness, experience and event rows once."""

    def __init__(self, store: Any, *, resumed: bool) -> None:
        self.store = store
        self._harness_keys: set[tuple[str, int]] = set()
        self._exp_keys: set[tuple[str, int, str]] = set()
        self._event_keys: set[tuple[str, int | None, str | None, str]] = set()
        if resumed:
            self._load()

    def _load(self) -> None:
        h = self.store.read("harnesses").to_pylist()
        self._harness_keys = {(r["harness_id"], r.get("round") or 0) for r in h}
        e = self.store.read("experience").to_pylist()
        self._exp_keys = {(r.get("harness_id") or "", r.get("round") or 0, r["task_id"]) for r in e}
        for r in self.store.read("events").to_pylist():
            if str(r["kind"]).startswith("ssr."):
                self._event_keys.add((r["kind"], r.get("round"), r.get("harness_id"), r.get("payload") or ""))

    def harness(self, h: Harness, row: dict[str, Any]) -> None:
        key = (h.harness_id, int(row.get("round") or 0))
        if key in self._harness_keys:
            return
        self._harness_keys.add(key)
        full = {"harness_id": h.harness_id, "name": h.name, "source_ref": self.store.put_harness_source(h.files), **row}
        self.store.append("harnesses", [full])

    def experience(self, records: Sequence[Any]) -> None:
        rows = []
        for r in records:
            key = (r.harness_id, r.round, r.task_id)
            if key not in self._exp_keys:
                self._exp_keys.add(key)
                rows.append(r.row())
        if rows:
            self.store.append("experience", rows)

    def event(self, kind: str, payload: dict[str, Any] | None = None, **cols: Any) -> None:
        payload = payload or {}
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
        key = (kind, cols.get("round"), cols.get("harness_id"), text)
        if self._event_keys and key in self._event_keys:
            return
        self.store.event(kind, json.loads(text), **cols)
