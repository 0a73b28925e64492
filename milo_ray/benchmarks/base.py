"""The benchmark contract: task splits, grading data, seed harnesses.

Methods see tasks only through this interface, so the surrogate, Harbor task
directories, SWE-style JSONL sets and the math track are interchangeable. How a
harness runs on a task is not the benchmark's business: the ``executor`` config group
chooses the executor (and gives it the model), so one benchmark can run under several.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from milo_ray.core.tasks import Task
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import SEED_NAMES, resolve_seed


class BenchmarkDataMissing(Exception):
    """Raised when a benchmark's data is absent; the entry point turns it into a one-line error."""


@runtime_checkable
class Benchmark(Protocol):
    name: str

    def splits(self) -> dict[str, list[Task]]:
        """Every split by name (e.g. train/val/test or search/val/test), in a fixed order."""
        ...

    def tasks(self, split: str) -> list[Task]: ...

    def task(self, task_id: str) -> Task: ...

    def seed_harnesses(self) -> list[Harness]: ...


class SplitTasks:
    """The split accessors every benchmark shares, over ``self._splits`` (split name ->
    tasks, in order) and ``self._by_id`` (task id -> task) that the benchmark fills."""

    name: str
    _splits: dict[str, list[Task]]
    _by_id: dict[str, Task]

    def splits(self) -> dict[str, list[Task]]:
        return {k: list(v) for k, v in self._splits.items()}

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"split {split!r}: {self.name} has {list(self._splits)}")
        return list(self._splits[split])

    def task(self, task_id: str) -> Task:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise ValueError(f"task_id {task_id!r}: not in any split of {self.name}") from None

    def drop_tasks(self, task_ids: set[str]) -> None:
        """Remove ``task_ids`` from every split (``run.skip_unrunnable_tasks``: tasks the
        sandbox cannot run); the other tasks keep their splits and order."""
        self._splits = {k: [t for t in v if t.task_id not in task_ids] for k, v in self._splits.items()}
        self._by_id = {k: t for k, t in self._by_id.items() if k not in task_ids}


def seed_names(seeds: Any, field: str = "benchmark.seeds") -> list[str] | None:
    """The configured seed harnesses (None: all five bundled ones), checked now rather than
    at the first ``seed_harnesses()`` call. Each entry is a bundled seed's name or the path
    of a harness directory of the user's own (holding ``harness.py``; a relative path is
    taken from the working directory and stored absolute). ``ValueError`` names ``field``,
    the bad entry and the fix. The harness itself is validated before the run starts
    (``milo_ray.config.validate.check_seed_harnesses``)."""

    if not seeds:
        return None
    if isinstance(seeds, str):
        raise ValueError(f"{field}={seeds!r}: must be a list of seed names or harness directory paths, "
                         f"e.g. {field}='[minimal,./my_harness]'")
    out: list[str] = []
    for entry in seeds:
        try:
            out.append(resolve_seed(str(entry)))
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}; give a bundled seed ({', '.join(SEED_NAMES)}) or the path of a "
                             "directory holding your harness.py") from None
    names = [n.rsplit("/", 1)[-1] for n in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{field}: two seed harnesses are named {dup} (a harness directory is named after its "
                         "last path component); rename one of the directories")
    return out


@runtime_checkable
class GroundTruth(Protocol):
    """Benchmarks with known ground truth (the surrogate) also expose this."""

    def true_quality(self, harness: Harness, split: str) -> dict[str, float]:
        """Exact expected {'score', 'output_tokens', 'seconds'} of a harness on a split."""
        ...


def resolve_split(benchmark: Benchmark, requested: str | None, *, field: str, fallbacks: tuple[str, ...] = ()) -> str:
    """The split a method asked for (``requested``), or the first of ``fallbacks`` the
    benchmark has when it asked for none. ``ValueError`` names the field, the splits the
    benchmark has and the fix, so a method/benchmark mismatch is refused before a run
    writes anything."""
    names = list(benchmark.splits())
    if requested:
        if requested not in names:
            raise ValueError(f"{field}={requested!r}: benchmark {benchmark.name} has no such split; "
                             f"it has {names} (set {field} to one of them)")
        return requested
    for name in fallbacks:
        if name in names:
            return name
    raise ValueError(f"{field}: benchmark {benchmark.name} has none of the splits {list(fallbacks)}; "
                     f"it has {names} (set {field} to one of them)")
