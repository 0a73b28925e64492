"""The five seed harnesses, one directory each (``<name>/harness.py``).

* ``minimal`` — bare tool loop with read_file/write_file/bash (MILO App. A.4).
* ``stock`` — create_deep_agent on its defaults (App. B.1).
* ``division_of_labor`` — explorer/coder/verifier sub-agents + completion gate (B10).
* ``plan_and_solve`` — plan protocol, plan nudge, plan-completion gate (B11).
* ``reproduce_first`` — reproduce-first protocol + rubric gate (B12).

Seeds are ordinary harness directories: they are loaded as data (never imported by
the framework) and every one follows the assembly-list layout that
``milo_ray.harness.mechanisms`` transforms.
"""

from __future__ import annotations

from pathlib import Path

from milo_ray.harness.model import Harness

SEEDS_DIR = Path(__file__).resolve().parent
SEED_NAMES: tuple[str, ...] = ("minimal", "stock", "division_of_labor", "plan_and_solve", "reproduce_first")
# The three expert seeds every search starts from (MILO App. B.3).
SEARCH_SEEDS: tuple[str, ...] = ("division_of_labor", "plan_and_solve", "reproduce_first")


def seed_dir(name: str) -> Path:
    if name not in SEED_NAMES:
        raise ValueError(f"seed {name!r}: unknown; choose from {SEED_NAMES}")
    return SEEDS_DIR / name


def load_seeds(names: list[str] | tuple[str, ...] | None = None) -> list[Harness]:
    """The seed harnesses in the given order (default: all five), ``name`` = seed name."""
    return [Harness.from_dir(seed_dir(n), name=n) for n in (SEED_NAMES if names is None else names)]
