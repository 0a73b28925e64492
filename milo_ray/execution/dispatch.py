"""The rollout scheduler's dispatch rules, as a plain object (no Ray).

:class:`Dispatch` owns the queues of work waiting to run and decides, given the free
sandbox slots of each worker (or node), which item runs where. The scheduler carries the
decisions out (DESIGN §5.2: policies return decisions, the driver acts on them). The
rules:

* **FIFO within a group**: a group's items leave its queue in submission order; an
  item that comes back for a retry goes to the front (it was due first).
* **Round-robin across groups**: each group that may dispatch gets one item per turn,
  and a group that was served goes to the back of the turn order, also across calls
  to :meth:`Dispatch.pick`. When slots free up one at a time, a group with a long
  queue therefore cannot starve a group with a short one.
* **Group caps**: never more than the group's limit in flight (``set_limit``;
  ``default_limit`` for a group without one; None = only the slots bound it). A limit
  lowered below what is in flight stops that group until enough of it is done.
* **Most free worker**: each item goes to the worker with the most free slots at that
  moment, which spreads a batch across workers (and so across nodes); ties go to the
  smallest key, so the placement does not depend on the order workers were listed in.

Costs, for the driver of a 1,000-node cluster (``scripts/bench_dispatch_scale.py``
measures them): a pick takes O(free workers) to read the free-slot map it is given,
then O(log workers + log groups) per placed item (two heaps: free slots by worker,
groups by their place in the turn order). A group found at its limit is set aside
until :meth:`Dispatch.done` or :meth:`Dispatch.set_limit` lets it run again, so capped
groups cost nothing per turn. :meth:`~Dispatch.runnable` and :meth:`~Dispatch.queued`
are kept up to date as items move, O(1) each, because the scheduler asks for them on
every pump.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


def check_limit(name: str, limit: object) -> int | None:
    """``limit`` as a group limit (a positive integer, or None for no limit), else a
    ValueError naming ``name``."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{name}={limit!r} must be a positive integer, or None for no limit")
    return limit


class GroupLimits(Mapping[str, int]):
    """A read-only view of the per-group limits; assigning through it is refused with
    the call that does it instead (a silently ignored assignment would lift no cap)."""

    def __init__(self, limits: dict[str, int]) -> None:
        self._limits = limits

    def __getitem__(self, group: str) -> int:
        return self._limits[group]

    def __iter__(self) -> Iterator[str]:
        return iter(self._limits)

    def __len__(self) -> int:
        return len(self._limits)

    def __setitem__(self, group: str, limit: int) -> None:
        raise TypeError(f"group limits are read-only here: call set_group_limit({group!r}, {limit!r}) instead")

    def __repr__(self) -> str:
        return f"GroupLimits({self._limits!r})"


class Dispatch(Generic[T]):
    """Per-group FIFO queues, per-group in-flight counts, and the dispatch rules over them.

    The caller reports each dispatched item's end with :meth:`done` (finished, failed
    or lost alike: the count is of items the caller holds, not of successes)."""

    def __init__(self, default_limit: int | None = None, limits: Mapping[str, int] | None = None) -> None:
        # Read-only after construction (a property): a changed default would have to
        # re-check every group set aside at its limit.
        self._default_limit = check_limit("default_group_limit", default_limit)
        self._limits: dict[str, int] = {}
        for group, limit in (limits or {}).items():
            self._limits[group] = check_limit(f"group_limits[{group!r}]", limit)
        # A group is present only while it has queued items.
        self._queues: dict[str, deque[T]] = {}
        self._in_flight: Counter[str] = Counter()
        # The turn order: each queued group holds a ticket, handed out when the group
        # gets its first queued item and again each time it is served, so the smallest
        # ticket is the group whose turn it is and a served group goes to the back. A
        # group at its limit keeps its ticket in ``_held`` (it keeps its place, as if it
        # had been skipped on every turn) and returns to the ``_turns`` heap when it may
        # run again. A group in ``_turns`` may have reached a lowered limit meanwhile: it
        # is moved to ``_held`` when its ticket comes up.
        self._tickets = itertools.count()
        self._turns: list[tuple[int, str]] = []
        self._held: dict[str, int] = {}
        self._queued = 0
        self._runnable = 0

    @property
    def default_limit(self) -> int | None:
        return self._default_limit

    # --- limits -----------------------------------------------------------------------
    def set_limit(self, group: str, limit: int | None) -> None:
        """Cap ``group`` at ``limit`` in flight; None returns it to ``default_limit``.
        Items already in flight are not recalled; the group waits until it is under."""
        limit = check_limit(f"limit of group {group!r}", limit)
        before = self._runnable_of(group)
        if limit is None:
            self._limits.pop(group, None)
        else:
            self._limits[group] = limit
        self._runnable += self._runnable_of(group) - before
        self._release(group)

    def limit(self, group: str) -> int | None:
        return self._limits.get(group, self._default_limit)

    @property
    def limits(self) -> GroupLimits:
        """The groups with a limit of their own (read-only)."""
        return GroupLimits(self._limits)

    # --- queues -----------------------------------------------------------------------
    def submit(self, group: str, item: T) -> None:
        """Queue ``item`` at the back of its group's queue."""
        self._queue_for(group).append(item)

    def requeue(self, group: str, item: T) -> None:
        """Queue an item that ran before (a retry) at the front of its group's queue."""
        self._queue_for(group).appendleft(item)

    def _queue_for(self, group: str) -> deque[T]:
        """``group``'s queue, about to receive one item (the counts are updated for it)."""
        queue = self._queues.get(group)
        if queue is None:
            queue = self._queues[group] = deque()
            heapq.heappush(self._turns, (next(self._tickets), group))
        limit = self.limit(group)
        if limit is None or len(queue) < limit - self._in_flight[group]:
            self._runnable += 1
        self._queued += 1
        return queue

    def clear(self) -> list[T]:
        """Remove and return every queued item (in-flight counts are unchanged)."""
        items = [item for queue in self._queues.values() for item in queue]
        self._queues.clear()
        self._turns.clear()
        self._held.clear()
        self._queued = self._runnable = 0
        return items

    def queued(self) -> int:
        return self._queued

    def runnable(self) -> int:
        """Queued items that could start now if there were slots: each group's queue,
        cut to what its limit still allows (what the pool sizes its workers for)."""
        return self._runnable

    def _runnable_of(self, group: str) -> int:
        queue = self._queues.get(group)
        if not queue:
            return 0
        limit = self.limit(group)
        return len(queue) if limit is None else max(0, min(len(queue), limit - self._in_flight[group]))

    def in_flight(self, group: str) -> int:
        return self._in_flight[group]

    def in_flight_by_group(self) -> dict[str, int]:
        return {g: n for g, n in self._in_flight.items() if n}

    # --- decisions --------------------------------------------------------------------
    def pick(self, free_slots_by_node: Mapping[str, int]) -> list[tuple[str, T]]:
        """Take queued items for the free slots: ``(node, item)`` in dispatch order.

        Each picked item counts as in flight for its group until :meth:`done`."""
        picks: list[tuple[str, T]] = []
        turns = self._turns
        if not turns:
            return picks
        # Most free slots first, ties to the smallest key: the heap's order.
        slots = [(-n, node) for node, n in free_slots_by_node.items() if n > 0]
        heapq.heapify(slots)
        queues, in_flight, held, tickets = self._queues, self._in_flight, self._held, self._tickets
        while slots and turns:
            ticket, group = heapq.heappop(turns)
            limit = self._limits.get(group, self._default_limit)
            if limit is not None and in_flight[group] >= limit:
                held[group] = ticket
                continue
            queue = queues[group]
            neg_free, node = slots[0]
            picks.append((node, queue.popleft()))
            if neg_free == -1:
                heapq.heappop(slots)
            else:
                heapq.heapreplace(slots, (neg_free + 1, node))
            n = in_flight[group] = in_flight[group] + 1
            # The group was under its limit with an item queued: that item was runnable.
            self._queued -= 1
            self._runnable -= 1
            if not queue:
                del queues[group]
            elif limit is not None and n >= limit:
                held[group] = next(tickets)  # served: back of the turn order, and waits
            else:
                heapq.heappush(turns, (next(tickets), group))
        return picks

    def done(self, group: str) -> None:
        """One item of ``group`` that :meth:`pick` handed out is no longer in flight."""
        if self._in_flight[group] <= 0:
            raise RuntimeError(f"Dispatch.done({group!r}) without an item of that group in flight")
        before = self._runnable_of(group)
        self._in_flight[group] -= 1
        self._runnable += self._runnable_of(group) - before
        self._release(group)

    def _release(self, group: str) -> None:
        """Back into the turn order, in its old place, if ``group`` was held at a limit
        it is now under."""
        if group in self._held:
            limit = self.limit(group)
            if limit is None or self._in_flight[group] < limit:
                heapq.heappush(self._turns, (self._held.pop(group), group))
