"""Instruction templates of the search's LLM agents, one ``<name>.md`` file each.

A template names its inputs as ``${placeholder}`` (``string.Template`` syntax, so code
and JSON braces in the text need no escaping; a literal dollar is ``$$``).
:func:`render` fills them and refuses a missing or an unknown value, so an instruction
never reaches a model with a hole in it.
"""

from __future__ import annotations

import string
from functools import lru_cache
from importlib import resources
from typing import Any


class PromptError(ValueError):
    """A template rendered with missing or unknown values; the message names them."""


@lru_cache(maxsize=None)
def template(name: str) -> string.Template:
    """The template ``<name>.md`` of this package."""
    path = resources.files(__name__) / f"{name}.md"
    if not path.is_file():
        known = sorted(p.name[:-3] for p in resources.files(__name__).iterdir() if p.name.endswith(".md"))
        raise PromptError(f"no prompt template {name!r}; templates: {known}")
    return string.Template(path.read_text(encoding="utf-8"))


def placeholders(name: str) -> set[str]:
    """The placeholders template ``name`` needs."""
    return set(template(name).get_identifiers())


def names() -> list[str]:
    """Every template of this package."""
    return sorted(p.name[:-3] for p in resources.files(__name__).iterdir() if p.name.endswith(".md"))


def render_from(name: str, values: "dict[str, Any]") -> str:
    """Template ``name`` filled from a larger mapping of available values (those it does
    not use are ignored); a placeholder without a value still raises :class:`PromptError`."""
    return render(name, **{k: v for k, v in values.items() if k in placeholders(name)})


def render(name: str, **values: Any) -> str:
    """Template ``name`` with every placeholder filled from ``values`` (str() of each).
    Raises :class:`PromptError` naming missing placeholders or values the template does
    not use (a typo in a caller would otherwise drop an input silently)."""
    need = placeholders(name)
    missing = sorted(need - set(values))
    unused = sorted(set(values) - need)
    if missing or unused:
        raise PromptError(f"prompt {name!r}: missing values {missing}, unknown values {unused}")
    if not template(name).is_valid():
        raise PromptError(f"prompt {name!r}: a '$' that is not a placeholder (write $$ for a literal dollar)")
    return template(name).substitute({k: str(v) for k, v in values.items()})
