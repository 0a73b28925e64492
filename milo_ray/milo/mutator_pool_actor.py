"""The mutator pool as Ray actors: one per run, and one per shared account on the cluster.

Owns :class:`MutatorPoolActor` (a run's pool G: the assignment, each mutator's seats
and the fair queue across the run's islands, the time cap), :class:`AccountSeatsActor`
(the seats of one account, shared by every run on the cluster: a detached actor named
by the account's key in the cluster's namespace), :func:`account_seats` (the handle on it)
and :class:`PoolRef` (the driver's handle on its run's pool actor).

A mutation holds a seat from its grant until the driver has recorded its outcome:
``async with pool.seat(island, lease_id) as lease`` asks the pool actor (which waits
in the island-fair queue of the island's mutator, then, for a spec with declared
``seats``, in the account actor's run-fair queue), and the driver runs the mutation as
a Ray task it owns (:func:`milo_ray.search.mutation.run_mutation_async`) with the
lease's spec and cap. The driver owns the task so that losing the pool actor loses no
mutation: :class:`PoolRef` starts a new actor, gives it the run's assignment events and
the seats the driver holds, and asks again under the same lease ids (every request is
idempotent by lease id, in both actors), so nothing runs twice.

The pool actor follows the run's assignment events (``milo.init``, ``milo.reassign``,
``milo.island``): every request carries the events the actor has not yet confirmed
(numbered from the last confirmed one), and the actor applies those it has not applied
before answering. An async actor may start one caller's calls out of order; this way no
answer misses an event emitted before its request. A resumed run's replayed events
rebuild it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Callable, Sequence

import ray

from milo_ray.milo.events import Init, IslandFounded, Reassign
from milo_ray.milo.mutator_pool import FairSeats, Lease, MutatorPool

log = logging.getLogger(__name__)

POOL_EVENTS = (Init, Reassign, IslandFounded)
# How long a shared seat outlives its grant when its holder never returns it (a run
# killed mid-mutation): the cap, plus the validation and the hand-back around it.
LEASE_MARGIN_S = 600.0
SEATS_PREFIX = "milo_ray.mutator_seats:"


@ray.remote(num_cpus=0)
class AccountSeatsActor:
    """The seats of one account, shared by every run on the cluster (detached, named).

    Keys of the fair queue are runs (``holder``): no run starves while another holds
    the account's seats. Each request carries its own limit (its spec's ``seats``), so a
    run never exceeds what its config declares whatever other runs declare. A seat
    expires ``lease_s`` after its grant: the seats of a run that died come back."""

    def __init__(self, label: str) -> None:
        self.label = label  # for people (``ray list actors``); never a key value
        self._seats = FairSeats()
        self._granted: dict[str, asyncio.Event] = {}
        self._lease_s: dict[str, float] = {}

    def _wake(self, granted: list[str]) -> None:
        for lease_id in granted:
            self._seats.hold_until(lease_id, time.monotonic() + self._lease_s.pop(lease_id, LEASE_MARGIN_S))
            self._granted.setdefault(lease_id, asyncio.Event()).set()

    async def acquire(self, lease_id: str, holder: str, limit: int, lease_s: float) -> None:
        """Wait for a seat (returns at once for a lease already held)."""
        if lease_id in self._seats.held:
            return
        self._lease_s[lease_id] = float(lease_s)
        event = self._granted.setdefault(lease_id, asyncio.Event())
        self._wake(self._seats.request(lease_id, holder, int(limit)))
        while not event.is_set():
            deadline = self._seats.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic()) + 0.01
            try:
                await asyncio.wait_for(asyncio.shield(event.wait()), timeout=timeout)
            except asyncio.TimeoutError:
                expired = [k for k, (_, t) in self._seats.held.items() if t is not None and t <= time.monotonic()]
                if expired:
                    log.warning("account %s: seats %s were never returned; taken back", self.label, expired)
                self._wake(self._seats.expire(time.monotonic()))

    def release(self, lease_id: str) -> None:
        self._granted.pop(lease_id, None)
        self._lease_s.pop(lease_id, None)
        self._wake(self._seats.release(lease_id))

    def adopt(self, lease_id: str, holder: str, lease_s: float) -> None:
        """Hold a seat a rebuilt pool actor's driver still holds (kept if still held)."""
        if lease_id not in self._seats.held:
            self._seats.adopt(lease_id, holder, expires_at=time.monotonic() + float(lease_s))
        self._granted.setdefault(lease_id, asyncio.Event()).set()

    def held(self) -> dict[str, str]:
        """lease id -> holder, of the seats held now."""
        return {k: str(h) for k, (h, _) in self._seats.held.items()}

    def waiting(self) -> list[str]:
        """Lease ids waiting for a seat, oldest first."""
        return self._seats.waiting()


def account_seats(key: str, label: str) -> Any:
    """The account's seat actor: created by the first run that needs it, found by every
    later one (``get_if_exists``), kept after the runs end (``detached``). In the cluster's
    namespace (a job's default namespace is its own: another run would not find it), on
    the head node, which an autoscaler never removes."""
    from milo_ray.llm.rate_limit import CLUSTER_NAMESPACE  # its LangChain import only where seats are shared

    return AccountSeatsActor.options(name=SEATS_PREFIX + key, namespace=CLUSTER_NAMESPACE, lifetime="detached",
                                     get_if_exists=True, resources={"node:__internal_head__": 0.001}).remote(label)


@ray.remote(num_cpus=0, max_restarts=0)
class MutatorPoolActor:
    """A run's pool G: the assignment, the seats of each mutator with the island-fair
    queue, the time cap, and the run's requests to shared accounts.

    ``holder``: the run's identity at the accounts (the same in every session of the
    run, so a resumed run's requests meet the seats its killed session held)."""

    def __init__(self, specs: list, time_cap_s: float, max_concurrent: Any, holder: str) -> None:
        self._pool = MutatorPool(specs, time_cap_s=time_cap_s, max_concurrent=max_concurrent)
        self._holder = str(holder)
        self._seats = {n: FairSeats() for n in self._pool.names}
        self._granted: dict[str, asyncio.Event] = {}
        self._accounts: dict[str, Any] = {}
        self._applied = 0  # the run's assignment events applied so far

    def _apply(self, base: int, events: Sequence[Any]) -> int:
        """Apply events ``base``, ``base + 1``, ... of the run not applied yet; returns
        how many are applied now (the driver's confirmation)."""
        if base > self._applied:
            raise RuntimeError(f"mutator pool: events from #{base} sent, only {self._applied} applied")
        for i, e in enumerate(events):
            if base + i == self._applied:
                self._pool.apply(e)
                self._applied += 1
        return self._applied

    def _account(self, name: str) -> Any:
        account = self._pool.accounts[name]
        if account is None:
            return None
        label, key = account
        if key not in self._accounts:
            self._accounts[key] = account_seats(key, label)
        return self._accounts[key]

    def _lease_s(self) -> float:
        return 2 * self._pool.time_cap_s + LEASE_MARGIN_S

    def _wake(self, granted: list[str]) -> None:
        for lease_id in granted:
            self._granted.setdefault(lease_id, asyncio.Event()).set()

    async def acquire(self, island: int, lease_id: str, base: int = 0, events: Sequence[Any] = ()) -> tuple[Lease, int]:
        """``events``: the run's assignment events from #``base`` on, applied first.
        Returns once the mutation holds a seat of island ``island``'s mutator (and of its
        account, for a spec with declared seats), with the count of events applied."""
        applied = self._apply(base, events)
        lease = self._pool.lease(lease_id, island)
        seats = self._seats[lease.mutator]
        event = self._granted.setdefault(lease_id, asyncio.Event())
        self._wake(seats.request(lease_id, int(island), self._pool.limits[lease.mutator]))
        await event.wait()
        account = self._account(lease.mutator)
        if account is not None:
            await account.acquire.remote(f"{self._holder}/{lease_id}", self._holder,
                                         self._pool.limits[lease.mutator], self._lease_s())
        return lease, applied

    async def release(self, lease: Lease) -> None:
        self._granted.pop(lease.lease_id, None)
        self._wake(self._seats[lease.mutator].release(lease.lease_id))
        account = self._account(lease.mutator)
        if account is not None:
            await account.release.remote(f"{self._holder}/{lease.lease_id}")

    async def restore(self, events: Sequence[Any], held: Sequence[Lease]) -> None:
        """Rebuild from the run's assignment events and the seats its driver holds."""
        self._apply(0, events)
        for lease in held:
            self._seats[lease.mutator].adopt(lease.lease_id, lease.island)
            self._granted.setdefault(lease.lease_id, asyncio.Event()).set()
            account = self._account(lease.mutator)
            if account is not None:
                await account.adopt.remote(f"{self._holder}/{lease.lease_id}", self._holder, self._lease_s())

    def assignment(self, base: int = 0, events: Sequence[Any] = ()) -> tuple[dict, int]:
        applied = self._apply(base, events)
        return dict(self._pool.assignment), applied

    def seats(self) -> dict:
        """mutator -> (lease ids holding its seats, lease ids waiting)."""
        return {n: (sorted(s.held), s.waiting()) for n, s in self._seats.items()}


class PoolRef:
    """The driver's handle on its run's pool actor.

    ``new_actor()`` starts a pool actor; when the one in use dies (killed, or its node
    lost), the next request starts another and restores it from the run's assignment
    events and the leases the driver holds, then asks again."""

    def __init__(self, new_actor: Callable[[], Any]) -> None:
        self._new_actor = new_actor
        self.actor = new_actor()
        self._events: list[Any] = []  # every assignment event of the run, in order
        self._confirmed = 0  # how many of them the actor confirmed it applied
        self._held: dict[str, Lease] = {}  # leases granted and not yet returned
        self._generation = 0
        self._restoring: asyncio.Lock | None = None

    def apply(self, event: Any) -> None:
        """Hand over one of the run's events (the pool keeps its assignment events)."""
        if isinstance(event, POOL_EVENTS):
            self._events.append(event)

    def held(self) -> list[str]:
        return sorted(self._held)

    @property
    def restores(self) -> int:
        """How many times a dead pool actor was replaced."""
        return self._generation

    async def _restore(self, generation: int) -> None:
        if self._restoring is None:
            self._restoring = asyncio.Lock()
        async with self._restoring:
            if generation != self._generation:
                return  # another request already restored it
            log.warning("mutator pool: its actor died; restoring it from %d assignment events and %d held seats",
                        len(self._events), len(self._held))
            self.actor = self._new_actor()
            events = list(self._events)
            await self.actor.restore.remote(events, list(self._held.values()))
            self._confirmed = len(events)
            self._generation += 1

    async def _call(self, method: str, *args: Any) -> Any:
        while True:
            generation, base = self._generation, self._confirmed
            try:
                answer, applied = await getattr(self.actor, method).remote(*args, base, self._events[base:])
            except ray.exceptions.RayActorError:
                await self._restore(generation)
                continue
            if generation == self._generation:
                self._confirmed = max(self._confirmed, applied)
            return answer

    async def acquire(self, island: int, lease_id: str) -> Lease:
        lease = await self._call("acquire", int(island), str(lease_id))
        self._held[lease.lease_id] = lease
        return lease

    async def release(self, lease: Lease) -> None:
        while True:
            generation = self._generation
            try:
                await self.actor.release.remote(lease)
                break
            except ray.exceptions.RayActorError:
                await self._restore(generation)
        self._held.pop(lease.lease_id, None)

    @contextlib.asynccontextmanager
    async def seat(self, island: int, lease_id: str) -> AsyncIterator[Lease]:
        """Hold a seat for one mutation of island ``island`` for the block's duration."""
        lease = await self.acquire(island, lease_id)
        try:
            yield lease
        finally:
            await self.release(lease)

    async def assignment(self) -> dict:
        return await self._call("assignment")

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)
