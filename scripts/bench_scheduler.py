"""Benchmark the RolloutScheduler on a local Ray instance.

(a) scheduler + Parquet store overhead per rollout: N no-op rollouts (the executor
    returns at once, no trace), amortised wall time per rollout after a warm-up batch
    that starts the worker;
(b) M rollouts that each sleep S seconds on K slots: wall time vs the ideal M*S/K;
(c) the same M sleeps through a plain ``ThreadPoolExecutor(K)`` as the baseline.

    python scripts/bench_scheduler.py                 # 10,000 no-ops; 400 x 1 s on 64 slots
    python scripts/bench_scheduler.py --noop 2000 --sleeps 128
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import ray

from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.tasks import Task
from milo_ray.execution.budget import BudgetLedger
from milo_ray.execution.cluster import start_local
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.harness.model import Harness
from milo_ray.store import ParquetRunStore

HARNESS = Harness.from_source("def build_agent(model, backend):\n    return None\n", name="bench")


def _scheduler(root: str, run_id: str, seconds: float, n_tasks: int) -> RolloutScheduler:
    store = ParquetRunStore(os.path.join(root, run_id), run_id=run_id)
    tasks = {f"t{i}": Task(f"t{i}", "search", "bench", 3600.0, 0) for i in range(n_tasks)}
    executor = {"_target_": "milo_ray.execution.fake.SleepExecutor", "seconds": seconds, "trace": False}
    sched = RolloutScheduler(executor, tasks, store, model_id="bench", run_id=run_id, budget=BudgetLedger(), progress=False)
    sched.add_harness(HARNESS)
    return sched


def _requests(n: int, n_tasks: int, offset: int = 0) -> list[RolloutRequest]:
    return [RolloutRequest(HARNESS.harness_id, f"t{i % n_tasks}", offset + i // n_tasks, seed=0) for i in range(n)]


def bench_noop(root: str, n: int) -> tuple[float, float]:
    sched = _scheduler(root, "noop", 0.0, 100)
    t0 = time.perf_counter()
    sched.run(_requests(200, 100, offset=10_000_000))  # starts the worker, warms caches
    startup = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = sched.run(_requests(n, 100))
    sched.store.flush()
    wall = time.perf_counter() - t0
    assert len(results) == n and sched.store.read("rollouts").num_rows == n + 200
    sched.close()
    sched.store.close()
    return wall, startup


def bench_sleeps(root: str, n: int, seconds: float) -> float:
    sched = _scheduler(root, "sleeps", seconds, n)
    sched.run(_requests(1, 1, offset=10_000_000))  # start the worker outside the timing
    t0 = time.perf_counter()
    results = sched.run(_requests(n, n))
    wall = time.perf_counter() - t0
    assert all(r.error_kind is None for r in results)
    sched.close()
    sched.store.close()
    return wall


def bench_threads(n: int, seconds: float, slots: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(slots) as pool:
        list(pool.map(lambda _: time.sleep(seconds), range(n)))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--noop", type=int, default=10_000, help="no-op rollouts for the overhead run")
    ap.add_argument("--sleeps", type=int, default=400, help="sleeping rollouts for the concurrency run")
    ap.add_argument("--sleep-s", type=float, default=1.0, help="seconds each sleeping rollout takes")
    ap.add_argument("--slots", type=int, default=64, help="sandbox slots on the (single) local node")
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()

    start_local(num_cpus=args.num_cpus, slots=args.slots, configure_logging=False)
    with tempfile.TemporaryDirectory(prefix="bench_scheduler_") as root:
        noop_wall, startup = bench_noop(root, args.noop)
        sleep_wall = bench_sleeps(root, args.sleeps, args.sleep_s)
    thread_wall = bench_threads(args.sleeps, args.sleep_s, args.slots)
    ray.shutdown()

    ideal = args.sleeps * args.sleep_s / args.slots
    waves = math.ceil(args.sleeps / args.slots) * args.sleep_s
    per_ms = 1e3 * noop_wall / args.noop
    rows = [
        ("(a) no-op overhead", f"{args.noop} rollouts, Parquet store", f"{noop_wall:.2f} s",
         f"{per_ms:.3f} ms/rollout", "< 2 ms", "ok" if per_ms < 2 else "MISS"),
        ("(b) scheduler sleeps", f"{args.sleeps} x {args.sleep_s:g} s, {args.slots} slots", f"{sleep_wall:.2f} s",
         f"{sleep_wall / ideal:.3f} x ideal {ideal:.2f} s ({sleep_wall / waves:.3f} x {waves:g} s waves)",
         "< 1.15 x ideal", "ok" if sleep_wall < 1.15 * ideal else "MISS"),
        ("(c) thread pool", f"ThreadPoolExecutor({args.slots})", f"{thread_wall:.2f} s",
         f"scheduler / threads = {sleep_wall / thread_wall:.3f}", "", ""),
    ]
    headers = ("benchmark", "workload", "wall", "result", "target", "")
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    line = "  ".join("{:<%d}" % w for w in widths)
    print(line.format(*headers))
    print(line.format(*("-" * w for w in widths)))
    for r in rows:
        print(line.format(*r))
    print(f"(worker start + 200 warm-up no-ops: {startup:.2f} s, not counted; {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
