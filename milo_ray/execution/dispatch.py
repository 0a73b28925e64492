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

Every pick costs O(workers) per placed item plus O(groups) per turn: the worker counts
are small (a few per node), and the turns are bounded by the free slots.
"""

from __future__ import annotations

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
        self.default_limit = check_limit("default_group_limit", default_limit)
        self._limits: dict[str, int] = {}
        for group, limit in (limits or {}).items():
            self._limits[group] = check_limit(f"group_limits[{group!r}]", limit)
        # Insertion order is the turn order: a served group is moved to the end. A group
        # is present only while it has queued items.
        self._queues: dict[str, deque[T]] = {}
        self._in_flight: Counter[str] = Counter()

    # --- limits -----------------------------------------------------------------------
    def set_limit(self, group: str, limit: int | None) -> None:
        """Cap ``group`` at ``limit`` in flight; None returns it to ``default_limit``.
        Items already in flight are not recalled; the group waits until it is under."""
        limit = check_limit(f"limit of group {group!r}", limit)
        if limit is None:
            self._limits.pop(group, None)
        else:
            self._limits[group] = limit

    def limit(self, group: str) -> int | None:
        return self._limits.get(group, self.default_limit)

    @property
    def limits(self) -> GroupLimits:
        """The groups with a limit of their own (read-only)."""
        return GroupLimits(self._limits)

    # --- queues -----------------------------------------------------------------------
    def submit(self, group: str, item: T) -> None:
        """Queue ``item`` at the back of its group's queue."""
        self._queues.setdefault(group, deque()).append(item)

    def requeue(self, group: str, item: T) -> None:
        """Queue an item that ran before (a retry) at the front of its group's queue."""
        self._queues.setdefault(group, deque()).appendleft(item)

    def clear(self) -> list[T]:
        """Remove and return every queued item (in-flight counts are unchanged)."""
        items = [item for queue in self._queues.values() for item in queue]
        self._queues.clear()
        return items

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def runnable(self) -> int:
        """Queued items that could start now if there were slots: each group's queue,
        cut to what its limit still allows (what the pool sizes its workers for)."""
        total = 0
        for group, queue in self._queues.items():
            limit = self.limit(group)
            total += len(queue) if limit is None else max(0, min(len(queue), limit - self._in_flight[group]))
        return total

    def in_flight(self, group: str) -> int:
        return self._in_flight[group]

    def in_flight_by_group(self) -> dict[str, int]:
        return {g: n for g, n in self._in_flight.items() if n}

    # --- decisions --------------------------------------------------------------------
    def pick(self, free_slots_by_node: Mapping[str, int]) -> list[tuple[str, T]]:
        """Take queued items for the free slots: ``(node, item)`` in dispatch order.

        Each picked item counts as in flight for its group until :meth:`done`."""
        free = {node: n for node, n in free_slots_by_node.items() if n > 0}
        picks: list[tuple[str, T]] = []
        while free:
            served = False
            for group in list(self._queues):  # one turn: at most one item per group
                if not free:
                    break
                limit = self.limit(group)
                if limit is not None and self._in_flight[group] >= limit:
                    continue
                queue = self._queues.pop(group)
                item = queue.popleft()
                if queue:
                    self._queues[group] = queue  # back of the turn order
                self._in_flight[group] += 1
                node = min(free, key=lambda n: (-free[n], n))
                picks.append((node, item))
                free[node] -= 1
                if not free[node]:
                    del free[node]
                served = True
            if not served:
                break
        return picks

    def done(self, group: str) -> None:
        """One item of ``group`` that :meth:`pick` handed out is no longer in flight."""
        if self._in_flight[group] <= 0:
            raise RuntimeError(f"Dispatch.done({group!r}) without an item of that group in flight")
        self._in_flight[group] -= 1
