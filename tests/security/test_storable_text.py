"""Untrusted text is made storable: whatever a harness, a task or a model wrote, the
sanitiser's output encodes as UTF-8, holds no NUL, is bounded, and round-trips through a
Parquet write; it never raises."""

from __future__ import annotations

import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from milo_ray.core.storable import MAX_DEPTH, storable, storable_text

# Any code point a Python string can hold: surrogates (lone or paired), NUL, the rest.
_ANY_CHAR = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr), st.just("\x00"),
                      st.integers(0, 0x10FFFF).map(chr))
_ANY_TEXT = st.lists(_ANY_CHAR, max_size=60).map("".join)


def _parquet_round_trip(values: list[str]) -> list[str]:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": pa.array(values, type=pa.string())}), buf)
    return pq.read_table(io.BytesIO(buf.getvalue()))["text"].to_pylist()


@settings(max_examples=300, deadline=None)
@given(_ANY_TEXT, st.integers(1, 80))
def test_sanitised_text_always_encodes_and_round_trips_through_parquet(text, limit):
    out = storable_text(text, limit=limit)
    out.encode("utf-8")
    assert "\x00" not in out
    assert _parquet_round_trip([out]) == [out]
    assert storable_text(out, limit=len(out)) == out  # nothing left to fix


@settings(max_examples=100, deadline=None)
@given(st.recursive(_ANY_TEXT, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_ANY_TEXT, kids, max_size=4),
                    max_leaves=20))
def test_sanitised_values_encode_as_json_and_utf8(value):
    json.dumps(storable(value), ensure_ascii=False).encode("utf-8")


def test_undecodable_bytes_of_a_file_name_show_as_escapes():
    name = os.fsdecode(b"caf\xe9 \xff.txt")  # a non-UTF-8 file name, as Python decodes it
    assert storable_text(name) == "caf\\xe9 \\xff.txt"
    assert storable_text("a\ud800b") == "a\ufffdb"  # a lone high surrogate
    assert storable_text("\ud83d\ude00") == "\U0001F600"  # a pair split in two code points is joined
    assert storable_text("nul\x00here") == "nul\\x00here"


def test_oversized_text_is_cut_with_a_marker_saying_how_much():
    out = storable_text("x" * 1000, limit=100)
    assert out == "x" * 100 + "[... 900 characters cut]"
    assert storable_text("short", limit=100) == "short"


def test_keys_are_sanitised_and_deep_nesting_is_bounded():
    deep: list = []
    cur = deep
    for _ in range(10 * MAX_DEPTH):
        cur.append([])
        cur = cur[0]
    out = storable({"k\udcff": deep, 3: "v\x00"})
    assert set(out) == {"k\\xff", 3} and out[3] == "v\\x00"
    json.dumps(out)  # no RecursionError: the depth past MAX_DEPTH became a string
    assert "nested deeper" in json.dumps(out)


def test_anything_is_turned_into_text_without_raising():
    class Hostile:
        def __str__(self):
            raise RuntimeError("no")

    assert storable_text(Hostile()) == "[unprintable Hostile: RuntimeError]"
    assert storable_text(b"\xff") == "b'\\xff'"
