#!/bin/bash
set -euo pipefail
cat > /app/nested/flatten.py <<'PY'
"""Flattening nested JSON-like data into dotted paths."""


def flatten(data):
    """Flatten nested dicts and lists into a new dict {dotted path: leaf value}.

    Dict keys become path parts as str(key); list items use their index; parts are joined
    with ".". Leaves are non-container values plus empty dicts/lists (kept as they are).
    Walks with an explicit stack, so nesting depth is not limited by Python's recursion limit.
    """
    out = {}
    stack = [("", data)]
    while stack:
        path, value = stack.pop()
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else None
        if children is None or (not value and path):
            out[path] = value
            continue
        # Reversed so that popping visits children in their original order.
        for key, child in reversed(list(children)):
            stack.append((f"{path}.{key}" if path else str(key), child))
    return out
PY
