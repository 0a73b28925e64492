"""SSR's harness and experience rows, written once.

``StoreWriter`` is the only place SSR writes those rows; on a resumed run it skips
rows already present (same harness and round, same experience record), so re-walking
recorded steps does not duplicate history (events go through the run's
:class:`~milo_ray.search.events.EventLog`, which skips stored rows the same way). It also hands back the stored
embedding of an experience record, so a resumed run orders its evidence with the
very vectors the interrupted run used.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from milo_ray.harness.model import Harness
from milo_ray.search.recording import HarnessRecorder

ExperienceKey = tuple[str, int, str]  # (harness_id, round, task_id)


class StoreWriter:
    """Writes harness and experience rows once."""

    def __init__(self, store: Any, *, resumed: bool) -> None:
        self.store = store
        # One row per (harness, round): a harness raced again in a later round is a new row.
        self._harnesses = HarnessRecorder(store, key=lambda r: (r["harness_id"], int(r.get("round") or 0)),
                                          resumed=resumed)
        self._embeddings: dict[ExperienceKey, list[float] | None] = {}
        if resumed:
            self._load()

    def _load(self) -> None:
        for r in self.store.read("experience").to_pylist():
            self._embeddings[(r.get("harness_id") or "", r.get("round") or 0, r["task_id"])] = r.get("embedding")

    def harness(self, h: Harness, row: dict[str, Any]) -> None:
        self._harnesses.record(h, **row)

    def experience(self, records: Sequence[Any]) -> None:
        rows = []
        for r in records:
            key = (r.harness_id, r.round, r.task_id)
            if key not in self._embeddings:
                self._embeddings[key] = None if r.embedding is None else [float(x) for x in r.embedding]
                rows.append(r.row())
        if rows:
            self.store.append("experience", rows)

    def stored_embedding(self, harness_id: str, round: int, task_id: str) -> np.ndarray | None:
        """The embedding stored with this experience record (float32, as written), or None."""
        z = self._embeddings.get((harness_id, round, task_id))
        return None if z is None else np.asarray(z, dtype=np.float32)
