"""ARE's tool argument types, which arrive as Python type strings (``"str"``,
``"list[str]"``, ``"str | None"``, ``"Optional[int]"``, ``"dict[str, Any]"``), as JSON
Schema fragments a chat model's tool-calling understands.

Pure and dependency-free: the host process (ARE's interpreter) and the harness's tools
(inside the sandbox) both use it. An unknown type maps to ``{}`` (any JSON value) rather
than failing: ARE checks the argument again when the tool is called.
"""

from __future__ import annotations

from typing import Any

_SCALARS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "None": "null",
            "NoneType": "null", "string": "string", "integer": "integer", "number": "number",
            "boolean": "boolean"}
_LISTS = ("list", "List", "tuple", "Tuple", "set", "Set", "Sequence")
_DICTS = ("dict", "Dict", "Mapping")


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [p for p in parts if p]


def type_to_schema(type_str: Any) -> dict[str, Any]:
    """The JSON Schema of one ARE argument type string (module docstring)."""
    if not isinstance(type_str, str):
        return {}
    t = type_str.strip()
    for prefix in ("typing.", "<class '"):
        t = t.replace(prefix, "")
    t = t.rstrip("'>").strip()
    alts = _split_top(t, "|")
    if len(alts) > 1:
        return {"anyOf": [type_to_schema(a) for a in alts]}
    if t in _SCALARS:
        return {"type": _SCALARS[t]}
    if "[" in t and t.endswith("]"):
        head, inner = t[:t.index("[")].strip(), t[t.index("[") + 1:-1]
        args = _split_top(inner, ",")
        if head == "Optional" and len(args) == 1:
            return {"anyOf": [type_to_schema(args[0]), {"type": "null"}]}
        if head == "Union":
            return {"anyOf": [type_to_schema(a) for a in args]}
        if head == "Literal":
            return {"enum": [a.strip("'\"") for a in args]}
        if head in _LISTS:
            return {"type": "array", "items": type_to_schema(args[0])} if args else {"type": "array"}
        if head in _DICTS:
            return {"type": "object", "additionalProperties": type_to_schema(args[1]) if len(args) == 2 else {}}
    if t in _LISTS:
        return {"type": "array"}
    if t in _DICTS:
        return {"type": "object"}
    return {}


def parameters_schema(args: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``parameters`` object of one tool from ARE's argument list (each a mapping with
    ``name``, ``type`` or ``arg_type``, ``description``, ``has_default``)."""
    props: dict[str, Any] = {}
    required = []
    for a in args:
        schema = type_to_schema(a.get("type", a.get("arg_type")))
        if a.get("description"):
            schema = {**schema, "description": str(a["description"])}
        props[str(a["name"])] = schema
        if not a.get("has_default", False):
            required.append(str(a["name"]))
    return {"type": "object", "properties": props, "required": required}
