"""Reading a coding-agent CLI's stdout: its usage (tokens, USD) and final message, in the
formats :mod:`milo_ray.agents.mutators.cli` documents (Claude Code's result object, Codex's
JSON-line events)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

USAGE_FORMATS = ("auto", "claude_json", "codex_jsonl", "none")


@dataclass(frozen=True)
class CliUsage:
    """What one CLI run reported: its usage (tokens; ``cost_usd`` None when it gave no
    USD), its final message, an error it reported, and which format it was read as."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    tokens_reported: bool = False
    final_message: str = ""
    error: str | None = None
    format: str = "none"


def parse_output(stdout: str, usage_format: str) -> CliUsage:
    """Usage and final message from a CLI's stdout (see the module docstring for the
    formats). ``auto`` tries Claude Code's result object, then Codex's events."""
    if usage_format not in USAGE_FORMATS:
        raise ValueError(f"usage_format={usage_format!r}; expected one of {list(USAGE_FORMATS)}")
    if usage_format == "claude_json":
        return _claude(stdout) or CliUsage(format="claude_json", error="no result object in the output")
    if usage_format == "codex_jsonl":
        return _codex(stdout) or CliUsage(format="codex_jsonl", error="no Codex events in the output")
    if usage_format == "auto":
        return _claude(stdout) or _codex(stdout) or CliUsage()
    return CliUsage()


def _json_lines(stdout: str) -> list[Any]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _claude(stdout: str) -> CliUsage | None:
    """Claude Code's last ``{"type": "result"}`` object: the whole output (``json``),
    the last element of an array (``json --verbose``) or the last line (``stream-json``)."""
    try:
        whole: Any = json.loads(stdout)
        items = whole if isinstance(whole, list) else [whole]
    except ValueError:
        items = _json_lines(stdout)
    results = [o for o in items if isinstance(o, dict) and o.get("type") == "result"]
    if not results:
        return None
    r = results[-1]
    u = r.get("usage") if isinstance(r.get("usage"), dict) else {}
    tin = sum(_int(u.get(k)) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    cost = r.get("total_cost_usd", r.get("cost_usd"))  # cost_usd: releases before total_cost_usd
    text = r.get("result") if isinstance(r.get("result"), str) else ""
    error = None
    if r.get("is_error") or (r.get("subtype") not in (None, "success")):
        error = f"{r.get('subtype') or 'error'}: {text}".strip()[:500]
    return CliUsage(tin, _int(u.get("output_tokens")),
                    cost_usd=float(cost) if isinstance(cost, (int, float)) and cost >= 0 else None,
                    tokens_reported=bool(u), final_message=text, error=error, format="claude_json")


def _codex(stdout: str) -> CliUsage | None:
    """Codex ``exec --json`` events: usage of every ``turn.completed``, the last agent
    message, the last ``turn.failed`` / ``error`` message."""
    events = [e for e in _json_lines(stdout) if isinstance(e, dict) and isinstance(e.get("type"), str)]
    known = ("thread.", "turn.", "item.")
    if not any(e["type"].startswith(known) for e in events):
        return None
    tin = tout = 0
    turns = 0
    message, error = "", None
    for e in events:
        if e["type"] == "turn.completed" and isinstance(e.get("usage"), dict):
            turns += 1
            tin += _int(e["usage"].get("input_tokens"))
            tout += _int(e["usage"].get("output_tokens"))
        elif e["type"] == "item.completed" and isinstance(e.get("item"), dict):
            item = e["item"]
            if item.get("type", item.get("item_type")) in ("agent_message", "assistant_message"):
                message = str(item.get("text") or "")
        elif e["type"] == "turn.failed":
            err = e.get("error")
            error = str(err.get("message") if isinstance(err, dict) else err)[:500]
        elif e["type"] == "error":
            error = str(e.get("message"))[:500]
    return CliUsage(tin, tout, cost_usd=None, tokens_reported=turns > 0, final_message=message, error=error,
                    format="codex_jsonl")


def _int(x: Any) -> int:
    return int(x) if isinstance(x, (int, float)) and x > 0 else 0
