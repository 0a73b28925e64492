"""The per-node rollout worker: an async Ray actor running rollouts as coroutines.

One :class:`RolloutWorker` actor lives on each node that has sandbox slots. It builds
the executor once from config, caches harnesses (by ``harness_id``) and tasks (by
``task_id``) that the driver ships to it once, and runs up to ``slots`` rollouts at a
time as asyncio tasks in its event loop. A rollout is I/O-bound (model calls,
sandbox commands), so one process per node serves all its slots; a Ray task per
rollout would cost a worker process per concurrent rollout.

The protocol with the driver is two calls, both batched so the per-call cost is
amortised over many rollouts:

* ``submit(items, harness_refs, tasks)`` starts a batch and returns at once;
* ``poll(max_wait_s)`` returns every outcome finished since the last poll, waiting
  up to ``max_wait_s`` for the first one (a long poll, so results stream back as
  they finish without a batch barrier).

Per-rollout time caps are enforced here, next to the rollout: past
``task.time_cap_s * time_cap_grace`` the coroutine is cancelled and the outcome is
marked as capped. An executor that raises is reported as an infrastructure failure
(the driver decides about retries). The actor is a thin shell around
:class:`WorkerCore`, which is plain asyncio and testable without Ray.

The driver-side half of a worker's life is here too: :func:`discover_nodes` decides
which nodes host one and with how many slots, :func:`start_worker` pins a worker to its
node (``NodeAffinitySchedulingStrategy``) and waits until it has built its executor.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from milo_ray.execution.types import RolloutResult, Task

log = logging.getLogger(__name__)

SLOT_RESOURCE = "sandbox_slot"
# Actor calls beyond the rollout slots: submit/poll/ready must never queue behind rollouts.
_CONTROL_CALLS = 4
_WORKER_START_TIMEOUT_S = 120.0

# (item_id, harness_id, task_id, rollout_idx, seed): what the driver sends per rollout.
Item = tuple[int, str, str, int, int]


@dataclass
class Outcome:
    """What one attempt of one rollout produced, as seen by the worker.

    Exactly one of ``result`` / ``infra_error`` / ``capped`` describes it:
    a result returned by the executor, an exception it raised, or the time cap.
    """

    item_id: int
    result: RolloutResult | None
    infra_error: str | None
    capped: bool
    started_at: float
    finished_at: float


def build_executor(executor_config: Any) -> Any:
    """Instantiate an executor from a ``_target_`` mapping (dict or DictConfig);
    an already-built executor object is used as is."""
    if isinstance(executor_config, Mapping) or type(executor_config).__name__ == "DictConfig":
        from hydra.utils import instantiate

        executor = instantiate(executor_config)
    else:
        executor = executor_config
    if not callable(getattr(executor, "execute", None)) and not callable(getattr(executor, "aexecute", None)):
        raise TypeError(
            f"executor_config built {type(executor).__name__!r}, which has neither execute() nor aexecute(); "
            "point _target_ at an Executor (milo_ray.execution.types.Executor)"
        )
    return executor


class WorkerCore:
    """Runs rollouts concurrently on one event loop; holds the node's caches."""

    def __init__(self, executor_config: Any, slots: int, time_cap_grace: float) -> None:
        if slots < 1:
            raise ValueError(f"WorkerCore: slots={slots} must be >= 1")
        self.executor = build_executor(executor_config)
        aexecute = getattr(self.executor, "aexecute", None)
        self._aexecute = aexecute if callable(aexecute) else None
        self.slots = slots
        self.time_cap_grace = float(time_cap_grace)
        # A blocking execute() runs on these threads so it cannot stall the loop. Twice
        # the slots: a thread whose rollout hit the time cap cannot be interrupted and
        # keeps its thread until the blocking call returns.
        self._threads: ThreadPoolExecutor | None = None
        self.harnesses: dict[str, Any] = {}
        self.tasks: dict[str, Task] = {}
        self._sem: asyncio.Semaphore | None = None
        self._wake: asyncio.Event | None = None
        self._done: list[Outcome] = []
        self._running: set[asyncio.Task] = set()

    def _loop_state(self) -> None:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)
            self._wake = asyncio.Event()

    async def submit(self, items: list[Item], harness_refs: dict[str, Any], tasks: dict[str, Task]) -> int:
        self._loop_state()
        for hid, ref in harness_refs.items():
            if hid not in self.harnesses:
                self.harnesses[hid] = (await ref) if isinstance(ref, ray.ObjectRef) else ref
        self.tasks.update(tasks)
        for item in items:
            t = asyncio.create_task(self._run(item))
            self._running.add(t)
            t.add_done_callback(self._running.discard)
        return len(self._running)

    async def _call(self, harness: Any, task: Task, rollout_idx: int, seed: int) -> Any:
        if self._aexecute is not None:
            return await self._aexecute(harness, task, rollout_idx, seed)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=2 * self.slots, thread_name_prefix="rollout")
        fn = functools.partial(self.executor.execute, harness, task, rollout_idx, seed)
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

    async def _run(self, item: Item) -> None:
        item_id, harness_id, task_id, rollout_idx, seed = item
        assert self._sem is not None and self._wake is not None
        async with self._sem:
            started = time.time()
            result: RolloutResult | None = None
            infra_error: str | None = None
            capped = False
            try:
                harness = self.harnesses[harness_id]
                task = self.tasks[task_id]
                cap = task.time_cap_s * self.time_cap_grace
                job = asyncio.ensure_future(self._call(harness, task, rollout_idx, seed))
                # asyncio.wait (not wait_for) so a TimeoutError raised *by the executor*
                # is an infrastructure failure, not mistaken for the cap.
                done, _ = await asyncio.wait({job}, timeout=cap if 0 < cap < math.inf else None)
                if not done:
                    job.cancel()
                    capped = True
                else:
                    value = job.result()
                    if not isinstance(value, RolloutResult):
                        raise TypeError(f"executor returned {type(value).__name__}, expected RolloutResult")
                    result = value
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the executor raising = infrastructure failure
                infra_error = f"{type(exc).__name__}: {exc}"
            finished = time.time()
        self._done.append(Outcome(item_id, result, infra_error, capped, started, finished))
        self._wake.set()

    async def poll(self, max_wait_s: float) -> list[Outcome]:
        self._loop_state()
        assert self._wake is not None
        if not self._done:
            try:
                await asyncio.wait_for(self._wake.wait(), max_wait_s)
            except asyncio.TimeoutError:
                pass
        out, self._done = self._done, []
        self._wake.clear()
        return out

    def in_flight(self) -> int:
        return len(self._running)


class _RolloutWorkerShell:
    """Ray actor shell around :class:`WorkerCore` (construction errors are reported by
    ``ready()`` instead of killing the actor, so the driver can name the bad config)."""

    def __init__(self, executor_config: Any, slots: int, time_cap_grace: float) -> None:
        self.core: WorkerCore | None = None
        self.error: str | None = None
        try:
            self.core = WorkerCore(executor_config, slots, time_cap_grace)
        except Exception:
            self.error = traceback.format_exc()

    async def ready(self) -> dict[str, Any]:
        return {"error": self.error, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def submit(self, items: list[Item], harness_refs: dict[str, Any], tasks: dict[str, Task]) -> int:
        assert self.core is not None, self.error
        return await self.core.submit(items, harness_refs, tasks)

    async def poll(self, max_wait_s: float) -> list[Outcome]:
        assert self.core is not None, self.error
        return await self.core.poll(max_wait_s)

    async def in_flight(self) -> int:
        return 0 if self.core is None else self.core.in_flight()


# num_cpus=0: the worker waits on I/O; the node's capacity is its sandbox slots.
RolloutWorker = ray.remote(num_cpus=0)(_RolloutWorkerShell)


# --- driver side: which nodes host a worker, and starting one -------------------------


@dataclass(eq=False)
class WorkerNode:
    """The driver's view of one node's worker: its actor, what was shipped to it, and
    the rollouts in flight there (item id -> the scheduler's job)."""

    node_id: str
    label: str
    slots: int
    claim_slots: bool
    actor: Any = None
    generation: int = 0  # bumped each time a (re)started worker comes up
    harnesses: set[str] = field(default_factory=set)
    tasks: set[str] = field(default_factory=set)
    inflight: dict[int, Any] = field(default_factory=dict)
    poller: Any = None  # the asyncio task long-polling this node
    alive: bool = True

    def free(self) -> int:
        return self.slots - len(self.inflight) if (self.alive and self.actor is not None) else 0


def discover_nodes(slot_resource: str, slots_per_node: int, *, claim_slots: bool) -> list[WorkerNode]:
    """Alive nodes that declare ``slot_resource`` (their slot count is its total); when
    none declares it, every alive node with ``slots_per_node`` slots."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    with_slots = [n for n in alive if n.get("Resources", {}).get(slot_resource, 0) >= 1]
    if not alive:
        raise RuntimeError("the Ray cluster has no alive nodes")
    out = []
    for n in with_slots or alive:
        slots = int(n["Resources"][slot_resource]) if with_slots else slots_per_node
        label = f"{n.get('NodeManagerAddress', '?')}:{n['NodeID'][:8]}"
        out.append(WorkerNode(n["NodeID"], label, slots, claim_slots and bool(with_slots)))
    return out


async def start_worker(node: WorkerNode, config_ref: Any, time_cap_grace: float, slot_resource: str) -> str | None:
    """Start a worker pinned to ``node`` and wait until it is up. Returns the executor
    construction error (a config problem, not retried) or None; a worker that cannot be
    placed or dies while starting marks the node as not alive."""
    opts: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        "max_concurrency": node.slots + _CONTROL_CALLS,
        "max_restarts": 0,
    }
    if node.claim_slots:
        opts["resources"] = {slot_resource: node.slots}
    actor = RolloutWorker.options(**opts).remote(config_ref, node.slots, time_cap_grace)
    try:
        info = await asyncio.wait_for(aget(actor.ready.remote()), _WORKER_START_TIMEOUT_S)
    except (RayError, asyncio.TimeoutError) as exc:
        ray.kill(actor)
        node.alive = False
        log.error("rollout worker on %s did not start: %s", node.label, exc)
        return None
    if info["error"]:
        ray.kill(actor)
        return info["error"]
    node.actor = actor
    node.generation += 1
    node.harnesses.clear()
    node.tasks.clear()
    return None


async def aget(ref: Any) -> Any:
    """Await an ObjectRef as a coroutine (what ``asyncio.wait_for`` wants)."""
    return await ref
