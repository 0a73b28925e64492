"""The scheduler's workers: one :class:`~milo_ray.execution.workers.RolloutWorker` per
node with sandbox slots, as seen from the driver.

:class:`WorkerPool` owns which nodes have a worker and what was shipped to each: it
connects to Ray and starts the workers on first use, looks for nodes that joined the
cluster at most every ``_REDISCOVER_S`` seconds after that, retires a worker that died
or wedged and starts a new one if its node is still alive, and ships each harness (as
one object ref) and each task to a worker once. Which rollouts run where, and what
their outcomes become, is the scheduler's business.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping

import ray

from milo_ray.execution.cluster import ensure_connected
from milo_ray.execution.shipping import publish_all
from milo_ray.execution.types import Task
from milo_ray.execution.workers import Item, WorkerNode, discover_nodes, start_worker

# How often new work looks for nodes that joined the cluster since the last look.
_REDISCOVER_S = 60.0


class WorkerPool:
    """``harnesses`` is the scheduler's registry (harness_id -> harness), read when a
    harness is first shipped. ``address`` is used to connect only when Ray is not
    initialised yet. The other arguments are the scheduler's, passed on to
    :func:`~milo_ray.execution.workers.discover_nodes` and
    :func:`~milo_ray.execution.workers.start_worker`."""

    def __init__(
        self,
        executor_config: Any,
        harnesses: Mapping[str, Any],
        *,
        slots_per_node: int,
        slot_resource: str,
        claim_slots: bool,
        time_cap_grace: float,
        address: str | None,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        self.executor_config = executor_config
        self.worker_env = dict(worker_env or {})
        self.harnesses = harnesses
        self.slots_per_node = slots_per_node
        self.slot_resource = slot_resource
        self.claim_slots = claim_slots
        self.time_cap_grace = time_cap_grace
        self.address = address
        self.nodes: dict[str, WorkerNode] = {}
        self._harness_refs: dict[str, Any] = {}
        self._config_ref: Any = None
        self._discovered_at = 0.0
        self._start_lock: asyncio.Lock | None = None

    def bind_loop(self) -> None:
        """Forget the previous event loop's lock and pollers (the scheduler moved loops)."""
        self._start_lock = asyncio.Lock()
        for node in self.nodes.values():
            node.poller = None

    def any_alive(self) -> bool:
        return any(n.alive for n in self.nodes.values())

    def free_slots(self) -> dict[str, int]:
        """Free slots by node id, for the nodes that have any."""
        return {n.node_id: free for n in self.nodes.values() if (free := n.free()) > 0}

    def actors(self) -> dict[str, Any]:
        return {n.label: n.actor for n in self.nodes.values() if n.actor is not None}

    async def ensure_started(self) -> None:
        """Start workers on the nodes that have none: on first use, then at most every
        ``_REDISCOVER_S`` seconds so nodes that joined the cluster are put to work."""
        assert self._start_lock is not None, "bind_loop() first"
        async with self._start_lock:
            if self.any_alive() and time.monotonic() - self._discovered_at < _REDISCOVER_S:
                return
            ensure_connected(self.address)
            if self._config_ref is None:
                self._config_ref = ray.put(self.executor_config)
            self._discovered_at = time.monotonic()
            fresh = [
                n
                for n in discover_nodes(self.slot_resource, self.slots_per_node, claim_slots=self.claim_slots)
                if n.node_id not in self.nodes or not self.nodes[n.node_id].alive
            ]
            for node in fresh:
                self.nodes[node.node_id] = node
            await asyncio.gather(*(self._start(n) for n in fresh))
            if not self.any_alive():
                raise RuntimeError("no Ray node could host a rollout worker; see the log for each node's error")

    async def _start(self, node: WorkerNode) -> None:
        error = await start_worker(node, self._config_ref, self.time_cap_grace, self.slot_resource,
                                   env=self.worker_env)
        if error:
            raise RuntimeError(f"the rollout worker could not build the executor from executor_config:\n{error}")

    def retire(self, node: WorkerNode) -> None:
        """Stop using the node's worker at once (it has no free slots from now on)."""
        old, node.actor = node.actor, None
        if old is not None:
            ray.kill(old)  # harmless when dead; stops a wedged one

    async def restart(self, node: WorkerNode) -> None:
        """Start a new worker on a node whose worker was retired, if the node is still
        alive; otherwise the node is marked gone."""
        if any(n["NodeID"] == node.node_id and n.get("Alive") for n in ray.nodes()):
            await self._start(node)
        else:
            node.alive = False

    def ship(self, node: WorkerNode, items: list[Item], tasks: Mapping[str, Task]) -> None:
        """Start ``items`` on the node's worker in one call, with the harnesses and tasks
        it has not received yet. Fire and forget: a failed submit surfaces as a failed
        poll (a dead actor)."""
        refs: dict[str, Any] = {}
        new_tasks: dict[str, Task] = {}
        for _, harness_id, task_id, _, _ in items:
            if harness_id not in node.harnesses and harness_id not in refs:
                refs[harness_id] = self._harness_ref(harness_id)
            if task_id not in node.tasks and task_id not in new_tasks:
                # A task's files (a Harbor directory) travel as object refs, put once.
                new_tasks[task_id] = publish_all(tasks[task_id])
        node.actor.submit.remote(items, refs, new_tasks)
        node.harnesses.update(refs)
        node.tasks.update(new_tasks)

    def _harness_ref(self, harness_id: str) -> Any:
        # One ray.put per harness: every worker that needs it reads the same object.
        if harness_id not in self._harness_refs:
            self._harness_refs[harness_id] = ray.put(self.harnesses[harness_id])
        return self._harness_refs[harness_id]

    def close(self) -> None:
        """Kill every worker."""
        for node in self.nodes.values():
            self.retire(node)
