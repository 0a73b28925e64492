"""Islands as Ray actors: one actor per MILO island is the only in-memory owner of that
island's state (lineage, admitted set, stall counter, held-out verdicts) during a run.

Owns :data:`IslandActor` (the plain :class:`~milo_ray.milo.island.Island` as a Ray actor:
no shell code, so the island's logic stays testable without Ray), :class:`IslandRef`
(the driver's handle on one actor), :func:`island_actors` (the factory a run's
:class:`~milo_ray.milo.state.MiloState` creates its islands with) and :func:`ask`, the
one way the loop asks an island a question, whether the island is an actor or a plain
object (tests and read-side projections use plain ones).

Events still have one writer: the driver stores each event, then hands the island's
events to its actor. Those hand-overs are buffered and sent as one ``apply_all`` call
just before the next question to that actor; Ray runs an actor's calls from one caller
in submission order, so every answer reflects every event emitted before the question,
and a round costs the driver a few round trips (plan, duplicate check, verdict,
held-out verdict, counters) instead of one per event. Replaying a run's events on resume
sends each island its whole history in one call.

Actors take no CPU (``num_cpus=0``: their work is microseconds next to a rollout, and
a CPU held by an island is one a rollout cannot use) and are spread over the cluster's
nodes by island index (:func:`island_node`), so a cluster's islands land on different
nodes instead of piling onto the driver's.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, TypeVar

import ray

from milo_ray.milo.island import Island, IslandPart
from milo_ray.milo.lineage import LineageNode

T = TypeVar("T")

IslandActor = ray.remote(num_cpus=0, max_restarts=0)(Island)


class IslandRef:
    """The driver's handle on one island actor.

    The loop asks through :func:`ask` (awaited, so free-running islands never block one
    another); the few blocking readers (``status``, ``nodes``, ``snapshot``, ...) serve
    the read side outside the event loop (a finished run's inspection, ``MiloState``'s
    readers) and speciation, whose driver-side index needs the moved node ids at once
    (the source island is running: one round trip)."""

    def __init__(self, island: int, actor: Any, restart: Callable[[], Any] | None = None) -> None:
        self.island = int(island)
        self.actor = actor
        self._restart = restart  # a new actor for this island (its node died)
        self._unsent: list[Any] = []  # events emitted since the last call, in order
        self._sent: list[Any] = []  # refs of apply_all calls whose errors are not yet checked
        # Every call that changed the island, in order: an actor whose node left is rebuilt
        # from it on another node (the island is a function of these calls), so losing a
        # node is an infrastructure failure the run survives, not a crash.
        self._history: list[tuple[str, tuple[Any, ...]]] = []

    def _record(self, name: str, *args: Any) -> None:
        self._history.append((name, args))

    def _rebuild(self) -> None:
        import logging

        logging.getLogger(__name__).warning("island %d: its actor died (node lost); rebuilding it from its %d "
                                            "recorded changes on another node", self.island, len(self._history))
        self.actor = self._restart()
        self._unsent, self._sent = [], []
        for name, args in self._history:
            self._sent.append(getattr(self.actor, name).remote(*args))

    # --- events ------------------------------------------------------------------------
    def apply(self, event: Any) -> None:
        self._unsent.append(event)

    def _flush(self) -> None:
        if self._unsent:
            self._record("apply_all", self._unsent)
            self._sent.append(self.actor.apply_all.remote(self._unsent))
            self._unsent = []

    def _checked(self) -> list[Any]:
        refs, self._sent = self._sent, []
        return refs

    # --- questions -----------------------------------------------------------------------
    async def ask(self, method: Callable[..., T], *args: Any) -> T:
        """``method`` (an :class:`Island` method) answered by the actor, after every event
        handed to it so far."""
        self._flush()
        try:
            answer = await getattr(self.actor, method.__name__).remote(*args)
        except ray.exceptions.ActorDiedError:
            if self._restart is None:
                raise
            self._rebuild()
            answer = await getattr(self.actor, method.__name__).remote(*args)
        for ref in self._checked():  # finished before the answer (submission order): re-raise a failed apply
            await ref
        if method.__name__ == "detach":
            self._record("detach", *args)
        return answer

    def get(self, method: Callable[..., T], *args: Any) -> T:
        """The blocking form of :meth:`ask` (never inside the run's event loop)."""
        self._flush()
        try:
            answer = ray.get(getattr(self.actor, method.__name__).remote(*args))
        except ray.exceptions.ActorDiedError:
            if self._restart is None:
                raise
            self._rebuild()
            answer = ray.get(getattr(self.actor, method.__name__).remote(*args))
        ray.get(self._checked())
        if method.__name__ == "detach":
            self._record("detach", *args)
        return answer

    # --- the readers MiloState and a finished run's inspection use (blocking) -----------
    def detach(self, node_id: str) -> IslandPart:
        return self.get(Island.detach, node_id)

    def adopt(self, part: IslandPart) -> None:
        """Sent, not awaited (like an event): a new island's actor may still be starting,
        and its next question waits for it anyway."""
        self._flush()
        self._record("adopt", part)
        self._sent.append(self.actor.adopt.remote(part))

    def status(self) -> tuple[int, int]:
        return self.get(Island.status)

    @property
    def rounds_done(self) -> int:
        return self.status()[0]

    @property
    def stall(self) -> int:
        return self.status()[1]

    def nodes(self) -> list[LineageNode]:
        return self.get(Island.nodes)

    def node(self, node_id: str) -> LineageNode:
        return self.get(Island.node, node_id)

    def best(self) -> LineageNode | None:
        return self.get(Island.best)

    def snapshot(self) -> dict[str, Any]:
        return self.get(Island.snapshot)

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


def island_node(j: int) -> Any:
    """Where island j's actor goes: the cluster's alive nodes taken round-robin by island
    index, so K islands on K nodes get one node each.

    Island actors demand no resource, so Ray's ``SPREAD`` strategy has no load to
    balance and puts several on one node (measured: two islands on a two-node cluster
    shared a node); an actor demanding a little CPU would spread, but could wait
    forever behind rollouts holding every CPU. The placement is hard: a soft one fell
    back to the driver's node in 3 of 5 tries on a fresh two-node cluster. An island
    whose node leaves dies with it, as any actor does; its handle then starts a new
    actor on an alive node and replays the island's recorded changes into it.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    if not nodes:
        return "DEFAULT"
    return NodeAffinitySchedulingStrategy(node_id=nodes[int(j) % len(nodes)], soft=False)


def island_actors(*, eps: float, temperature: float, prestart: Iterable[int] = ()) -> Callable[[int], IslandRef]:
    """The island factory of a run: each island a new actor, spread over the cluster.

    ``prestart``: islands whose actors are started now, before the run's events create
    the islands. An actor is a new worker process (seconds to start on a busy machine);
    started with the run, the initial islands' actors come up while the seeds are
    evaluated instead of after."""

    def new_actor(j: int) -> Any:
        return IslandActor.options(scheduling_strategy=island_node(j)).remote(j, eps=eps, temperature=temperature)

    def start(j: int) -> IslandRef:
        return IslandRef(j, new_actor(j), restart=lambda: new_actor(j))

    started = {int(j): start(int(j)) for j in prestart}

    def make(j: int) -> IslandRef:
        return started.pop(int(j), None) or start(j)

    return make


async def ask(island: Island | IslandRef, method: Callable[..., T], *args: Any) -> T:
    """Island ``island``'s answer to ``method`` (an :class:`Island` method, e.g.
    ``Island.judge``): directly from a plain island, through Ray from an actor."""
    if isinstance(island, Island):
        return method(island, *args)
    return await island.ask(method, *args)


async def node_of(state: Any, node_id: str) -> LineageNode:
    """A node as the island holding it now has it (``state``: a
    :class:`~milo_ray.milo.state.MiloState`)."""
    return await ask(state.island_of(node_id), Island.node, node_id)
