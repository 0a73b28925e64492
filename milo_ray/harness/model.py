"""The harness as data: a directory of text files whose ``harness.py`` exposes
``build_agent(model, backend)``. Its identity is a content hash of every file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from milo_ray.boundary.nofollow import UnsafePath, read_tree_nofollow, safe_relpath, write_file_nofollow
from milo_ray.core.executor import ENTRY_FILE

# Files a harness directory may carry; larger or binary files are not harness source.
MAX_FILE_BYTES = 1_000_000


def content_hash(files: dict[str, str]) -> str:
    """sha256 over sorted (path, content) pairs; 16 hex chars are plenty per run."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode())
        h.update(b"\0")
        h.update(files[path].encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Harness:
    """Immutable harness sources. ``name`` is a human label, not part of the identity."""

    files: dict[str, str]
    name: str = ""
    harness_id: str = field(init=False)

    def __post_init__(self) -> None:
        if ENTRY_FILE not in self.files:
            raise ValueError(f"harness files: missing {ENTRY_FILE!r} (the file exposing build_agent(model, backend))")
        object.__setattr__(self, "harness_id", content_hash(self.files))

    @property
    def source(self) -> str:
        return self.files[ENTRY_FILE]

    @classmethod
    def from_source(cls, source: str, name: str = "") -> "Harness":
        return cls({ENTRY_FILE: source}, name=name)

    @classmethod
    def from_dir(cls, path: str | Path, name: str = "") -> "Harness":
        # A harness directory may have been written by an agent: read without following a
        # link (a link, a special file or a file over the cap is left out, never read through).
        root = Path(path)
        tree = read_tree_nofollow(root, max_file_bytes=MAX_FILE_BYTES)
        files: dict[str, str] = {}
        for rel, data in sorted(tree.files.items()):
            if "__pycache__" not in rel.split("/"):
                try:
                    files[rel] = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
        return cls(files, name=name or root.name)

    def write_to(self, path: str | Path) -> Path:
        """Write the files under ``path`` (made when missing), never through a link and
        never outside it: a file name from an untrusted child (``../x``, ``/abs``) is
        written nowhere -- validation rejects such a child with its reason -- and a link
        on the way refuses the write (:mod:`milo_ray.boundary.nofollow`)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        for rel, text in self.files.items():
            try:
                safe_relpath(rel)
            except UnsafePath:
                continue
            write_file_nofollow(root, rel, text.encode("utf-8", "surrogateescape"))
        return root

    def with_source(self, source: str, name: str = "") -> "Harness":
        """A new harness with ``harness.py`` replaced (other files kept)."""
        return Harness({**self.files, ENTRY_FILE: source}, name=name or self.name)
