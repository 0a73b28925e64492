"""The instance-level track (MILO App. E): EinsteinArena problems whose artifact is an
optimizer program. :mod:`.problems` scores and rewards constructions, :mod:`.starts`
rebuilds a task's starting construction from its metadata, :mod:`.benchmark` turns
(problem, start) pairs into tasks (:class:`EinsteinBenchmark`)."""

from typing import Any

from milo_ray.benchmarks.einstein.problems import ANCHORS, PROBLEMS, check, reward, score
from milo_ray.benchmarks.einstein.starts import refine, start_values

__all__ = ["ANCHORS", "PROBLEMS", "EinsteinBenchmark", "check", "refine", "reward", "score", "start_values"]


def __getattr__(name: str) -> Any:
    # Imported on first use: workers that only rebuild starts and score points (the
    # optimizer executor) need not load the benchmark's task and harness machinery.
    if name == "EinsteinBenchmark":
        from milo_ray.benchmarks.einstein.benchmark import EinsteinBenchmark

        return EinsteinBenchmark
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
