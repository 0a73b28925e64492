"""What is wrong with a setting, as data: the key, the problem, the fix.

Checks anywhere (an endpoint's fields, a role's caps, a run's settings) return
:class:`Problem` values, so a caller can gather every problem of one pass and report
them together; the message is written in one place (:meth:`Problem.line`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: ``key`` (a config key such as ``run.seed``, or a
    key with its given value, ``run.seed=x``), ``problem`` and ``fix`` (may be empty)."""

    key: str
    problem: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.key}: {self.problem}" + (f"; {self.fix}" if self.fix else "")


class Problems(Exception):
    """An error carrying every problem one check found, one line each (the base of
    :class:`InvalidSettings` and of the entry point's ``ConfigError``)."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        if not self.problems:
            raise ValueError(f"{type(self).__name__} needs at least one problem")
        super().__init__("\n".join(p.line() for p in self.problems))

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.problems)


class InvalidSettings(Problems, ValueError):
    """Settings that failed their check (a ``ValueError``: a constructor's own refusal)."""


def raise_invalid(problems: Iterable[Problem]) -> None:
    """Raise :class:`InvalidSettings` if ``problems`` holds any."""
    found = list(problems)
    if found:
        raise InvalidSettings(found)


@dataclass(frozen=True)
class Bounds:
    """A constructor parameter's range, declared where the parameter is:
    ``budget_s: Annotated[float, Bounds(0, strict=True)]``. The composition check reads it
    (with the parameter's type) before anything is built, so a bad value is bad input named
    by its config key, not an error deep inside a run. ``strict``: the low end is excluded."""

    low: float | None = None
    high: float | None = None
    strict: bool = False

    def problem(self, key: str, value: Any) -> Problem | None:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return None  # the type check speaks for these
        low_ok = self.low is None or value > self.low or (not self.strict and value == self.low)
        if low_ok and (self.high is None or value <= self.high):
            return None
        if self.high is None:
            return Problem(f"{key}={value}", f"must be {'>' if self.strict else '>='} {self.low:g}")
        if self.low is None:
            return Problem(f"{key}={value}", f"must be <= {self.high:g}")
        return Problem(f"{key}={value}", f"must be in {'(' if self.strict else '['}{self.low:g}, {self.high:g}]")


@dataclass(frozen=True)
class ExistingPath:
    """A constructor parameter naming a path that must exist before anything is built,
    declared where the parameter is: ``path: Annotated[str | None, ExistingPath("dir")]``.
    The composition check reads it, so a missing directory is reported with every other
    problem of the command line rather than after them. ``kind``: ``dir`` or ``file``;
    ``what``: how the fix describes the expected content. ``kind`` ``any``: a directory or
    a file (a suite given either way)."""

    kind: str = "dir"
    what: str = ""

    def problem(self, key: str, value: Any) -> Problem | None:
        from pathlib import Path

        if not isinstance(value, str) or not value:
            return None  # null or empty: the parameter's default; the type check speaks for the rest
        path = Path(value).expanduser()
        ok = {"dir": path.is_dir, "file": path.is_file, "any": path.exists}[self.kind]()
        if ok:
            return None
        noun = {"dir": "directory", "file": "file", "any": "file or directory"}[self.kind]
        return Problem(f"{key}={value!r}", f"no such {noun}",
                       f"point it at {self.what}" if self.what else "give an existing path")
