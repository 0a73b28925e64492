"""The experience-record verdict every SSR judge must produce (SSR §4.1, App. 9).

A judge reads one trajectory and its feedback and answers with one JSON object:

* ``w`` importance — how general the experience is beyond its task (in [0, 1]);
* ``a`` actionability — how concrete the proposed harness change is (in [0, 1]);
* ``u`` confidence — how reliable the judge's own reading is (in [0, 1]);
* ``summary`` — a short executive summary (non-empty);
* ``suggestions`` — concrete harness changes (list of strings);
* ``insights`` — the transferable lesson (optional string);
* ``failure_modes`` / ``mechanisms`` — optional tags (lists of strings).

Scores are used as given: there is no normalization, and an out-of-range or
malformed answer is *rejected* (``parse_verdict`` raises ``JudgeOutputError``) so the
caller can re-ask — never clipped.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import jsonschema

from milo_ray.agents.protocols import JudgeVerdict

_SCORE = {"type": "number", "minimum": 0.0, "maximum": 1.0}
_STRS = {"type": "array", "items": {"type": "string"}}

VERDICT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "SSR experience record verdict",
    "type": "object",
    "required": ["w", "a", "u", "summary", "suggestions"],
    "properties": {
        "w": _SCORE,
        "a": _SCORE,
        "u": _SCORE,
        "summary": {"type": "string", "minLength": 1},
        "suggestions": _STRS,
        "insights": {"type": "string"},
        "failure_modes": _STRS,
        "mechanisms": _STRS,
    },
    "additionalProperties": True,
}

_FENCE = re.compile(r"```(?:json)?\s*(\{.*\})\s*```", re.DOTALL)


class JudgeOutputError(ValueError):
    """The judge's answer is not a valid verdict; the message names the field."""


def _as_object(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, (bytes, str)):
        text = raw.decode() if isinstance(raw, bytes) else raw
        m = _FENCE.search(text)
        if m:
            text = m.group(1)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise JudgeOutputError(f"judge output is not JSON ({e.msg} at char {e.pos}); "
                                   "answer with one JSON object matching VERDICT_SCHEMA") from None
        if not isinstance(obj, dict):
            raise JudgeOutputError(f"judge output must be a JSON object, got {type(obj).__name__}")
        return obj
    raise JudgeOutputError(f"judge output must be a JSON object or string, got {type(raw).__name__}")


def parse_verdict(raw: Any) -> JudgeVerdict:
    """Validate a raw judge answer (dict, JSON string, or fenced JSON) into a verdict.

    Raises ``JudgeOutputError`` naming the offending field (missing, wrong type, NaN,
    outside [0, 1], empty summary).
    """
    obj = _as_object(raw)
    for k in ("w", "a", "u"):
        v = obj.get(k)
        if isinstance(v, float) and not math.isfinite(v):
            raise JudgeOutputError(f"judge field {k!r} is {v}; it must be a number in [0, 1]")
        if isinstance(v, bool):
            raise JudgeOutputError(f"judge field {k!r} is a boolean; it must be a number in [0, 1]")
    try:
        jsonschema.validate(obj, VERDICT_SCHEMA)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "(root)"
        raise JudgeOutputError(f"judge field {where!r}: {e.message}") from None
    return JudgeVerdict(
        w=float(obj["w"]), a=float(obj["a"]), u=float(obj["u"]),
        summary=obj["summary"].strip() or obj["summary"],
        suggestions=[str(s) for s in obj["suggestions"]],
        insights=str(obj.get("insights", "")),
    )


def verdict_tags(raw: Any) -> dict[str, list[str]]:
    """The optional ``failure_modes``/``mechanisms`` tags of a raw answer (empty if absent)."""
    try:
        obj = _as_object(raw)
    except JudgeOutputError:
        return {"failure_modes": [], "mechanisms": []}
    return {k: [str(x) for x in obj.get(k, []) if isinstance(x, str)] for k in ("failure_modes", "mechanisms")}
