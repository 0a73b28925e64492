"""PaperBench (``benchmark=paperbench``): papers replicated by an agent and graded against
their rubric trees by the grader role (:mod:`.benchmark`, :mod:`.rubric`, :mod:`.judge`)."""

from milo_ray.benchmarks.paperbench.benchmark import PAPERBENCH, PaperBenchBenchmark, PaperBenchFormat

__all__ = ["PAPERBENCH", "PaperBenchBenchmark", "PaperBenchFormat"]
