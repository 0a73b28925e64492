"""The five seed harnesses, one directory each (``<name>/harness.py``).

* ``minimal`` — bare tool loop with read_file/write_file/bash (MILO App. A.4).
* ``stock`` — create_deep_agent on its defaults (App. B.1).
* ``division_of_labor`` — explorer/coder/verifier sub-agents + completion gate (B10).
* ``plan_and_solve`` — plan protocol, plan nudge, plan-completion gate (B11).
* ``reproduce_first`` — reproduce-first protocol + rubric gate (B12).

Seeds are ordinary harness directories: they are loaded as data (never imported by
the framework) and every one follows the assembly-list layout that
``milo_ray.harness.mechanisms`` transforms. Their mechanisms are written out (a seed is a
file users and mutators read whole), and written only here: ``mechanisms/templates.py``
reads the template of each mechanism a seed carries from the seed's file, so a change
to the seed is a change to the template ``add_mechanism`` inserts.
"""

from __future__ import annotations

from pathlib import Path

from milo_ray.harness.model import ENTRY_FILE, Harness

SEEDS_DIR = Path(__file__).resolve().parent
SEED_NAMES: tuple[str, ...] = ("minimal", "stock", "division_of_labor", "plan_and_solve", "reproduce_first")
# The three expert seeds every search starts from (MILO App. B.3).
SEARCH_SEEDS: tuple[str, ...] = ("division_of_labor", "plan_and_solve", "reproduce_first")


def resolve_seed(entry: str) -> str:
    """A bundled seed's name as it is, or a user's harness directory as an absolute path;
    ``ValueError`` says why ``entry`` is neither (unknown name, missing directory, no
    ``harness.py``). A bare name is a bundled seed; anything with a path separator, or
    starting with ``.`` or ``~``, is a path."""
    if entry in SEED_NAMES:
        return entry
    if "/" not in entry and not entry.startswith((".", "~")):
        raise ValueError(f"unknown seed harness {entry!r} (a path needs a '/': ./{entry})")
    path = Path(entry).expanduser().resolve()
    if not path.is_dir():
        raise ValueError(f"harness directory {entry!r} does not exist ({path})")
    if not (path / ENTRY_FILE).is_file():
        raise ValueError(f"harness directory {entry!r} has no {ENTRY_FILE} (the file defining build_agent(model, backend))")
    return str(path)


def seed_dir(name: str) -> Path:
    """The directory of a bundled seed, or of a user's harness given by absolute path."""
    if name in SEED_NAMES:
        return SEEDS_DIR / name
    if name.startswith("/"):
        return Path(name)
    raise ValueError(f"seed {name!r}: unknown; choose from {SEED_NAMES} or give a harness directory path")


def load_seeds(names: list[str] | tuple[str, ...] | None = None) -> list[Harness]:
    """The seed harnesses in the given order (default: all five bundled ones); ``name`` is
    the seed's name, or a user harness directory's last path component."""
    out = []
    for n in SEED_NAMES if names is None else names:
        where = seed_dir(n)
        out.append(Harness.from_dir(where, name=n if n in SEED_NAMES else where.name))
    return out
