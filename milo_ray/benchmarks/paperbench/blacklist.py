"""A paper's ``blacklist.txt`` checked after the agent's run, as the upstream checks it: the
agent may use the internet except the resources the list names (the paper's own code), an
attempt that reached one is void and scores 0 with the reason.

What counts as reaching a resource is what the agent *did*: a tool call whose arguments name
it (a ``git clone``, ``curl``, ``wget`` or ``pip install`` of the repository, a browser
tool's URL). What a tool *returned* does not count: the paper itself may cite its code's
address, and reading the paper is no violation. Entries are compared without their scheme,
``www.``, a trailing ``/`` or ``.git`` and case, so ``https://github.com/Org/Repo`` also
matches ``git clone git@github.com:org/repo.git`` only as far as the text ``github.com/org/repo``
occurs; an entry that names no resource (no ``.`` or ``/``, such as ``none``) is ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://")


def normalized(entry: str) -> str:
    """An entry (or any text) in the form the check compares."""
    text = entry.strip().lower()
    text = _SCHEME.sub("", text)
    if text.startswith("www."):
        text = text[4:]
    text = text.rstrip("/")
    return text[:-4] if text.endswith(".git") else text


def resources(blacklist: Iterable[str]) -> list[tuple[str, str]]:
    """(entry as written, its normalized form) for every entry that names a resource."""
    out = []
    for entry in blacklist:
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        norm = normalized(entry)
        if "." in norm or "/" in norm:
            out.append((entry, norm))
    return out


def violation(blacklist: Iterable[str], steps: list[dict[str, Any]]) -> str | None:
    """The first tool call in ``steps`` (the agent's trajectory) whose arguments name a
    blacklisted resource, as the reason its attempt is void; None when there is none."""
    wanted = resources(blacklist)
    if not wanted:
        return None
    for i, step in enumerate(steps):
        for call in step.get("tool_calls") or []:
            args = json.dumps(call.get("args"), default=str).lower()
            # Both "https://github.com/a/b" and "github.com/a/b" forms occur in commands.
            plain = _SCHEME.sub("", args).replace("://", "/").replace("www.", "")
            for entry, norm in wanted:
                if norm in args or norm in plain:
                    return (f"the agent reached a blacklisted resource ({entry}) with its tool call "
                            f"{str(call.get('name'))[:100]!r} at step {i}")
    return None
