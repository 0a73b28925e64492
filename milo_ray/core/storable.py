"""Untrusted text made storable: the one sanitiser every string from a harness, a task or a
model passes where it enters the host.

A harness's messages, its stderr, a trajectory's steps, an answer, an error text or a file
name can hold what no UTF-8 file can: lone surrogates (Python decodes a non-UTF-8 file name
or byte stream with ``surrogateescape``, and JSON's ``"\\udcff"`` escape parses to one), NUL
characters (which C-string consumers of a result table cut at), and strings large enough to
blow up a row or a blob. pyarrow refuses to encode a surrogate, so one such string used to
fail the whole batch a run was storing. :func:`storable_text` turns any string into one that
encodes as UTF-8 and round-trips through Parquet, and never raises; :func:`storable` applies
it to every string (dict keys included) of a JSON-like value.

What it changes, so that a reader can tell a sanitised string from an original one:

* a surrogate pair left split in two code points is joined into its character;
* a lone surrogate from ``surrogateescape`` (``\\udc80``-``\\udcff``, i.e. the undecodable byte
  0x80-0xFF) becomes the four characters ``\\xNN`` (the byte it stood for); any other lone
  surrogate becomes U+FFFD, the replacement character;
* NUL becomes the four characters ``\\x00``;
* a string longer than ``limit`` characters keeps its first ``limit`` characters followed by
  ``[... N characters cut]`` (N the number dropped);
* a value nested deeper than :data:`MAX_DEPTH` is replaced by a string saying so (a JSON
  encoder would recurse past Python's stack on it).

Pure value-level code with no framework imports (the core layer): the harness-process host,
the rollout result and the store all call it.
"""

from __future__ import annotations

import re
from typing import Any

# A trace's strings are bounded upstream (the trajectory protocol clips step content); this is
# the backstop for any string of any executor: 1 Mi characters, at most 4 MiB of UTF-8.
MAX_TEXT_CHARS = 1 << 20
MAX_DEPTH = 64

_SURROGATES = re.compile("([\ud800-\udbff][\udc00-\udfff])|[\ud800-\udfff]")


def _fix_surrogate(m: re.Match[str]) -> str:
    pair = m.group(1)
    if pair is not None:
        high, low = ord(pair[0]), ord(pair[1])
        return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
    cp = ord(m.group(0))
    if 0xDC80 <= cp <= 0xDCFF:
        return f"\\x{cp - 0xDC00:02x}"
    return "\ufffd"


def storable_text(text: Any, *, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` (``str()`` of a non-string) as a string that encodes as UTF-8, holds no NUL
    and is at most ``limit`` characters plus the cut marker; see the module docstring.
    Never raises."""
    if not isinstance(text, str):
        try:
            text = str(text)
        except Exception as exc:  # a hostile __str__: say what it was, not what it said
            text = f"[unprintable {type(text).__name__}: {type(exc).__name__}]"
    # The common case (plain ASCII, no NUL, short) costs two C-level scans.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _SURROGATES.sub(_fix_surrogate, text)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit]}[... {cut} characters cut]"
    return text


def storable(value: Any, *, limit: int = MAX_TEXT_CHARS, _depth: int = 0) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples) with every string, keys included,
    passed through :func:`storable_text`; other values are returned as they are. A value
    nested deeper than :data:`MAX_DEPTH` is replaced by a string saying so. Never raises
    for the shape of ``value``."""
    if isinstance(value, str):
        return storable_text(value, limit=limit)
    if isinstance(value, (dict, list, tuple)) and _depth >= MAX_DEPTH:
        return f"[{type(value).__name__} nested deeper than {MAX_DEPTH} levels: dropped]"
    if isinstance(value, dict):
        return {(storable_text(k, limit=limit) if isinstance(k, str) else k): storable(v, limit=limit, _depth=_depth + 1)
                for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v, limit=limit, _depth=_depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(storable(v, limit=limit, _depth=_depth + 1) for v in value)
    return value
