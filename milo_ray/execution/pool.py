"""The scheduler's workers: how many :class:`~milo_ray.execution.workers.RolloutWorker`
actors a run has, and what was shipped to each, as seen from the driver.

Sandbox slots are a Ray resource (``sandbox_slot``, declared by each node that runs
rollouts). Every worker holds a fixed number of them (``slots_per_worker``) for its
life and has no node affinity, so Ray decides where it runs:

* the pool asks for workers as the scheduler's queue needs them (:meth:`WorkerPool.scale`,
  up to ``max_workers``); a worker Ray cannot place yet stays *pending*, and pending
  actors are the resource demand the autoscaler acts on (it adds a node with slots);
* a node that joins is put to work as soon as Ray places a pending worker on it;
* two runs on one cluster together never hold more slots than a node has;
* a worker whose rollouts are done for ``worker_idle_s`` is released (its slots with
  it), and pending workers the queue no longer needs are cancelled at once, so idle
  nodes can be scaled down.

When no node declares the slot resource, :func:`plan_slots` decides what happens: an
autoscaling cluster gets the demand anyway (the autoscaler may add such a node), a
one-node instance runs ``slots_per_node`` rollouts on its node (a pinned worker that
claims nothing: a caller that started Ray without slots), and a cluster of several
nodes is refused with the fix. Which rollouts run on which worker, and what their
outcomes become, is the scheduler's business.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import ray
from ray.exceptions import RayError

from milo_ray.core.tasks import Task
from milo_ray.execution.cluster import cluster_autoscales, ensure_connected
from milo_ray.boundary.shipping import publish_all
from milo_ray.execution.workers import Item, WorkerHandle, await_ready, create_worker

log = logging.getLogger(__name__)

# Pending workers at a time: at least this many, else as many as are ready, so the
# demand shown to Ray (and the autoscaler) doubles as workers come up instead of
# queueing one actor per queued rollout.
_MIN_PENDING = 2
# Workers that die before they are ready, in a row, before the pool gives up (a broken
# runtime environment would otherwise be retried forever).
_MAX_START_FAILURES = 3
# How long a driver on a cluster without slotted nodes waits for the autoscaler's first
# report (Ray's monitor writes one every AUTOSCALER_UPDATE_INTERVAL_S, 5 s by default).
_AUTOSCALER_REPORT_WAIT_S = 10.0


class NoSlotsError(RuntimeError):
    """No node of the cluster declares the slot resource and none can be added."""


@dataclass(frozen=True)
class SlotPlan:
    """How the pool's workers get their slots: ``worker_slots`` each, holding them as
    ``slot_resource`` (placed by Ray), or pinned to ``pin_node`` claiming nothing."""

    worker_slots: int
    slot_resource: str | None
    pin_node: str | None = None

    @property
    def max_workers(self) -> int | None:
        return 1 if self.pin_node is not None else None


def plan_slots(nodes: Sequence[Mapping[str, Any]], *, slot_resource: str, slots_per_node: int,
               slots_per_worker: int | None, autoscaling: bool) -> SlotPlan:
    """The pool's slot plan for a cluster whose nodes (``ray.nodes()`` entries) are
    ``nodes``. A worker has ``slots_per_worker`` slots (None: ``slots_per_node``), at
    most the smallest slot count a node declares, so every slotted node can host one."""
    alive = [n for n in nodes if n.get("Alive")]
    declared = [int(n.get("Resources", {}).get(slot_resource, 0)) for n in alive]
    declared = [d for d in declared if d >= 1]
    size = int(slots_per_worker or slots_per_node)
    if declared:
        return SlotPlan(min(size, min(declared)), slot_resource)
    if autoscaling:
        return SlotPlan(size, slot_resource)
    if len(alive) == 1:
        log.warning("the Ray instance declares no %r resource: its one node runs slots_per_node=%d rollouts "
                    "(execution.slots_per_node)", slot_resource, slots_per_node)
        return SlotPlan(int(slots_per_node), None, pin_node=alive[0]["NodeID"])
    raise NoSlotsError(
        f"none of the {len(alive)} nodes of the Ray cluster declares the resource {slot_resource!r} "
        "(execution.slot_resource), so no rollout could run anywhere: start the nodes that run rollouts with "
        f"`ray start --resources='{{\"{slot_resource}\": N}}'` (N sandboxes per node; cluster.yaml sets it per "
        "node type), or set execution.slot_resource to the resource your nodes declare"
    )


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"RolloutScheduler: {name}={value!r} must be a positive integer")


class WorkerPool:
    """``harnesses`` is the scheduler's registry (harness_id -> harness), read when a
    harness is first shipped. ``address`` is used to connect only when Ray is not
    initialised yet. ``on_ready`` is called whenever a worker became ready or went
    away (the scheduler re-dispatches); ``on_fatal(exc)`` when no worker can ever start
    (the executor cannot be built from its config, workers die while starting)."""

    def __init__(
        self,
        executor_config: Any,
        harnesses: Mapping[str, Any],
        *,
        slots_per_node: int,
        slots_per_worker: int | None,
        max_workers: int | None,
        slot_resource: str,
        time_cap_grace: float,
        address: str | None,
        worker_env: Mapping[str, str] | None = None,
        worker_idle_s: float = 60.0,
    ) -> None:
        _positive_int("slots_per_node", slots_per_node)
        for name, value in (("slots_per_worker", slots_per_worker), ("max_workers", max_workers)):
            if value is not None:
                _positive_int(name, value)
        if not isinstance(slot_resource, str) or not slot_resource:
            raise ValueError(f"RolloutScheduler: slot_resource={slot_resource!r} must name a Ray resource")
        if not worker_idle_s >= 0:
            raise ValueError(f"RolloutScheduler: worker_idle_s={worker_idle_s!r} must be >= 0 seconds")
        self.worker_idle_s = float(worker_idle_s)
        self.executor_config = executor_config
        self.worker_env = dict(worker_env or {})
        self.harnesses = harnesses
        self.slots_per_node = slots_per_node
        self.slots_per_worker = slots_per_worker
        self.max_workers = max_workers
        self.slot_resource = slot_resource
        self.time_cap_grace = time_cap_grace
        self.address = address
        self.workers: dict[str, WorkerHandle] = {}
        self.plan: SlotPlan | None = None
        self.on_ready: Callable[[], None] = lambda: None
        self.on_fatal: Callable[[BaseException], None] = lambda exc: None
        self.on_released: Callable[[WorkerHandle], None] = lambda worker: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.fatal: BaseException | None = None
        # The run's budget counter, handed to each worker as it comes up (set by the
        # scheduler before the first worker is asked for; None: no counter).
        self.run_budget: Any = None
        # The session's call journal, likewise (None: the run keeps none).
        self.call_journal: Any = None
        self._keys = itertools.count()
        self._start_failures = 0
        self._harness_refs: dict[str, Any] = {}
        self._config_ref: Any = None
        self._start_lock: asyncio.Lock | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Forget the previous event loop's lock, pollers and idle timers (the scheduler
        moved loops). Workers still pending on the old loop are cancelled: their waiters
        died with it; idle ones start their idle time again on this loop."""
        self._loop = loop
        self._start_lock = asyncio.Lock()
        for worker in list(self.workers.values()):
            worker.poller = None
            if not worker.ready:
                self.retire(worker)
            elif not worker.inflight:
                worker.idle_since = None
                self.idle(worker)

    def idle(self, worker: WorkerHandle) -> None:
        """The worker finished its last rollout: release it after ``worker_idle_s``
        unless work reaches it first (``on_released`` then hears of it)."""
        if worker.inflight or worker.idle_since is not None or self._loop is None:
            return
        stamp = worker.idle_since = time.monotonic()
        self._loop.call_later(self.worker_idle_s, self._release_if_idle, worker, stamp)

    def _release_if_idle(self, worker: WorkerHandle, stamp: float) -> None:
        if worker.idle_since == stamp and not worker.inflight and self.workers.get(worker.key) is worker:
            self.retire(worker)
            self.on_released(worker)

    def free_slots(self) -> dict[str, int]:
        """Free slots by worker key, for the ready workers that have any."""
        return {w.key: free for w in self.workers.values() if (free := w.free()) > 0}

    def actors(self) -> dict[str, Any]:
        """Ready workers' actors by ``node-label/worker-key``."""
        return {f"{w.label}/{w.key}": w.actor for w in self.workers.values() if w.ready and w.actor is not None}

    def capacity(self) -> int:
        """Slots of the ready and pending workers."""
        return sum(w.slots for w in self.workers.values())

    async def ensure_started(self) -> None:
        """Connect to Ray and decide the slot plan (once); raises :class:`NoSlotsError`
        for a cluster where no rollout could run, or the fatal error of an earlier start."""
        assert self._start_lock is not None, "bind_loop() first"
        if self.fatal is not None:
            raise self.fatal
        async with self._start_lock:
            if self.plan is not None:
                return
            ensure_connected(self.address, slots=self.slots_per_node, slot_resource=self.slot_resource)
            if self._config_ref is None:
                self._config_ref = ray.put(self.executor_config)
            nodes = ray.nodes()
            # Whether an autoscaler may add slotted nodes matters only when none has slots yet.
            declared = any(n.get("Alive") and n.get("Resources", {}).get(self.slot_resource, 0) >= 1 for n in nodes)
            autoscaling = not declared and cluster_autoscales(wait_s=_AUTOSCALER_REPORT_WAIT_S)
            self.plan = plan_slots(nodes, slot_resource=self.slot_resource, slots_per_node=self.slots_per_node,
                                   slots_per_worker=self.slots_per_worker, autoscaling=autoscaling)

    def scale(self, wanted_slots: int) -> None:
        """Have workers for ``wanted_slots`` (rollouts in flight plus those that could
        start now): ask Ray for more workers when short (a few pending at a time, up to
        ``max_workers``), cancel pending ones that are no longer needed. Ready workers
        are never stopped here (idle ones are released by :meth:`release`)."""
        if self.plan is None or self.fatal is not None:
            return
        size = self.plan.worker_slots
        pending = [w for w in self.workers.values() if not w.ready]
        short = wanted_slots - self.capacity()
        if short > 0:
            caps = [math.ceil(short / size), max(_MIN_PENDING, len(self.workers) - len(pending)) - len(pending)]
            for cap in (self.max_workers, self.plan.max_workers):
                if cap is not None:
                    caps.append(cap - len(self.workers))
            for _ in range(max(min(caps), 0)):
                self._spawn()
            return
        for worker in reversed(pending):  # the newest first
            if self.capacity() - worker.slots < wanted_slots:
                break
            self.retire(worker)

    def _spawn(self) -> None:
        assert self.plan is not None
        worker = WorkerHandle(key=f"w{next(self._keys)}", slots=self.plan.worker_slots)
        create_worker(worker, self._config_ref, self.time_cap_grace, slot_resource=self.plan.slot_resource,
                      pin_node=self.plan.pin_node)
        self.workers[worker.key] = worker
        asyncio.ensure_future(self._come_up(worker))

    async def _come_up(self, worker: WorkerHandle) -> None:
        try:
            error = await await_ready(worker, env=self.worker_env, run_budget=self.run_budget,
                                      call_journal=self.call_journal)
        except RayError as exc:
            if self.workers.get(worker.key) is not worker:
                return  # cancelled by the pool
            self.workers.pop(worker.key, None)
            self._start_failures += 1
            log.warning("rollout worker %s died before it was ready: %s", worker.key, exc)
            if self._start_failures >= _MAX_START_FAILURES:
                self._fail(RuntimeError(f"{self._start_failures} rollout workers in a row died while starting; "
                                        f"the last: {exc}"))
            self.on_ready()
            return
        if self.workers.get(worker.key) is not worker:
            ray.kill(worker.actor)  # cancelled while it came up
            return
        if error:
            self.retire(worker)
            self._fail(RuntimeError(f"the rollout worker could not build the executor from executor_config:\n{error}"))
            return
        self._start_failures = 0
        self.on_ready()

    def _fail(self, exc: BaseException) -> None:
        self.fatal = exc
        for worker in [w for w in self.workers.values() if not w.ready]:
            self.retire(worker)
        self.on_fatal(exc)

    def can_place(self) -> bool:
        """Whether a worker could still be placed somewhere (now or by the autoscaler)."""
        if self.plan is None:
            return True
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if self.plan.pin_node is not None:
            return any(n["NodeID"] == self.plan.pin_node for n in alive)
        return cluster_autoscales() or any(n.get("Resources", {}).get(self.slot_resource, 0) >= 1 for n in alive)

    def retire(self, worker: WorkerHandle) -> None:
        """Stop using the worker at once and kill its actor (its slots go back to Ray)."""
        self.workers.pop(worker.key, None)
        old, worker.actor = worker.actor, None
        if old is not None:
            ray.kill(old)  # harmless when dead; stops a wedged one

    def ship(self, worker: WorkerHandle, items: list[Item], tasks: Mapping[str, Task],
             unbudgeted: Sequence[int] = ()) -> None:
        """Start ``items`` on the worker in one call, with the harnesses and tasks it has
        not received yet (``unbudgeted``: the item ids run outside the run's budget).
        Fire and forget: a failed submit surfaces as a failed poll (a dead actor)."""
        refs: dict[str, Any] = {}
        new_tasks: dict[str, Task] = {}
        for _, harness_id, task_id, _, _ in items:
            if harness_id not in worker.harnesses and harness_id not in refs:
                refs[harness_id] = self._harness_ref(harness_id)
            if task_id not in worker.tasks and task_id not in new_tasks:
                # A task's files (a Harbor directory) travel as object refs, put once.
                new_tasks[task_id] = publish_all(tasks[task_id])
        worker.actor.submit.remote(items, refs, new_tasks, list(unbudgeted))
        worker.harnesses.update(refs)
        worker.tasks.update(new_tasks)

    def _harness_ref(self, harness_id: str) -> Any:
        # One ray.put per harness: every worker that needs it reads the same object.
        if harness_id not in self._harness_refs:
            self._harness_refs[harness_id] = ray.put(self.harnesses[harness_id])
        return self._harness_refs[harness_id]

    def close(self) -> None:
        """Kill every worker, pending ones too."""
        for worker in list(self.workers.values()):
            self.retire(worker)
