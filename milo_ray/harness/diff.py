"""Line diffs between two harnesses.

Owns :class:`HarnessDiff` and :func:`diff`. The patch is a git-style unified diff
over every file of both harnesses (added and removed files included), in sorted
path order, so the same pair always yields the same bytes. The line counts feed
the lineage memory's edges (MILO §4.1) and SSR's racing tie-break, which prefers
the candidate with fewer added + deleted lines vs. the parent (SSR §4.3).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from milo_ray.harness.model import Harness

CONTEXT_LINES = 3
_NO_NEWLINE = "\\ No newline at end of file\n"


@dataclass(frozen=True)
class HarnessDiff:
    """``patch``: unified diff text ("" when identical); ``added``/``deleted``: changed
    line counts summed over files; ``files_changed``: sorted paths that differ."""

    patch: str
    added: int
    deleted: int
    files_changed: tuple[str, ...] = ()

    @property
    def changed_lines(self) -> int:
        """added + deleted, the size measure SSR's racing tie-break compares."""
        return self.added + self.deleted

    @property
    def is_empty(self) -> bool:
        return not self.files_changed

    def summary(self) -> str:
        """One line for logs and lineage renderings, e.g. ``+12 -3 (harness.py, tools.py)``."""
        if self.is_empty:
            return "no changes"
        return f"+{self.added} -{self.deleted} ({', '.join(self.files_changed)})"


def _file_diff(path: str, old: str | None, new: str | None) -> tuple[list[str], int, int]:
    """Unified-diff lines of one file plus its added/deleted counts.

    ``None`` means the file does not exist on that side (git's ``/dev/null``)."""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    fromfile = f"a/{path}" if old is not None else "/dev/null"
    tofile = f"b/{path}" if new is not None else "/dev/null"
    raw = list(difflib.unified_diff(a, b, fromfile=fromfile, tofile=tofile, n=CONTEXT_LINES))
    if not raw:
        return [], 0, 0
    out: list[str] = []
    added = deleted = 0
    # difflib emits the two header lines first; counting by position rather than
    # by prefix keeps a content line such as "++x" from being taken for a header.
    for i, line in enumerate(raw):
        if not line.endswith("\n"):
            line = line + "\n" + _NO_NEWLINE
        out.append(line)
        if i < 2 or line.startswith("@@"):
            continue
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            deleted += 1
    return out, added, deleted


def diff(parent: Harness, child: Harness) -> HarnessDiff:
    """The change that turns ``parent`` into ``child``. Deterministic; O(total lines²)
    in the worst case (difflib), linear for typical small edits."""
    lines: list[str] = []
    added = deleted = 0
    changed: list[str] = []
    for path in sorted(set(parent.files) | set(child.files)):
        old = parent.files.get(path)
        new = child.files.get(path)
        if old == new:
            continue
        body, a, d = _file_diff(path, old, new)
        if not body:
            # An empty file was added or removed: no line changes, but the file set changed.
            body = [f"--- {'a/' + path if old is not None else '/dev/null'}\n",
                    f"+++ {'b/' + path if new is not None else '/dev/null'}\n"]
        lines.extend(body)
        added += a
        deleted += d
        changed.append(path)
    return HarnessDiff(patch="".join(lines), added=added, deleted=deleted, files_changed=tuple(changed))
