"""The surrogate through the real scheduler and store: what is recorded for a seed does
not depend on how many rollouts run at once or in which order they finish."""

from __future__ import annotations

from milo_ray.benchmarks.surrogate import SurrogateBenchmark
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.execution.types import RolloutRequest
from milo_ray.store import MemoryRunStore

COLUMNS = ("cache_key", "harness_id", "task_id", "rollout_idx", "score", "input_tokens", "output_tokens",
           "latency_s", "timed_out", "error_kind")


def _rollout_table(bench: SurrogateBenchmark, slots: int, group_limit: int, reverse: bool) -> list[tuple]:
    store = MemoryRunStore(run_id="determinism")
    tasks = bench.tasks("search")[:12]
    seeds = bench.seed_harnesses()[:3]
    sched = RolloutScheduler(bench.executor_config(), {t.task_id: t for t in tasks}, store, "offline-surrogate",
                             "determinism", slots_per_node=slots, default_group_limit=group_limit, progress=False)
    try:
        for h in seeds:
            sched.add_harness(h)
        requests = [RolloutRequest(h.harness_id, t.task_id, i, seed=7, split="search", group=h.name)
                    for h in seeds for t in tasks for i in range(2)]
        sched.run(list(reversed(requests)) if reverse else requests)
    finally:
        sched.close()
    rows = store.read("rollouts").select(list(COLUMNS)).to_pylist()
    return sorted(tuple(r[c] for c in COLUMNS) for r in rows)


def test_same_seed_different_worker_counts_give_identical_rollout_tables(ray_local):
    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=3)
    one_at_a_time = _rollout_table(bench, slots=1, group_limit=1, reverse=False)
    wide = _rollout_table(bench, slots=16, group_limit=16, reverse=True)
    assert len(one_at_a_time) == 3 * 12 * 2
    assert one_at_a_time == wide
