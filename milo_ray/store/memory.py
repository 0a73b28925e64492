"""In-memory ``RunStore`` for unit tests of other modules.

Same semantics as the Parquet store (the shared half lives in ``store/core.py`` and
both pass the contract suite): rows are validated into Arrow tables, blobs are
stored encoded so ``get_blob`` returns exactly what the Parquet store would, the
manifest round-trips through JSON. Nothing survives the process; "reopening" is
keeping the same object.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from milo_ray.store import schema
from milo_ray.store.core import StoreCore


class MemoryRunStore(StoreCore):
    def __init__(self, run_id: str | None = None):
        super().__init__(run_id)
        self._tables: dict[str, list[pa.Table]] = {t: [] for t in schema.SCHEMAS}
        self._blobs: dict[str, bytes] = {}
        self._manifest: str | None = None

    def _ingest(self, table: str, data: pa.Table) -> None:
        self._tables[table].append(data)

    def _scan(self, table: str, filter: pc.Expression | None = None) -> pa.Table:
        with self._lock:
            parts = self._tables[table]
            if len(parts) > 1:  # many one-row appends: merge once so later reads stay fast
                self._tables[table] = parts = [pa.concat_tables(parts).combine_chunks()]
        data = parts[0] if parts else schema.empty_table(table)
        if filter is not None:
            data = data.filter(filter)
        return data

    def _blob_write(self, ref: str, compressed: bytes) -> None:
        with self._lock:
            self._blobs.setdefault(ref, compressed)

    def _blob_read(self, ref: str) -> bytes:
        try:
            return self._blobs[ref]
        except KeyError:
            raise KeyError(f"no blob {ref} in memory store {self.run_id!r}") from None

    def _manifest_write(self, text: str) -> None:
        self._manifest = text

    def _manifest_read(self) -> str | None:
        return self._manifest
