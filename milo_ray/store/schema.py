"""Table schemas of a run (DESIGN §3) and the row validation shared by every store.

This module owns the one place where columns are declared: adding a column or a
table is one line in ``_SPECS``. Rows are plain dicts; ``to_table`` checks them
against the spec (unknown column -> ``ValueError`` naming it, missing nullable
column -> null, missing required column -> ``ValueError``, value of the wrong type
-> ``ValueError`` naming the column) and returns a ``pa.Table`` with the table's
schema. Every schema carries ``schema_version`` in its metadata, which the Parquet
store writes into each file's footer.

All Arrow fields are nullable on purpose: old files lacking a newer column read
back with nulls (pyarrow.dataset fills them), so schemas only ever grow. "Required"
is enforced here, at write time, not by the file format.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1
META_SCHEMA_VERSION = b"schema_version"
META_TABLE = b"milo_ray.table"

ERROR_MAX_CHARS = 2000  # ``rollouts.error`` is a short message; full detail lives in the trace


@dataclass(frozen=True)
class Column:
    """One column: Arrow type plus the write-time rules the file format cannot express.

    ``json`` columns are strings holding JSON; dict/list values are encoded on write.
    ``choices`` restricts non-null values. ``max_chars`` truncates long strings.
    """

    name: str
    type: pa.DataType
    required: bool = False
    json: bool = False
    choices: tuple[str, ...] | None = None
    max_chars: int | None = None


def _c(name: str, type_: pa.DataType, **kw: Any) -> Column:
    return Column(name, type_, **kw)


I64, F64, STR, BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()

ERROR_KINDS = ("infra", "harness", "task")
ORIGINS = ("seed", "mutation", "graft", "speciate", "ssr_candidate")
AGENT_ROLES = ("solver", "mutator", "orchestrator", "judge", "optimizer", "embedder", "grader")

_SPECS: dict[str, tuple[Column, ...]] = {
    "rollouts": (
        _c("run_id", STR),
        _c("method", STR),
        _c("round", I64),
        _c("stage", STR),
        _c("harness_id", STR, required=True),
        _c("task_id", STR, required=True),
        _c("split", STR),
        _c("rollout_idx", I64, required=True),
        _c("score", F64, required=True),
        _c("resolved", BOOL),
        _c("input_tokens", I64),
        _c("output_tokens", I64),
        _c("cost_usd", F64),
        _c("latency_s", F64),
        _c("timed_out", BOOL),
        _c("error_kind", STR, choices=ERROR_KINDS),
        _c("error", STR, max_chars=ERROR_MAX_CHARS),
        _c("invalid_tool_calls", I64),  # null: not counted (no model ran, or an older run)
        _c("trace_ref", STR),
        _c("node", STR),
        _c("started_at", F64),
        _c("finished_at", F64),
        _c("cache_key", STR, required=True),
        _c("attempts", I64),
        _c("budgeted", BOOL),
    ),
    "harnesses": (
        _c("harness_id", STR, required=True),
        _c("name", STR),
        _c("island", I64),
        _c("parent_id", STR),
        _c("co_parent_id", STR),
        _c("round", I64),
        _c("origin", STR, choices=ORIGINS),
        _c("mutator", STR),
        _c("evidence_scale", I64),
        _c("admitted", BOOL),
        _c("verdict_reason", STR),
        _c("fitness", pa.list_(F64)),
        _c("delta_hv", F64),
        _c("diff_added", I64),
        _c("diff_deleted", I64),
        _c("source_ref", STR),
        _c("validation_error", STR),
        _c("created_at", F64),
        _c("extra", STR, json=True),  # method-specific facts, JSON object
    ),
    "events": (
        _c("seq", I64, required=True),  # assigned by the store, strictly increasing
        _c("time", F64, required=True),  # unix seconds; defaults to now
        _c("kind", STR, required=True),
        _c("round", I64),
        _c("island", I64),
        _c("harness_id", STR),
        _c("payload", STR, json=True),
    ),
    "experience": (
        _c("task_id", STR, required=True),
        _c("round", I64),
        _c("harness_id", STR),
        _c("w", F64),
        _c("a", F64),
        _c("u", F64),
        _c("q", F64),
        _c("summary", STR),
        _c("suggestions", pa.list_(STR)),
        _c("embedding", pa.list_(pa.float32())),
        _c("embedder", STR),  # the embedding model actually used (after any fallback)
        _c("judge_error", STR),
        _c("trace_ref", STR),
    ),
    "agent_calls": (
        _c("run_id", STR),
        _c("call_id", STR, required=True),  # what the call was for; unique within a run
        _c("role", STR, required=True, choices=AGENT_ROLES),
        _c("agent", STR),
        _c("model", STR),
        _c("island", I64),
        _c("candidate", I64),
        _c("round", I64),
        _c("input_tokens", I64),
        _c("output_tokens", I64),
        _c("cost_usd", F64),  # null: the call could not be priced (never recorded as 0)
        _c("latency_s", F64),
        _c("retries", I64),
        _c("error", STR, max_chars=ERROR_MAX_CHARS),
        _c("time", F64),
    ),
}

COLUMNS: dict[str, dict[str, Column]] = {t: {c.name: c for c in cols} for t, cols in _SPECS.items()}


def _metadata(table: str) -> dict[bytes, bytes]:
    return {META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(), META_TABLE: table.encode()}


SCHEMAS: dict[str, pa.Schema] = {
    t: pa.schema([pa.field(c.name, c.type, nullable=True) for c in cols], metadata=_metadata(t))
    for t, cols in _SPECS.items()
}


def check_table(table: str) -> None:
    if table not in SCHEMAS:
        raise ValueError(f"unknown table {table!r}; tables are {sorted(SCHEMAS)}")


def json_dumps(value: Any) -> str:
    """Canonical JSON used for payloads, ``extra`` and JSON blobs (sorted keys, so equal
    objects give equal text and equal blob refs)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"value of type {type(obj).__name__} is not JSON-serializable; convert it to "
                    "dict/list/str/number first")


def _bad(table: str, col: Column, value: Any, why: str) -> ValueError:
    return ValueError(f"{table}.{col.name}: {why} (got {value!r:.80}); expected {col.type}")


def _coerce(table: str, col: Column, value: Any) -> Any:
    """Write-time rules per column; the Arrow conversion does the rest."""
    if value is None:
        return None
    if col.json:
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError as e:
                raise _bad(table, col, value, f"string is not valid JSON ({e})") from None
            return value
        try:
            return json_dumps(value)
        except TypeError as e:
            raise _bad(table, col, value, str(e)) from None
    if pa.types.is_integer(col.type):
        # pyarrow would silently truncate 1.5 -> 1 and reject True only sometimes.
        if isinstance(value, (bool, np.bool_)):
            raise _bad(table, col, value, "bool is not an integer")
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
            return int(value)
        raise _bad(table, col, value, "not an integer")
    if pa.types.is_boolean(col.type):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise _bad(table, col, value, "not a bool")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if pa.types.is_string(col.type):
        if not isinstance(value, str):
            raise _bad(table, col, value, "not a string")
        if col.choices is not None and value not in col.choices:
            raise _bad(table, col, value, f"must be one of {list(col.choices)} or null")
        if col.max_chars is not None and len(value) > col.max_chars:
            value = value[: col.max_chars - 1] + "…"
    return value


def to_table(table: str, rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Validate ``rows`` (dicts) against ``table``'s spec and return them as a pa.Table."""
    return to_columns(table, rows).table()


class Columns:
    """Validated rows of one table as column lists, not yet an Arrow table: building a
    table costs ~100 us however few rows it holds, so a writer that buffers one-row
    appends keeps these and builds one table per part file (:func:`build`).
    ``to_columns`` checks every value the Arrow conversion could refuse, so building
    never fails on a value that was accepted."""

    __slots__ = ("name", "values", "num_rows")

    def __init__(self, name: str, values: dict[str, list[Any]], num_rows: int):
        self.name, self.values, self.num_rows = name, values, num_rows

    def table(self) -> pa.Table:
        return build(self.name, [self])


def build(table: str, chunks: Iterable["Columns | pa.Table"]) -> pa.Table:
    """One Arrow table of ``table``'s schema from validated chunks, in order."""
    cols = COLUMNS[table]
    pieces: list[pa.Table] = []
    pending: dict[str, list[Any]] | None = None

    def close_pending() -> None:
        if pending is not None:
            pieces.append(pa.Table.from_arrays([pa.array(pending[n], type=c.type) for n, c in cols.items()],
                                               schema=SCHEMAS[table]))

    for chunk in chunks:
        if isinstance(chunk, Columns):
            if pending is None:
                pending = {n: list(v) for n, v in chunk.values.items()}
            else:
                for n, v in chunk.values.items():
                    pending[n].extend(v)
        else:
            close_pending()
            pending = None
            pieces.append(chunk)
    close_pending()
    if not pieces:
        return SCHEMAS[table].empty_table()
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)


def _convertible(col: Column, value: Any) -> bool:
    """True when the Arrow conversion surely accepts ``value`` (already coerced) for
    ``col``: the common cases, checked in Python; anything else is converted on its own
    to find out (``_arrow_check``)."""
    if value is None:
        return True
    t = col.type
    if t == STR:  # a lone surrogate cannot be encoded (the check is cheap for ASCII)
        return value.isascii()
    if t == I64:
        return -(1 << 63) <= value < (1 << 63)
    if t == F64:
        # numpy.float64 is a float; an int beyond 2**53 has no exact double (Arrow refuses it)
        return isinstance(value, float) or (type(value) is int and -(1 << 53) <= value <= (1 << 53))
    return t == BOOL


def _arrow_check(table: str, name: str, col: Column, value: Any) -> None:
    try:
        pa.array([value], type=col.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise ValueError(f"{table}.{name}: cannot store values as {col.type}: {e}") from None


def to_columns(table: str, rows: Iterable[dict[str, Any]]) -> Columns:
    """Validate ``rows`` (dicts) against ``table``'s spec (the errors ``to_table`` gives)
    and return them as :class:`Columns`."""
    check_table(table)
    cols = COLUMNS[table]
    values: dict[str, list[Any]] = {name: [] for name in cols}
    n = 0
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{table} row {i}: rows are dicts, got {type(row).__name__}")
        unknown = [k for k in row if k not in cols]
        if unknown:
            raise ValueError(
                f"{table}: unknown column {unknown[0]!r} (row {i}); known columns are {list(cols)}. "
                f"Add it to milo_ray/store/schema.py if it is a new fact worth storing."
            )
        for name, col in cols.items():
            v = _coerce(table, col, row.get(name))
            if v is None and col.required:
                raise ValueError(f"{table}.{name}: required column is missing or null (row {i})")
            if not _convertible(col, v):
                _arrow_check(table, name, col, v)
            values[name].append(v)
        n += 1
    return Columns(table, values, n)


def empty_table(table: str) -> pa.Table:
    check_table(table)
    return SCHEMAS[table].empty_table()
