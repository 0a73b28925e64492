"""The RunStore contract (DESIGN §3). The Parquet store and the in-memory store both
implement it and both pass the contract suite in
``milo_ray/testing/store_contract.py`` (run by ``tests/store/test_contract.py``).

Exactly one writer per run (the driver); readers may be anywhere.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, runtime_checkable

import pyarrow as pa

from milo_ray.core.rollouts import RolloutResult

TABLES: tuple[str, ...] = ("rollouts", "harnesses", "events", "experience", "agent_calls")


@runtime_checkable
class RunStore(Protocol):
    run_id: str

    def append_rollouts(self, results: Iterable[RolloutResult]) -> None:
        """Store results; traces are moved to blobs and replaced by ``trace_ref``."""
        ...

    def append(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        """Append rows to ``harnesses``, ``events``, ``experience`` or ``agent_calls`` (schema-checked)."""
        ...

    def event(self, kind: str, payload: dict[str, Any] | None = None, **columns: Any) -> None:
        """Append one ``events`` row: kind, JSON payload, plus optional round/island/harness_id."""
        ...

    def put_blob(self, data: bytes | str | dict | list) -> str:
        """Content-addressed write (zstd); returns the ref. Idempotent."""
        ...

    def get_blob(self, ref: str) -> Any:
        """The stored object (dict/list for JSON blobs, str for text, bytes otherwise)."""
        ...

    def put_harness_source(self, files: dict[str, str]) -> str: ...

    def read(self, table: str) -> pa.Table:
        """Every row of a table written so far (flushed or buffered)."""
        ...

    def completed_keys(self) -> set[str]:
        """Cache keys of rollouts already stored (resume never runs these again)."""
        ...

    def get_rollouts(self, keys: Iterable[str]) -> dict[str, RolloutResult]:
        """Stored rollouts for ``keys`` that are completed (error_kind != infra), rebuilt as
        ``RolloutResult`` with ``trace_ref`` set and ``trace`` None; other keys are absent.
        The scheduler serves cache hits after a resume from this."""
        ...

    def flush(self) -> None: ...

    def compact(self) -> None: ...

    def close(self) -> None: ...

    def write_manifest(self, manifest: dict[str, Any]) -> None: ...

    def read_manifest(self) -> dict[str, Any]: ...
