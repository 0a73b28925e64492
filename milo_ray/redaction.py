"""Redaction of the run's secret values from everything it persists: the last line of defence.

Keys must never reach a harness, a trajectory, a log or a stored row in the first place (the
sandbox and the model gateway keep them out). Should one slip through anyway -- a harness that
prints the key it found, a provider error that echoes it, a model told to repeat it -- every
persisted text passes :func:`redact` first: the store's rows, blobs and manifest
(``store/core.py``), ``run.log`` and the run's logging handlers (:class:`RedactingFilter`),
the report's files and what the tracker sends to MLflow.

What is secret: the *values* of the configured key variables (``model.api_key_env`` or the
provider's own variable, each backend role's ``api_key_env``, and a ``bedrock/`` model's AWS
credential variables: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``),
registered once per process with :func:`register` (the entry point does it before anything is
written). Both the value and its JSON-escaped form are replaced by ``[redacted $NAME]``, so the
variable stays nameable in a log and the value does not.

Values shorter than :data:`MIN_SECRET_CHARS` are not redacted: a real provider key is 20+
characters, while a local server's placeholder key (``x``, ``sk-1``, ``none``) is a word that
ordinary text contains, and replacing every occurrence of it would corrupt traces, source and
reports for no protection (a value that short guards nothing).

Pure value-level code: no framework imports, so the store, the logging setup, the report and
the tracker can all call it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MIN_SECRET_CHARS = 8

_lock = threading.Lock()
# variable name -> value; the values the process redacts.
_secrets: dict[str, str] = {}
# (needle, replacement) pairs, longest needle first (a key that contains another is
# replaced whole), rebuilt on every registration.
_needles: tuple[tuple[str, str], ...] = ()
_byte_needles: tuple[tuple[bytes, bytes], ...] = ()


def marker(name: str) -> str:
    """What a secret is replaced with."""
    return f"[redacted ${name}]"


# Settings handed to the gateway beside a model's credentials (a bedrock/ model's region):
# not secrets, and a value such as ``us-east-1`` is text a trace or a report rightly holds.
NOT_SECRET_NAMES = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION"})


def register(values: Mapping[str, str | None]) -> None:
    """Redact ``values`` ({variable name: value}) from now on in this process. Values shorter
    than :data:`MIN_SECRET_CHARS` (and empty ones) are ignored, and so are the variables of
    :data:`NOT_SECRET_NAMES`; see the module docstring."""
    global _needles, _byte_needles
    with _lock:
        for name, value in values.items():
            if str(name) in NOT_SECRET_NAMES:
                continue
            if isinstance(value, str) and len(value) >= MIN_SECRET_CHARS:
                _secrets[str(name)] = value
        _rebuild()


def register_env(names: Iterable[str | None], env: Mapping[str, str] | None = None) -> None:
    """Register the current values of the variables ``names`` (unset ones are skipped)."""
    env = os.environ if env is None else env
    register({n: env.get(n) for n in names if n})


# What makes a variable's name a credential's: one of its words (split at ``_``) is one of
# these -- a provider's key (``OPENAI_API_KEY``), a token (``HF_TOKEN``, ``AWS_SESSION_TOKEN``),
# a cloud secret (``AWS_SECRET_ACCESS_KEY``, and ``AWS_ACCESS_KEY_ID`` beside it), a password.
# Whole words, so ``TOKENIZERS_PARALLELISM`` or ``KEYTIMEOUT`` are not taken for one.
_SECRET_WORDS = frozenset({"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"})
# Ray's own settings (``RAY_AUTH_TOKEN``...) are Ray's to read in its processes.
_NOT_SECRET_PREFIXES = ("RAY_",)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable named ``name`` holds a credential by its name (see
    :data:`_SECRET_WORDS`); the one definition the framework uses to keep keys out of
    environments it does not control."""
    upper = str(name).upper()
    if upper.startswith(_NOT_SECRET_PREFIXES):
        return False
    return any(word in _SECRET_WORDS for word in re.split(r"[^A-Z0-9]+", upper))


def secret_env_names(env: Mapping[str, str] | None = None) -> list[str]:
    """The variables of ``env`` (default: this process's environment) that hold a
    credential: every one :func:`is_secret_name` names, and every registered key variable
    whatever its name (``model.api_key_env`` may be any name)."""
    env = os.environ if env is None else env
    with _lock:
        registered = set(_secrets)
    return sorted(n for n in env if is_secret_name(n) or n in registered)


def clear() -> None:
    """Forget every registered secret (tests; a process that starts another run)."""
    with _lock:
        _secrets.clear()
        _rebuild()


def registered_names() -> list[str]:
    with _lock:
        return sorted(_secrets)


def _rebuild() -> None:
    global _needles, _byte_needles
    pairs: dict[str, str] = {}
    for name, value in _secrets.items():
        repl = marker(name)
        pairs[value] = repl
        # A trace stores the value JSON-escaped when it holds a quote or a backslash.
        escaped = json.dumps(value)[1:-1]
        if escaped != value:
            pairs[escaped] = repl
    ordered = sorted(pairs.items(), key=lambda kv: -len(kv[0]))
    _needles = tuple(ordered)
    _byte_needles = tuple((k.encode("utf-8"), v.encode("utf-8")) for k, v in ordered)


def active() -> bool:
    """Whether anything is registered (the fast path of every caller)."""
    return bool(_needles)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by its marker."""
    needles = _needles
    if not needles or not isinstance(text, str):
        return text
    for needle, repl in needles:
        if needle in text:
            text = text.replace(needle, repl)
    return text


def redact_bytes(data: bytes) -> bytes:
    needles = _byte_needles
    if not needles:
        return data
    data = bytes(data)
    for needle, repl in needles:
        if needle in data:
            data = data.replace(needle, repl)
    return data


def redact_obj(obj: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples, strings, bytes) with every string
    redacted, keys included; other values are returned as they are. Returns ``obj`` itself
    when nothing is registered."""
    if not _needles:
        return obj
    return _walk(obj)


def _walk(obj: Any) -> Any:
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return redact_bytes(bytes(obj))
    if isinstance(obj, dict):
        return {(_walk(k) if isinstance(k, str) else k): _walk(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_walk(v) for v in obj)
    return obj


class RedactingFilter(logging.Filter):
    """A logging filter that redacts a record's final message and its traceback text, so a
    handler it is attached to never writes a secret (``run.log``, the console)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _needles:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as usual
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_log_redaction(handler: logging.Handler) -> logging.Handler:
    """Attach one :class:`RedactingFilter` to ``handler`` (idempotent); returns it."""
    if not any(isinstance(f, RedactingFilter) for f in handler.filters):
        handler.addFilter(RedactingFilter())
    return handler


# Files the store writes (tables and blobs) are redacted as they are written.
_STORE_OWNED_SUFFIXES = (".parquet", ".zst")
_SCRUB_MAX_BYTES = 256 * 1024 * 1024


def scrub_tree(root: str | os.PathLike, *, skip_suffixes: tuple[str, ...] = _STORE_OWNED_SUFFIXES) -> list[str]:
    """Redact, in place, every file under ``root`` that holds a registered secret (the files
    a run's processes wrote directly: harness copies, evidence, agent transcripts, tracker
    files); returns their paths relative to ``root``. Store-owned files (``skip_suffixes``),
    symlinks and files past 256 MB are left alone. Each rewrite is atomic (temp file, then
    rename) and keeps the file's mode."""
    from pathlib import Path

    if not _byte_needles:
        return []
    base = Path(root)
    changed: list[str] = []
    for path in sorted(base.rglob("*")):
        try:
            if path.is_symlink() or not path.is_file() or path.suffix in skip_suffixes:
                continue
            if path.stat().st_size > _SCRUB_MAX_BYTES:
                continue
            data = path.read_bytes()
            clean = redact_bytes(data)
            if clean == data:
                continue
            tmp = path.with_name(f".{path.name}.redacting")
            tmp.write_bytes(clean)
            os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
            changed.append(path.relative_to(base).as_posix())
        except OSError:
            continue  # a file that vanished or cannot be read is not ours to fix
    return changed
