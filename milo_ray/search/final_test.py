"""The end of every method: the benchmark's ground truth of a harness (when it has
one) and the final test of the chosen harnesses.

The final test is outside the search budget: it runs on the run's scheduler (same
store, same cache) with ``count_budget=False``, so it is neither refused by nor
charged to the search's ledger, and a run that stopped on its budget still reports
its incumbent's test score. The test split never informs a search decision.

Its rollouts are drawn fresh: they carry :func:`~milo_ray.core.seeds.final_test_seed`,
so none has the cache key of a rollout the search ran, and the draws that made a
harness win are never reused as its test result. Where the test split holds tasks the
search also ran (the papers' "full benchmark"), each tested harness gets a second row
over the *held-out* tasks alone: the test tasks no search rollout ran.
"""

from __future__ import annotations

from typing import Any, Sequence

from milo_ray.benchmarks.base import GroundTruth
from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.seeds import final_test_seed
from milo_ray.harness.model import Harness
from milo_ray.search.plugin import final_test_record
from milo_ray.search.scores import HarnessScore, summarize


def true_quality(benchmark: Any, harness: Harness, split: str) -> dict[str, float] | None:
    """The benchmark's exact expected quality of ``harness`` on ``split`` (a dict with
    at least ``score``), or None when the benchmark has no ground truth (real tasks)."""
    if isinstance(benchmark, GroundTruth):
        return {k: float(v) for k, v in benchmark.true_quality(harness, split).items()}
    return None


def true_score(benchmark: Any, harness: Harness, split: str) -> float | None:
    tq = true_quality(benchmark, harness, split)
    return None if tq is None else tq["score"]


def test_requests(harness: Harness, task_ids: Sequence[str], k: int, *, seed: int, split: str, method: str,
                  round: int, stage: str, group: str) -> list[RolloutRequest]:
    return [RolloutRequest(harness.harness_id, t, i, seed, split=split, method=method, round=round, stage=stage,
                           group=group) for t in task_ids for i in range(k)]


def searched_tasks(store: Any) -> set[str]:
    """Every task the run's search ran a rollout on: the tasks of its budgeted rollouts
    (the final test is the only batch a run runs outside its budget). Empty without a
    store. The read side's rule is the same (:func:`milo_ray.results.held_out_tasks`)."""
    if store is None:
        return set()
    rows = store.read("rollouts").select(["task_id", "budgeted"]).to_pydict()
    return {t for t, budgeted in zip(rows["task_id"], rows["budgeted"]) if budgeted is not False}


class FinalTest:
    """Tests labelled harnesses on one split with k fresh rollouts per task.

    ``rows(...)`` (sync) and ``arows(...)`` (for asyncio drivers) give one
    :class:`HarnessScore` per harness, in order, named by its label, over every task of
    the split; ``held_out`` collects the same harnesses' rows over :attr:`held_out_ids`
    when the search ran some of the split's tasks (else the rows above are held out
    already and it stays empty). ``record()`` is what the run stores in its summary so the
    read side finds exactly these rollouts. ``seed``: the run seed (the test's own is
    derived from it)."""

    def __init__(self, scheduler: Any, benchmark: Any, *, split: str, k: int, seed: int, method: str,
                 stage: str = "final", group: str = "final") -> None:
        if int(k) < 1:
            raise ValueError(f"final test: k={k} rollouts per task; need at least 1")
        self.scheduler, self.benchmark = scheduler, benchmark
        self.split, self.k, self.method, self.stage, self.group = split, int(k), method, stage, group
        self.seed = final_test_seed(seed)
        self.task_ids = [t.task_id for t in benchmark.tasks(split)]
        searched = searched_tasks(getattr(scheduler, "store", None))
        self.held_out_ids = [t for t in self.task_ids if t not in searched]
        self.held_out: list[HarnessScore] = []
        self._used: list = []  # every result the test used, for record()

    def _requests(self, h: Harness, round: int) -> list[RolloutRequest]:
        self.scheduler.add_harness(h)
        return test_requests(h, self.task_ids, self.k, seed=self.seed, split=self.split, method=self.method,
                             round=round, stage=self.stage, group=self.group)

    def _row(self, label: str, h: Harness, results: list) -> HarnessScore:
        self._used += results
        truth = true_score(self.benchmark, h, self.split)
        if self.held_out_ids and len(self.held_out_ids) < len(self.task_ids):
            # No ground truth here: the benchmark's is of a whole split, not of a subset.
            held = set(self.held_out_ids)
            self.held_out.append(summarize(label, h, [r for r in results if r.task_id in held], self.held_out_ids,
                                           self.k))
        return summarize(label, h, results, self.task_ids, self.k, true_score=truth)

    def rows(self, harnesses: Sequence[tuple[str, Harness]], *, round: int = 0) -> list[HarnessScore]:
        if not self.task_ids:
            return []
        return [self._row(label, h, self.scheduler.run(self._requests(h, round), count_budget=False))
                for label, h in harnesses]

    def record(self) -> dict[str, Any]:
        """The summary entry (``summary[SPEC_KEY]``) of the tests run so far: split, k,
        task ids and the cache keys of the rollouts they used."""
        return final_test_record(self.split, self.k, self.task_ids, self._used, held_out=self.held_out_ids)

    async def arows(self, harnesses: Sequence[tuple[str, Harness]], *, round: int = 0) -> list[HarnessScore]:
        if not self.task_ids:
            return []
        return [self._row(label, h, await self.scheduler.arun(self._requests(h, round), count_budget=False))
                for label, h in harnesses]
