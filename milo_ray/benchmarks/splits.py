"""Splitting a task set (Harbor directories, SWE rows) into named splits.

Two sources, one result (split name -> task ids, disjoint):

* ``sizes``: fractions (floats, summing to at most 1) or counts (ints) per split,
  drawn from the task ids shuffled with a seed (:func:`milo_ray.core.seeds.derive_seed`).
  The ids are sorted before shuffling, so the result depends only on the set of ids and
  the seed -- not on directory listing or file order.
* a split file: JSON or YAML mapping split -> list of task ids, used as written.

Both are validated in full: every problem is reported in one ``ValueError``. A split
that ends up empty is refused (a method asking for it would silently see no tasks); a
task left out of every split is simply not used (a split file may select a subset).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from milo_ray.core.seeds import derive_seed

DEFAULT_SPLITS: dict[str, float] = {"search": 0.5, "val": 0.25, "test": 0.25}


# The order splits are drawn in, whatever order a config lists them in: a run resumed
# from its manifest (whose keys are stored sorted) must draw exactly the splits it drew.
_SPLIT_RANK = {"train": 0, "search": 1, "val": 2, "test": 3}


def canonical_order(names: Any) -> list[str]:
    """Split names in drawing order: train, search, val, test, then any others by name."""
    return sorted(names, key=lambda k: (_SPLIT_RANK.get(k, len(_SPLIT_RANK)), k))


def split_sizes(n: int, sizes: Mapping[str, Any], *, field: str = "splits") -> dict[str, int]:
    """How many of ``n`` tasks each split gets, in :func:`canonical_order` (the order the
    callers draw them in). Floats are fractions (largest-remainder rounding, so fractions
    summing to 1 place every task); ints are counts. Mixing the two is refused: ``1``
    would be ambiguous between "one task" and "all of them"."""
    if not sizes:
        raise ValueError(f"{field}: no splits given (e.g. {field}: {{search: 0.5, val: 0.25, test: 0.25}})")
    sizes = {k: sizes[k] for k in canonical_order(sizes)}
    problems: list[str] = []
    kinds = set()
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            problems.append(f"{field}.{name}={v!r}: must be a fraction (float) or a count (int) >= 0")
        else:
            kinds.add(int if isinstance(v, int) else float)
    if problems:
        raise ValueError("\n".join(problems))
    if len(kinds) > 1:
        raise ValueError(f"{field}={dict(sizes)}: mixes fractions (floats) and counts (ints); use one kind "
                         "(write 0.5 for half, 10 for ten tasks)")
    if kinds == {int}:
        total = sum(sizes.values())
        if total > n:
            raise ValueError(f"{field}={dict(sizes)}: asks for {total} tasks but the benchmark has {n}; "
                             "lower the counts")
        return {k: int(v) for k, v in sizes.items()}
    total_f = float(sum(sizes.values()))
    if total_f > 1.0 + 1e-9:
        raise ValueError(f"{field}={dict(sizes)}: fractions sum to {total_f:g} > 1; make them sum to at most 1")
    exact = {k: float(v) * n for k, v in sizes.items()}
    out = {k: int(math.floor(x + 1e-9)) for k, x in exact.items()}
    target = min(n, int(round(total_f * n)))
    # Largest remainder first; ties go to the split drawn first (stable sort).
    order = sorted(exact, key=lambda k: -(exact[k] - out[k]))
    for k in order[: max(0, target - sum(out.values()))]:
        out[k] += 1
    return out


def assign_splits(task_ids: list[str], sizes: Mapping[str, Any], *, seed: int,
                  field: str = "splits") -> dict[str, list[str]]:
    """Disjoint splits of ``task_ids`` with the given sizes, shuffled by ``seed``.
    Each split lists its ids sorted, so a split reads the same whatever the draw order."""
    ids = sorted(set(task_ids))
    counts = split_sizes(len(ids), sizes, field=field)
    _refuse_empty({k: c for k, c in counts.items()}, field=field, n=len(ids))
    perm = np.random.default_rng(derive_seed(seed, "benchmark-splits")).permutation(len(ids))
    shuffled = [ids[i] for i in perm]
    out: dict[str, list[str]] = {}
    start = 0
    for name, c in counts.items():
        out[name] = sorted(shuffled[start:start + c])
        start += c
    return out


def load_split_file(path: str | Path, known_ids: list[str]) -> dict[str, list[str]]:
    """A split file (``.json``, ``.yaml``/``.yml``): ``{split: [task_id, ...]}``. Unknown
    ids, ids in two splits, duplicates, empty splits and malformed entries are all
    reported at once, naming the file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"split_file={str(path)!r}: no such file (give a JSON/YAML file mapping split -> task ids)")
    text = p.read_text()
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 -- any parse error is reported as the file's problem
        raise ValueError(f"split_file={str(p)!r}: cannot parse ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"split_file={str(p)!r}: must map split names to lists of task ids, got {type(data).__name__}")
    known = set(known_ids)
    problems: list[str] = []
    seen: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for name, ids in data.items():
        if not isinstance(ids, list) or not all(isinstance(t, str) for t in ids):
            problems.append(f"split_file {p}: split {name!r} must be a list of task id strings")
            continue
        if not ids:
            problems.append(f"split_file {p}: split {name!r} is empty (list its tasks or drop it)")
        for t in ids:
            if t not in known:
                problems.append(f"split_file {p}: split {name!r} lists unknown task id {t!r} (not in the benchmark)")
            elif t in seen:
                where = "twice" if seen[t] == name else f"also in split {seen[t]!r}"
                problems.append(f"split_file {p}: task {t!r} in split {name!r} is {where}; a task belongs to one split")
            else:
                seen[t] = name
        out[str(name)] = list(dict.fromkeys(ids))
    if problems:
        raise ValueError("\n".join(problems))
    return out


def resolve_splits(task_ids: list[str], *, sizes: Mapping[str, Any] | None, seed: int,
                   split_file: str | Path | None) -> dict[str, list[str]]:
    """The benchmark's splits: from ``split_file`` when given (``sizes`` is then unused),
    else drawn with ``sizes`` (default :data:`DEFAULT_SPLITS`)."""
    if split_file:
        return load_split_file(split_file, task_ids)
    return assign_splits(task_ids, dict(sizes) if sizes else DEFAULT_SPLITS, seed=seed)


def _refuse_empty(counts: dict[str, int], *, field: str, n: int) -> None:
    empty = [k for k, c in counts.items() if c == 0]
    if empty:
        raise ValueError(f"{field}: split(s) {empty} would get no task out of {n}; "
                         "give them a larger share, add tasks, or drop them")
