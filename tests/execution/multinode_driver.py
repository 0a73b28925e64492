"""A driver for the multi-node tests (tests/execution/test_multinode.py): joins the
cluster at ADDRESS, runs sleeping rollouts through a RolloutScheduler and prints JSON
lines of what it observed (the last line is the summary).

    python multinode_driver.py sleep ADDRESS --n 24 --seconds 0.5 [--announce 4] ...
    python multinode_driver.py undeclared ADDRESS

``--barrier`` prints ``{"ready": true}`` once connected and waits for a line on stdin
before it submits anything (so concurrent drivers start together). ``--announce K`` prints ``{"running": K}`` once K rollouts are in flight, then waits for a
line on stdin before it goes on (the test changes the cluster in between).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time

import ray

from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.tasks import Task
from milo_ray.execution.cluster import SLOT_RESOURCE, join
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.harness.model import Harness
from milo_ray.store import MemoryRunStore

H = Harness.from_source("def build_agent(model, backend):\n    return 'multinode'\n")


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def autoscaler_report() -> dict:
    """What Ray's monitor last reported for the autoscaler (its load metrics included)."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get("__autoscaling_status")
    return json.loads(raw) if raw else {}


def slot_demand() -> float:
    """Sandbox slots the cluster's pending work asks for, as the GCS reports it to the
    autoscaler (its load metrics), summed over the waiting resource shapes."""
    demand = autoscaler_report().get("load_metrics_report", {}).get("resource_demand") or []
    return sum(shape.get(SLOT_RESOURCE, 0.0) * count for shape, count in demand)


def slotted_nodes() -> int:
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get(SLOT_RESOURCE, 0) >= 1)


def scheduler(args, store) -> RolloutScheduler:
    tasks = [Task("sleep", "search", "x", 60.0, 1000, {"sleep_s": args.seconds})]
    s = RolloutScheduler({"_target_": "milo_ray.execution.fake.SleepExecutor"}, tasks, store, model_id="m",
                         run_id=store.run_id, progress=False, slot_resource=args.slot_resource,
                         slots_per_worker=args.slots_per_worker, max_workers=args.max_workers, worker_idle_s=args.idle, max_retries=3,
                         retry_backoff_s=0.05)
    s.add_harness(H)
    return s


async def sleep_mode(args) -> dict:
    store = MemoryRunStore(run_id=args.run_id)
    sched = scheduler(args, store)
    slotted_at_start = slotted_nodes()
    seen = [slotted_at_start]

    async def watch_nodes() -> None:
        while True:
            seen.append(slotted_nodes())
            await asyncio.sleep(0.5)

    watcher = asyncio.ensure_future(watch_nodes())
    requests = [RolloutRequest(H.harness_id, "sleep", i, seed=args.seed) for i in range(args.n)]
    if args.barrier:
        # Connected: wait until the test lets every driver start at once.
        emit({"ready": True})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    run = asyncio.ensure_future(sched.arun(requests))
    demand = 0.0
    if args.announce:
        while sched.progress.running < args.announce and not run.done():
            await asyncio.sleep(0.02)
        # The demand the autoscaler would act on while rollouts wait for slots. Ray's
        # monitor publishes its load metrics every few seconds (AUTOSCALER_UPDATE_INTERVAL_S,
        # 5 s), later on a loaded machine, so the queue must outlast a few of its rounds.
        for _ in range(200):
            demand = max(demand, slot_demand())
            if demand:
                break
            await asyncio.sleep(0.1)
        early = None
        if run.done():
            early = repr(run.exception()) if run.exception() else f"finished before {args.announce} rollouts were in flight"
        emit({"running": sched.progress.running, "demand": demand, "ended_early": early})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    results = await run
    done_at = time.time()
    released_after = None
    if args.wait_release:
        # Idle workers give their slots back after worker_idle_s.
        total = ray.cluster_resources().get(SLOT_RESOURCE, 0.0)
        while time.time() - done_at < args.idle + 30:
            if not sched._workers and ray.available_resources().get(SLOT_RESOURCE, 0.0) >= total:
                released_after = time.time() - done_at
                break
            await asyncio.sleep(0.1)
    idle_reported_after = None
    if args.wait_idle_report:
        # The autoscaler's load metrics once the workers are gone: no slot used, none asked for.
        while time.time() - done_at < 120:
            usage = autoscaler_report().get("load_metrics_report", {}).get("usage", {}).get(SLOT_RESOURCE)
            if usage and usage[0] == 0 and slot_demand() == 0:
                idle_reported_after = time.time() - done_at
                break
            await asyncio.sleep(0.5)
    watcher.cancel()
    events = collections.Counter(e["kind"] for e in store.read("events").to_pylist())
    rows = [{"node": r.node, "started_at": r.started_at, "finished_at": r.finished_at, "cache_key": r.cache_key,
             "attempts": r.attempts, "error_kind": r.error_kind} for r in results]
    sched.close()
    return {"rows": rows, "events": events, "released_after": released_after, "demand": demand,
            "slotted_at_start": slotted_at_start, "slotted_seen": max(seen), "idle_reported_after": idle_reported_after,
            "nodes": {n["NodeID"][:8]: n["Resources"].get(SLOT_RESOURCE, 0.0) for n in ray.nodes() if n["Alive"]}}


def undeclared_mode(args) -> dict:
    store = MemoryRunStore(run_id="undeclared")
    args.slot_resource, args.seconds = "no_node_declares_this", 0.0
    sched = scheduler(args, store)
    try:
        sched.run([RolloutRequest(H.harness_id, "sleep", 0, seed=1)])
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        sched.close()
    return {"error": None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["sleep", "undeclared"])
    p.add_argument("address")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-id", default="multinode")
    p.add_argument("--slot-resource", default=SLOT_RESOURCE)
    p.add_argument("--slots-per-worker", type=int, default=None)
    p.add_argument("--max-workers", type=int, default=None)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--announce", type=int, default=0)
    p.add_argument("--wait-release", action="store_true")
    p.add_argument("--barrier", action="store_true")
    p.add_argument("--wait-idle-report", action="store_true")
    args = p.parse_args()
    join(args.address, configure_logging=False)
    out = asyncio.run(sleep_mode(args)) if args.mode == "sleep" else undeclared_mode(args)
    emit(out)
    ray.shutdown()


if __name__ == "__main__":
    main()
