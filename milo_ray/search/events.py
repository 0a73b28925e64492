"""The run's event log: typed events, their one payload codec, and :class:`EventLog`.

A method's state is a projection of its events (DESIGN §5.11). Every event is a frozen
dataclass subclassing :class:`Event`, with a ``kind`` string per class; the ``events``
table stores the kind, a JSON payload and the optional ``round``/``island``/
``harness_id`` columns. This module owns how a dataclass becomes that payload and back
(:func:`encode_payload`, :func:`decode_payload`), the registry of one method's kinds
(:class:`EventTypes`), the events every method shares (:class:`RoleBudget`,
:class:`Stopped`, :class:`Summarized`) and :class:`EventLog`, which appends an event
and applies it in one call and replays a run's stored events, typed, in write order.

The codec is generic and driven by the field annotations: nested dataclasses become
objects, tuples lists, dicts objects with string keys (an ``int``-keyed dict decodes
back to ``int`` keys), enums their value; fields annotated ``Any`` are copied as they
are. Scalars keep their JSON type in both directions, so a stored payload decodes and
re-encodes to the same canonical text (write-once replay compares that text). Three
per-field choices keep the on-disk format of runs written before the codec was shared:
:func:`stored_as` (the payload key differs from the field name),
:func:`absent_when_none` (the key is left out instead of written as ``null``) and
``whole_payload`` (the payload *is* one field's value). Kinds and payload keys are the
format of every run directory written so far: they never change, and a new field gets
a default so older payloads still decode.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import abc
import enum
import json
import sys
import threading
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar, Iterable, Mapping

from milo_ray.store.schema import json_dumps

#: ``events`` columns an event may carry outside its payload.
EVENT_COLUMNS = ("round", "island", "harness_id")


class UnknownEvent(ValueError):
    """A stored kind of a method's namespace that no event class is registered for."""


# ---------------------------------------------------------------------------- fields
def stored_as(key: str, **kwargs: Any) -> Any:
    """A field whose payload key is ``key`` (a name taken by the class, e.g. ``kind``)."""
    return field(metadata={"key": key}, **kwargs)


def absent_when_none() -> Any:
    """An optional field (default None) whose key is left out of the payload when None,
    for payloads that were written without it."""
    return field(default=None, metadata={"omit_none": True})


# ---------------------------------------------------------------------------- the base
@dataclass(frozen=True)
class Event:
    """Base of every event.

    ``kind``: the stored kind. A method's classes name it in full (``milo.node``); the
    shared events give only the name (``stop``) and each method's :class:`EventTypes`
    stores them under its namespace (``milo.stop``, ``ssr.stop``).
    ``column_fields``: fields stored as ``events`` columns instead of in the payload.
    ``ignore_unknown``: payload keys no field names are skipped (else an error).
    ``whole_payload``: the one field whose value is the whole payload.
    """

    kind: ClassVar[str] = ""
    column_fields: ClassVar[tuple[str, ...]] = ()
    ignore_unknown: ClassVar[bool] = False
    whole_payload: ClassVar[str | None] = None

    def columns(self) -> dict[str, Any]:
        """The event's ``events`` columns (None values left out)."""
        return {c: getattr(self, c) for c in self.column_fields if getattr(self, c, None) is not None}

    def to_payload(self) -> dict[str, Any]:
        """The JSON payload stored in the event's ``events`` row."""
        return encode_payload(self)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], **columns: Any) -> "Event":
        """The event a stored payload (and its row's columns) records; ``ValueError``
        names the kind and the missing or unknown field."""
        return decode_payload(cls, payload, columns)


# ---------------------------------------------------------------------------- codec
def _key_of(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_key_of(f): _encode(getattr(value, f.name)) for f in fields(value)
                if not (f.metadata.get("omit_none") and getattr(value, f.name) is None)}
    if isinstance(value, enum.Enum):
        return _encode(value.value)
    if isinstance(value, Mapping):
        return {_encode_key(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(x) for x in value]
    return value


def _encode_key(k: Any) -> Any:
    if isinstance(k, enum.Enum):
        k = k.value
    return str(k) if isinstance(k, int) and not isinstance(k, bool) else k


def encode_payload(event: Event) -> dict[str, Any]:
    """The payload of ``event``: every field but its column fields, encoded."""
    if event.whole_payload is not None:
        return _encode(copy.deepcopy(getattr(event, event.whole_payload)))
    return {_key_of(f): _encode(getattr(event, f.name)) for f in fields(event)
            if f.name not in event.column_fields
            and not (f.metadata.get("omit_none") and getattr(event, f.name) is None)}


_HINTS: dict[type, dict[str, Any]] = {}
_HINTS_LOCK = threading.Lock()


def _hints(cls: type) -> dict[str, Any]:
    with _HINTS_LOCK:
        hints = _HINTS.get(cls)
        if hints is None:
            module = sys.modules.get(cls.__module__)
            hints = _HINTS[cls] = typing.get_type_hints(cls, vars(module) if module else None)
        return hints


def _decode(value: Any, tp: Any, where: str, lenient: bool) -> Any:
    if tp is Any or tp is object:
        return copy.deepcopy(value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        return _decode(value, options[0], where, lenient) if len(options) == 1 else copy.deepcopy(value)
    if value is None:
        return None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected an object for {tp.__name__}, got {type(value).__name__}")
        return _decode_fields(tp, value, {}, where, lenient)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if origin in (list, abc.Sequence, abc.MutableSequence) or tp is list:
        (item,) = args or (Any,)
        return [_decode(x, item, where, lenient) for x in value]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(x, args[0], where, lenient) for x in value)
        if len(value) != len(args):
            raise ValueError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_decode(x, t, where, lenient) for x, t in zip(value, args))
    if origin in (dict, abc.Mapping, abc.MutableMapping) or tp is dict:
        key, val = args or (Any, Any)
        return {_decode_key(k, key): _decode(v, val, where, lenient) for k, v in value.items()}
    # Scalars keep their JSON type, so the payload re-encodes to the text it was read from.
    return value


def _decode_key(k: Any, tp: Any) -> Any:
    if tp is int:
        return int(k)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(k)
    return k


def _decode_fields(cls: type, payload: Mapping[str, Any], columns: Mapping[str, Any], where: str,
                   lenient: bool) -> Any:
    hints = _hints(cls)
    column_fields = getattr(cls, "column_fields", ())
    by_key = {_key_of(f): f for f in fields(cls) if f.name not in column_fields}
    unknown = sorted(set(payload) - set(by_key))
    if unknown and not lenient:
        raise ValueError(f"{where}: unknown payload field(s) {unknown}")
    values: dict[str, Any] = {}
    for f in fields(cls):
        source, key = (columns, f.name) if f.name in column_fields else (payload, _key_of(f))
        if key in source:
            values[f.name] = _decode(source[key], hints.get(f.name, Any), f"{where}, field {f.name!r}", lenient)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ValueError(f"{where}: payload field {f.name!r} is missing")
    return cls(**values)


def decode_payload(cls: type[Event], payload: Mapping[str, Any] | None, columns: Mapping[str, Any] | None = None,
                   ) -> Event:
    """The ``cls`` event of a stored payload and its row's columns (None columns ignored)."""
    payload = payload or {}
    where = f"{cls.kind} event"
    cols = {k: v for k, v in (columns or {}).items() if k in cls.column_fields and v is not None}
    if cls.whole_payload is not None:
        if not isinstance(payload, Mapping):
            raise ValueError(f"{where}: the payload is not an object")
        return cls(**{cls.whole_payload: copy.deepcopy(dict(payload))}, **cols)
    return _decode_fields(cls, payload, cols, where, cls.ignore_unknown)


# ---------------------------------------------------------------------------- shared events
@dataclass(frozen=True)
class RoleBudget(Event):
    """An agent role reached its cap (``run.budget.roles.<role>``, or the run's token/USD
    budget): no new work of that role starts from here on. ``round``/``harness_id``: where
    the method was when it stopped (columns; SSR records them, MILO's islands do not)."""

    kind: ClassVar[str] = "role_budget"
    column_fields: ClassVar[tuple[str, ...]] = ("round", "harness_id")
    role: str
    reason: str
    round: int | None = None
    harness_id: str | None = None


@dataclass(frozen=True)
class Stopped(Event):
    """The search ended (a record): ``finished`` or why it stopped early. A method that
    knows them adds how many rounds ran, the incumbent and the executions it used."""

    kind: ClassVar[str] = "stop"
    column_fields: ClassVar[tuple[str, ...]] = ("round", "harness_id")
    reason: str
    round: int | None = None
    harness_id: str | None = None
    rounds: int | None = absent_when_none()
    incumbent: str | None = absent_when_none()
    executions_used: int | None = absent_when_none()


@dataclass(frozen=True)
class Summarized(Event):
    """The run's summary (a record; its payload is the summary dict itself)."""

    kind: ClassVar[str] = "summary"
    column_fields: ClassVar[tuple[str, ...]] = ("round", "harness_id")
    whole_payload: ClassVar[str | None] = "summary"
    summary: dict[str, Any]
    round: int | None = None
    harness_id: str | None = None


SHARED_EVENTS: tuple[type[Event], ...] = (RoleBudget, Stopped, Summarized)


# ---------------------------------------------------------------------------- registry
class EventTypes:
    """The event kinds of one method: its namespace (``milo``), stored kind -> class.

    Classes whose ``kind`` has no namespace (the shared events) are stored as
    ``<namespace>.<kind>``. ``decode`` refuses a kind of the namespace that is not
    registered (a run written by a newer version, or a corrupted row): never skipped.
    """

    def __init__(self, namespace: str, classes: Iterable[type[Event]]) -> None:
        self.namespace = namespace
        self._by_kind: dict[str, type[Event]] = {}
        self._kind_of: dict[type[Event], str] = {}
        for cls in classes:
            kind = cls.kind if "." in cls.kind else f"{namespace}.{cls.kind}"
            if not kind.startswith(namespace + "."):
                raise ValueError(f"event class {cls.__name__}: kind {kind!r} is outside namespace {namespace!r}")
            if kind in self._by_kind:
                raise ValueError(f"event kind {kind!r} registered twice ({self._by_kind[kind].__name__}, "
                                 f"{cls.__name__})")
            self._by_kind[kind], self._kind_of[cls] = cls, kind

    def __contains__(self, kind: object) -> bool:
        return kind in self._by_kind

    def __iter__(self):
        return iter(sorted(self._by_kind))

    def __len__(self) -> int:
        return len(self._by_kind)

    def classes(self) -> dict[str, type[Event]]:
        return dict(self._by_kind)

    def owns(self, kind: str) -> bool:
        """Whether ``kind`` is in this method's namespace (registered or not)."""
        return str(kind).startswith(self.namespace + ".")

    def kind_of(self, event: Event | type[Event]) -> str:
        cls = event if isinstance(event, type) else type(event)
        try:
            return self._kind_of[cls]
        except KeyError:
            raise TypeError(f"{cls.__name__} is not a registered {self.namespace} event") from None

    def decode(self, kind: str, payload: Mapping[str, Any] | str | None, **columns: Any) -> Event:
        """The typed event of one stored row (payload as stored: JSON text or decoded)."""
        cls = self._by_kind.get(kind)
        if cls is None:
            raise UnknownEvent(f"events row kind {kind!r}: not a {self.namespace} event kind "
                               f"(known: {', '.join(sorted(self._by_kind))})")
        if isinstance(payload, str):
            payload = json.loads(payload) if payload else {}
        return cls.from_payload(payload or {}, **{c: v for c, v in columns.items() if v is not None})

    def decode_row(self, row: Mapping[str, Any]) -> Event:
        return self.decode(str(row["kind"]), row.get("payload"),
                           **{c: row.get(c) for c in EVENT_COLUMNS})

    def decode_rows(self, rows: Iterable[Mapping[str, Any]]) -> list[Event]:
        """This namespace's events of ``rows`` (any order), decoded in ``seq`` order."""
        mine = sorted((r for r in rows if self.owns(str(r.get("kind") or ""))), key=lambda r: r["seq"])
        return [self.decode_row(r) for r in mine]


def canonical_payload(payload: Any) -> str:
    """The payload's text as the store writes it (sorted keys, compact), for comparing rows."""
    return json_dumps(payload)


def read_payloads(store: Any, kind: str) -> list[dict[str, Any]]:
    """Decoded payloads of the stored events of one kind (any method's, or none), oldest
    first: for run-level records that no method projects (``embedder.loaded``)."""
    rows = sorted((r for r in store.read("events").to_pylist() if r["kind"] == kind), key=lambda r: r.get("seq") or 0)
    return [json.loads(r["payload"]) if isinstance(r["payload"], str) else dict(r["payload"] or {}) for r in rows]


# ---------------------------------------------------------------------------- the log
class EventLog:
    """One method's events in one run store: append-and-apply, and replay.

    ``apply``: the projection every appended (and replayed) event goes to, after its
    row is written; a failed write applies nothing. ``write_once``: an event whose row
    (kind, round, harness_id, canonical payload) an earlier session stored is applied
    but not written again: a resumed run that re-walks recorded decisions (SSR) does not
    duplicate its history.
    """

    def __init__(self, store: Any, types: EventTypes, *, apply: Callable[[Event], None] | None = None,
                 write_once: bool = False) -> None:
        self.store, self.types = store, types
        self._apply = apply
        self._stored: set[tuple[str, Any, Any, str]] | None = None
        if write_once:
            self._stored = {self._row_key(str(r["kind"]), r, _as_payload(r.get("payload")))
                            for r in store.read("events").to_pylist() if types.owns(str(r["kind"]))}

    @staticmethod
    def _row_key(kind: str, cols: Mapping[str, Any], payload: Any) -> tuple[str, Any, Any, str]:
        return kind, cols.get("round"), cols.get("harness_id"), canonical_payload(payload)

    def append(self, event: Event, *, once: bool = False, **columns: Any) -> bool:
        """Store ``event`` (its own columns plus ``columns``), then apply it. True when a
        row was written (False: ``write_once`` found it stored). ``once``: a record a run
        writes once, at its end (its stop, its summary): not written again when the store
        already holds the very same row, which a session killed after writing it, before
        the run was marked finished, leaves for the resumed one."""
        kind = self.types.kind_of(event)
        cols = {**event.columns(), **{c: v for c, v in columns.items() if v is not None}}
        if once and already_stored(self.store, kind, event.to_payload(), **cols):
            if self._apply is not None:
                self._apply(event)
            return False
        written = self.write(kind, event.to_payload(), **cols)
        if self._apply is not None:
            self._apply(event)
        return written

    def write(self, kind: str, payload: Mapping[str, Any] | None = None, **columns: Any) -> bool:
        """Write one row of this namespace without projecting it (a record no state
        reads), honouring ``write_once``."""
        if not self.types.owns(kind):
            raise ValueError(f"event kind {kind!r} is outside namespace {self.types.namespace!r}")
        payload = dict(payload or {})
        # Only rows of earlier sessions are skipped: this session's own repeats are new rows.
        if self._stored is not None and self._row_key(kind, columns, payload) in self._stored:
            return False
        self.store.event(kind, payload, **columns)
        return True

    def stored(self) -> list[Event]:
        """The run's events of this namespace, typed, in write order."""
        return self.types.decode_rows(self.store.read("events").to_pylist())

    def replay(self, apply: Callable[[Event], None] | None = None) -> list[Event]:
        """Apply every stored event, in write order, to ``apply`` (default: the log's
        projection); returns them."""
        events = self.stored()
        fn = apply or self._apply
        if fn is not None:
            for e in events:
                fn(e)
        return events


def already_stored(store: Any, kind: str, payload: Mapping[str, Any] | None, **columns: Any) -> bool:
    """Whether the run's ``events`` already hold this very row: the same kind, round,
    harness id and (canonical) payload."""
    want = (kind, columns.get("round"), columns.get("harness_id"), canonical_payload(dict(payload or {})))
    return any(EventLog._row_key(kind, r, _as_payload(r.get("payload"))) == want
               for r in store.read("events").to_pylist() if r["kind"] == kind)


def _as_payload(p: Any) -> Any:
    return (json.loads(p) if p else {}) if isinstance(p, str) else (p or {})
