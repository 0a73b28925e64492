"""Run by test_multinode_scheduler.py in a fresh process (it needs its own Ray cluster,
separate from the session's local instance): a simulated 3-node cluster where two
nodes carry sandbox slots; prints one JSON line of observations."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys

import ray
from ray.cluster_utils import Cluster

sys.path.insert(0, os.path.dirname(__file__))
from test_rollout_scheduler import _req, _scheduler  # noqa: E402

from milo_ray.execution.cluster import join  # noqa: E402
from milo_ray.store import MemoryRunStore  # noqa: E402


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"sandbox_slot": 4})
    doomed = cluster.add_node(num_cpus=1, resources={"sandbox_slot": 4})
    join(cluster.address, configure_logging=False)
    cluster.wait_for_nodes()
    store = MemoryRunStore(run_id="multinode")
    sched = _scheduler(store, max_retries=3, retry_backoff_s=0.05)
    spread = sched.run([_req("mid", i) for i in range(16)])
    doomed_label = next(label for label in sched.worker_actors() if doomed.node_id.startswith(label.split(":")[-1]))

    async def lose_a_node():
        run = asyncio.ensure_future(sched.arun([_req("slow", i) for i in range(16)]))
        while sched.progress.running < 8:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        cluster.remove_node(doomed)
        return await run

    after = asyncio.run(lose_a_node())
    print(json.dumps({
        "spread": collections.Counter(r.node for r in spread),
        "doomed": doomed_label,
        "after_nodes": collections.Counter(r.node for r in after),
        "after_errors": [r.error_kind for r in after],
        "retried": sum(r.attempts > 1 for r in after),
        "retries": sum(r.attempts - 1 for r in after),
        "events": collections.Counter(e["kind"] for e in store.read("events").to_pylist()),
    }))
    sched.close()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
