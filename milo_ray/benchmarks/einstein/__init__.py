"""The instance-level track (MILO App. E): EinsteinArena problems whose artifact is an
optimizer program. :mod:`.problems` scores and rewards constructions, :mod:`.starts`
rebuilds a task's starting construction from its metadata."""

from milo_ray.benchmarks.einstein.problems import ANCHORS, PROBLEMS, check, reward, score
from milo_ray.benchmarks.einstein.starts import refine, start_values

__all__ = ["ANCHORS", "PROBLEMS", "check", "refine", "reward", "score", "start_values"]
