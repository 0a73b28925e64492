"""A small slice of a benchmark for the SSR tests: the first n tasks of each split."""

from __future__ import annotations


class SliceBenchmark:
    """The first ``sizes[split]`` tasks of each split of ``bench`` (keeps tests small)."""

    def __init__(self, bench, sizes):
        self.b, self.name = bench, bench.name
        self._s = {k: bench.tasks(k)[:n] for k, n in sizes.items()}

    def splits(self):
        return {k: list(v) for k, v in self._s.items()}

    def tasks(self, split):
        return list(self._s[split])

    def task(self, task_id):
        return self.b.task(task_id)

    def executor_config(self):
        return self.b.executor_config()

    def seed_harnesses(self):
        return self.b.seed_harnesses()

    def true_quality(self, harness, split):
        return self.b.true_quality(harness, split)
