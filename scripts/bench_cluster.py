"""Benchmark the RolloutScheduler on local multi-node Ray clusters.

One ``ray.cluster_utils.Cluster`` (a head without slots or CPUs, like a cluster's
head) grows from 1 to 3 worker nodes of ``--slots`` sandbox slots each. At each size:

(a) throughput of ``--waves`` x (slots x nodes) rollouts that each sleep 1 s (an
    I/O-bound rollout: ``SleepExecutor``), against the ideal of slots x nodes
    rollouts per second, after a warm-up batch that starts the workers;
(b) the peak number of rollouts running at once on each node, from the stored start
    and finish times (never above the node's slots);
(c) at the largest size, the scheduler's overhead per rollout with ``--queued``
    (10,000) no-op rollouts queued at once: wall time / rollouts, store writes included.

Prints a markdown table; every ratio is against the ideal computed in the same run.

    RAY_TMPDIR=/tmp/ray-bench python scripts/bench_cluster.py            # 16 slots per node
    python scripts/bench_cluster.py --slots 8 --waves 5 --queued 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "execution"))

import ray  # noqa: E402

from milo_ray.execution.budget import BudgetLedger  # noqa: E402
from milo_ray.execution.cluster import join  # noqa: E402
from milo_ray.execution.scheduler import RolloutScheduler  # noqa: E402
from milo_ray.core.rollouts import RolloutRequest  # noqa: E402
from milo_ray.core.tasks import Task
from milo_ray.harness.model import Harness  # noqa: E402
from milo_ray.store import ParquetRunStore  # noqa: E402
from slot_cluster import SlotCluster, peak_per_node  # noqa: E402

HARNESS = Harness.from_source("def build_agent(model, backend):\n    return None\n", name="bench")
N_TASKS = 100


def _scheduler(root: str, run_id: str, seconds: float) -> RolloutScheduler:
    store = ParquetRunStore(os.path.join(root, run_id), run_id=run_id)
    tasks = {f"t{i}": Task(f"t{i}", "search", "bench", 3600.0, 0) for i in range(N_TASKS)}
    # Warm-up rollouts sleep 1 s whatever the executor's default, so the queue keeps
    # asking for workers until every node has one.
    tasks["warm"] = Task("warm", "search", "bench", 3600.0, 0, {"sleep_s": 1.0})
    executor = {"_target_": "milo_ray.execution.fake.SleepExecutor", "seconds": seconds, "trace": False}
    sched = RolloutScheduler(executor, tasks, store, model_id="bench", run_id=run_id, budget=BudgetLedger(),
                             progress=False)
    sched.add_harness(HARNESS)
    return sched


def _requests(n: int, offset: int = 0) -> list[RolloutRequest]:
    return [RolloutRequest(HARNESS.harness_id, f"t{i % N_TASKS}", offset + i // N_TASKS, seed=0) for i in range(n)]


def _wait_for_workers(sched: RolloutScheduler, slots: int) -> None:
    """Warm up until the scheduler's ready workers hold ``slots`` (one per node)."""
    offset = 0
    while sum(w.slots for w in sched._workers.values() if w.ready) < slots:
        sched.run([RolloutRequest(HARNESS.harness_id, "warm", offset + i, seed=0) for i in range(2 * slots)])
        offset += 2 * slots


def bench_sleeps(root: str, nodes: int, slots: int, waves: int) -> dict:
    capacity = slots * nodes
    sched = _scheduler(root, f"sleep{nodes}", 1.0)
    _wait_for_workers(sched, capacity)
    n = waves * capacity
    t0 = time.perf_counter()
    results = sched.run(_requests(n))
    wall = time.perf_counter() - t0
    rows = [{"node": r.node, "started_at": r.started_at, "finished_at": r.finished_at} for r in results]
    sched.close()
    ideal = n / capacity  # seconds at slots x nodes rollouts per second
    return {"nodes": nodes, "rollouts": n, "wall_s": wall, "throughput": n / wall, "ideal": float(capacity),
            "ratio": ideal / wall, "peaks": sorted(peak_per_node(rows).values(), reverse=True)}


def bench_overhead(root: str, capacity: int, queued: int) -> float:
    sched = _scheduler(root, "noop", 0.0)
    _wait_for_workers(sched, capacity)
    t0 = time.perf_counter()
    results = sched.run(_requests(queued))
    sched.store.flush()
    wall = time.perf_counter() - t0
    assert len(results) == queued
    sched.close()
    return wall / queued


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slots", type=int, default=16, help="sandbox slots per worker node")
    p.add_argument("--waves", type=int, default=8, help="rollouts per slot in the timed batch")
    p.add_argument("--max-nodes", type=int, default=3)
    p.add_argument("--queued", type=int, default=10_000, help="no-op rollouts queued at once for the overhead")
    args = p.parse_args()

    cluster = SlotCluster(workers=1, slots=args.slots)
    join(cluster.address, configure_logging=False)
    rows = []
    overhead = None
    with tempfile.TemporaryDirectory() as root:
        for nodes in range(1, args.max_nodes + 1):
            if nodes > 1:
                cluster.restore(nodes)
            rows.append(bench_sleeps(root, nodes, args.slots, args.waves))
            print(f"[bench_cluster] {nodes} node(s): {rows[-1]['ratio']:.1%} of ideal", file=sys.stderr, flush=True)
        if args.queued:
            overhead = bench_overhead(root, args.slots * args.max_nodes, args.queued)
    ray.shutdown()
    cluster.shutdown()

    print(f"\n1-second rollouts, {args.slots} slots per worker node, {args.waves} rollouts per slot "
          f"(`python scripts/bench_cluster.py --slots {args.slots} --waves {args.waves}`)\n")
    print("| worker nodes | rollouts | wall s | rollouts/s | ideal/s | of ideal | peak running per node |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['rollouts']} | {r['wall_s']:.2f} | {r['throughput']:.1f} | {r['ideal']:.0f} | "
              f"{r['ratio']:.1%} | {', '.join(map(str, r['peaks']))} (of {args.slots}) |")
    if overhead is not None:
        print(f"\nScheduler overhead at {args.queued:,} queued no-op rollouts on {args.max_nodes} nodes: "
              f"{overhead * 1e3:.3f} ms per rollout (store writes included)")


if __name__ == "__main__":
    main()
