"""The surrogate through the real scheduler and store: what is recorded for a seed does
not depend on how many rollouts run at once or in which order they finish."""

from __future__ import annotations

from collections import Counter

from milo_ray.benchmarks.surrogate import SurrogateBenchmark
from milo_ray.core.rollouts import RolloutRequest
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.store import MemoryRunStore

COLUMNS = ("cache_key", "harness_id", "task_id", "rollout_idx", "score", "input_tokens", "output_tokens",
           "latency_s", "timed_out", "error_kind")

# The session's Ray instance declares 8 ``sandbox_slot`` per node, and a declared slot
# resource overrides ``slots_per_node``. Pointing the scheduler at a resource no node
# declares makes ``slots_per_node`` the node's slot count, so the knob under test is
# the one that decides how many rollouts run at once.
UNDECLARED_SLOT_RESOURCE = "slot_resource_no_node_declares"


class InFlightProbe(RolloutScheduler):
    """Records, at every dispatch, how many rollouts are in flight in total and per group.

    ``_send`` is called right after the jobs it carries were counted as in flight, so
    the highest values seen there are the real concurrency the dispatcher allowed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_in_flight = 0
        self.max_in_flight_per_group: Counter[str] = Counter()

    def _send(self, node, jobs):
        self.max_in_flight = max(self.max_in_flight, sum(len(w.inflight) for w in self._workers.values()))
        for group, running in self._dispatch.in_flight_by_group().items():
            self.max_in_flight_per_group[group] = max(self.max_in_flight_per_group[group], running)
        super()._send(node, jobs)


def _rollout_table(bench: SurrogateBenchmark, slots: int, group_limit: int | None,
                   reverse: bool) -> tuple[list[tuple], InFlightProbe]:
    store = MemoryRunStore(run_id="determinism")
    tasks = bench.tasks("search")[:12]
    seeds = bench.seed_harnesses()[:3]
    sched = InFlightProbe(bench.executor_config(), {t.task_id: t for t in tasks}, store, "offline-surrogate",
                          "determinism", slots_per_node=slots, default_group_limit=group_limit, progress=False,
                          slot_resource=UNDECLARED_SLOT_RESOURCE)
    try:
        for h in seeds:
            sched.add_harness(h)
        requests = [RolloutRequest(h.harness_id, t.task_id, i, seed=7, split="search", group=h.name)
                    for h in seeds for t in tasks for i in range(2)]
        sched.run(list(reversed(requests)) if reverse else requests)
    finally:
        sched.close()
    rows = store.read("rollouts").select(list(COLUMNS)).to_pylist()
    return sorted(tuple(r[c] for c in COLUMNS) for r in rows), sched


def test_same_seed_different_worker_counts_give_identical_rollout_tables(ray_local):
    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=3)
    one_at_a_time, serial = _rollout_table(bench, slots=1, group_limit=None, reverse=False)
    wide, parallel = _rollout_table(bench, slots=16, group_limit=None, reverse=True)
    grouped, capped = _rollout_table(bench, slots=16, group_limit=2, reverse=False)
    # The three runs really ran at different concurrency (otherwise the equality below
    # would prove nothing): one slot means one rollout at a time; 72 requests queued at
    # once fill all 16 slots; a group cap of 2 over the 3 seed groups allows 6.
    assert serial.max_in_flight == 1
    assert parallel.max_in_flight == 16
    assert capped.max_in_flight == 6
    assert set(capped.max_in_flight_per_group.values()) == {2}
    assert len(one_at_a_time) == 3 * 12 * 2
    assert one_at_a_time == wide == grouped
