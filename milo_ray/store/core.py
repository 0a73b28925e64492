"""The store semantics every backend shares (DESIGN §3, ``store/base.py``).

``StoreCore`` implements the whole ``RunStore`` protocol on top of five small
persistence hooks, so the Parquet and the in-memory store cannot drift apart:
validation, trace-to-blob moves, event sequence numbers, the completed-keys set,
reconstruction of cached ``RolloutResult`` s and the closed-store rule live here.

Thread-safety: one re-entrant lock guards every mutable field (buffers, counters,
the completed set), because the single writer may be driven from an asyncio loop,
worker threads and the background flusher at once. "One writer" means one
*process*: a second process appending to the same run would reuse sequence
numbers and miss the first one's completed keys.

Secrets: every row, blob and manifest passes :func:`milo_ray.redaction.redact_obj` here,
before any backend sees it, so no backend can persist a registered key value (the last line
of defence behind the sandbox; see ``milo_ray/redaction.py``). A redacted blob's ref is the
hash of the redacted content.
"""

from __future__ import annotations

import abc

import json
import logging
import threading
import time
import uuid
from dataclasses import fields
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from milo_ray import redaction
from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.storable import storable, storable_text
from milo_ray.store import blobs, schema

_RESULT_FIELDS = tuple(f.name for f in fields(RolloutResult) if f.name != "trace")


# What encoding an untrusted value can raise (a UnicodeEncodeError is a ValueError; a JSON
# encoder recursing through a self-referencing value raises ValueError or RecursionError).
# The store's own failures (StoreClosed, DiskFull, IntegrityError on a damaged file) are not
# the row's fault: these are caught only around a conversion, which does no I/O.
_UNENCODABLE = (ValueError, TypeError, OverflowError, RecursionError)


class StoreClosed(RuntimeError):
    """A write reached a store after ``close()`` (or a read-only reader)."""


class StoreCore(abc.ABC):
    """Backend-independent half of a run store. Subclasses implement the hooks."""

    read_only: bool = False

    def __init__(self, run_id: str | None):
        self.run_id = run_id or f"run-{uuid.uuid4().hex[:12]}"
        self._lock = threading.RLock()
        self._completed: set[str] = set()
        self._next_seq = 0
        self._closed = False
        self._listeners: list[Any] = []

    # ---- persistence hooks ------------------------------------------------------------
    def _convert(self, table: str, rows: list[Any]) -> "pa.Table | schema.Columns":
        """Validate rows into what ``_ingest`` keeps (``ValueError`` naming the column for a
        bad one). An Arrow table here; a backend that buffers rows may keep
        :class:`schema.Columns` and build one table per file."""
        return schema.to_table(table, rows)

    @abc.abstractmethod
    def _ingest(self, table: str, data: "pa.Table | schema.Columns") -> None:
        """Keep validated rows (called with the lock held): what ``_convert`` returned."""
        ...

    @abc.abstractmethod
    def _scan(self, table: str, filter: pc.Expression | None = None) -> pa.Table:
        """Every row of ``table`` in write order, optionally filtered."""
        ...

    @abc.abstractmethod
    def _blob_write(self, ref: str, compressed: bytes) -> None:
        ...

    @abc.abstractmethod
    def _blob_read(self, ref: str) -> bytes:
        """Raise ``KeyError`` for an unknown ref."""
        ...

    @abc.abstractmethod
    def _manifest_write(self, text: str) -> None:
        ...

    @abc.abstractmethod
    def _manifest_read(self) -> str | None:
        ...

    # ---- writes -----------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreClosed(f"store for run {self.run_id!r} is read-only (opened with open_run)")
        if self._closed:
            raise StoreClosed(f"store for run {self.run_id!r} is closed; open it again to append")

    def append(self, table: str, rows: Iterable[dict[str, Any]], *,
               replace_unencodable: Callable[[int, str], dict[str, Any] | None] | None = None) -> None:
        """Append rows (all-or-nothing per call: a bad row rejects the whole batch).
        ``replace_unencodable(i, why)``: the row to store instead of row ``i`` when that row
        cannot be encoded (the others are stored as they are), or None to reject the batch;
        without it such a row rejects the batch like any bad row."""
        schema.check_table(table)
        rows = self._prepare(table, list(rows))
        if table == "events":
            for i, r in enumerate(rows):
                if isinstance(r, dict) and r.get("seq") is not None:
                    raise ValueError(f"events.seq (row {i}) is assigned by the store; leave it out")
        with self._lock:
            self._check_writable()
            if not rows:
                return
            if table == "events":
                now = time.time()
                rows = [
                    {**r, "seq": self._next_seq + i, "time": now if r.get("time") is None else r["time"]}
                    if isinstance(r, dict) else r
                    for i, r in enumerate(rows)
                ]
            try:
                data = self._convert(table, rows)
            except _UNENCODABLE as exc:
                if replace_unencodable is None:
                    raise
                rows = self._replace_unencodable(table, rows, replace_unencodable, exc)
                data = self._convert(table, rows)
            try:
                self._ingest(table, data)
            finally:
                # The rows are kept once _ingest starts (a failing flush leaves them
                # buffered for the next one), so the counters must account for them.
                if table == "events":
                    self._next_seq += len(rows)
                elif table == "rollouts":
                    self._note_rollouts(rows)
            self._notify(table, rows)

    def _prepare(self, table: str, rows: list[Any]) -> list[Any]:
        """Rows as they are converted: redacted, then sanitised (in that order: a cut the
        sanitiser makes could split a key value), a rollout's empty run_id as this run's."""
        rows = storable(redaction.redact_obj(rows))
        if table == "rollouts":  # an empty run_id means "this run"
            rows = [{**r, "run_id": r.get("run_id") or self.run_id} if isinstance(r, dict) else r for r in rows]
        return rows

    def _replace_unencodable(self, table: str, rows: list[Any],
                             replace: Callable[[int, str], dict[str, Any] | None], batch_error: Exception) -> list[Any]:
        """``rows`` with each row that cannot be encoded replaced by ``replace(i, why)``
        (prepared the same way); ``batch_error`` is raised when ``replace`` gives None or a
        replacement cannot be encoded either."""
        out = list(rows)
        for i, row in enumerate(rows):
            try:
                schema.to_table(table, [row])
            except _UNENCODABLE as exc:
                replacement = replace(i, f"{type(exc).__name__}: {storable_text(exc, limit=300)}")
                if replacement is None:
                    raise batch_error from None
                (new,) = self._prepare(table, [replacement])
                try:
                    schema.to_table(table, [new])
                except _UNENCODABLE:
                    raise batch_error from None
                out[i] = new
        return out

    def add_listener(self, fn: Any) -> None:
        """Call ``fn(table, rows)`` after every accepted append (events carry their
        ``seq``), in write order: the one feed of live views of a run (progress, tracking).
        A listener's exception is logged and never fails the write."""
        with self._lock:
            self._listeners.append(fn)

    def _notify(self, table: str, rows: list[Any]) -> None:
        for fn in self._listeners:
            try:
                fn(table, rows)
            except Exception:
                logging.getLogger(__name__).exception("store listener %r failed on a %s append", fn, table)

    def _note_rollouts(self, rows: list[dict[str, Any]]) -> None:
        # The validated rows, not the table: reading columns back from Arrow on every
        # one-row append cost more than the rest of the bookkeeping.
        for r in rows:
            key = r.get("cache_key")
            if key and r.get("error_kind") != "infra":
                self._completed.add(key)

    def append_rollouts(self, results: Iterable[RolloutResult]) -> None:
        """Store results. Each result's ``trace`` is moved into a blob: the result object is
        updated in place (``trace_ref`` set, ``trace`` cleared) so callers keep a light result.
        Blobs are written before rows, so every stored ``trace_ref`` resolves."""
        results = list(results)
        with self._lock:
            self._check_writable()
            rows = []
            for r in results:
                if not isinstance(r, RolloutResult):
                    raise ValueError(f"append_rollouts takes RolloutResult objects, got {type(r).__name__}")
                # Untrusted text is made storable here whatever the executor did with it.
                r.make_storable()
                if r.trace is not None:
                    try:
                        ref, compressed = self._encode_blob(r.trace)
                    except _UNENCODABLE as exc:
                        r.make_unstorable_failure(f"its trace cannot be encoded: {type(exc).__name__}: "
                                                  f"{storable_text(exc, limit=300)}")
                    else:
                        self._blob_write(ref, compressed)
                        r.trace_ref = ref
                    r.trace = None
                rows.append(r.row())

            def failure_record(i: int, why: str) -> dict[str, Any] | None:
                # A result outside its contract (a bad score or error kind) is the caller's
                # bug, not untrusted content: it keeps rejecting the batch.
                r = results[i]
                return None if r.problem() is not None else r.make_unstorable_failure(why).row()

            # One result that cannot be encoded must not take the batch (other rollouts'
            # results) with it: it becomes its rollout's harness failure.
            self.append("rollouts", rows, replace_unencodable=failure_record)

    def event(self, kind: str, payload: dict[str, Any] | None = None, **columns: Any) -> None:
        """Append one ``events`` row; ``columns`` are round/island/harness_id (or time)."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"event kind must be a non-empty string, got {kind!r}")
        self.append("events", [{"kind": kind, "payload": payload, **columns}])

    # ---- blobs ------------------------------------------------------------------------
    def put_blob(self, data: bytes | str | dict | list) -> str:
        ref, compressed = self._encode_blob(data)
        with self._lock:
            self._check_writable()
        self._blob_write(ref, compressed)
        return ref

    @staticmethod
    def _encode_blob(data: bytes | str | dict | list) -> tuple[str, bytes]:
        return blobs.encode(redaction.redact_obj(data))

    def get_blob(self, ref: str) -> Any:
        return blobs.decode(self._blob_read(blobs.check_ref(ref)), ref)  # checked against its name

    def put_harness_source(self, files: dict[str, str]) -> str:
        """Store a harness's files (relative path -> text) as one JSON blob; returns its ref."""
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ValueError("put_harness_source takes a dict of relative path -> file text (str -> str)")
        return self.put_blob(dict(files))

    # ---- reads ------------------------------------------------------------------------
    def read(self, table: str) -> pa.Table:
        schema.check_table(table)
        return self._scan(table)

    def completed_keys(self) -> set[str]:
        """Cache keys of stored rollouts whose error_kind is not ``infra`` (infra failures
        are retried on resume). A copy: the caller may mutate it."""
        with self._lock:
            return set(self._completed)

    def get_rollouts(self, keys: Iterable[str]) -> dict[str, RolloutResult]:
        """Completed rollouts for ``keys`` rebuilt as ``RolloutResult`` (``trace`` None,
        ``trace_ref`` set). Keys that are not completed are absent. When a key was stored
        more than once, the last non-infra row wins."""
        wanted = sorted({k for k in keys if k})
        if not wanted:
            return {}
        data = self._scan("rollouts", pc.field("cache_key").isin(wanted))
        out: dict[str, RolloutResult] = {}
        for row in data.to_pylist():
            if row["error_kind"] == "infra":
                continue
            kwargs = {k: row[k] for k in _RESULT_FIELDS if row.get(k) is not None}
            out[row["cache_key"]] = RolloutResult(**kwargs)
        return out

    # ---- manifest ---------------------------------------------------------------------
    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Replace the manifest (a JSON object); ``run_id`` is filled in when absent."""
        if not isinstance(manifest, dict):
            raise ValueError(f"manifest must be a dict, got {type(manifest).__name__}")
        manifest = {"run_id": self.run_id, **manifest}
        try:
            text = json.dumps(manifest, indent=2, sort_keys=True, default=schema._json_default)
        except TypeError as e:
            raise ValueError(f"manifest is not JSON-serializable: {e}") from None
        with self._lock:
            self._check_writable()
            self._manifest_write(redaction.redact(text) + "\n")

    def read_manifest(self) -> dict[str, Any]:
        """The last manifest written, or ``{}`` if none was."""
        text = self._manifest_read()
        return {} if text is None else json.loads(text)

    # ---- lifecycle --------------------------------------------------------------------
    def flush(self) -> None:
        pass

    def compact(self) -> None:
        pass

    def close(self) -> None:
        with self._lock:
            try:
                if not self._closed and not self.read_only:
                    self.flush()
            finally:
                self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(run_id={self.run_id!r})"
