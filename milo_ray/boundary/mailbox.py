"""A mailbox inside an async actor: one side hands items over, the other takes them in
batches with a long poll (one call returns as soon as anything arrived, or after its wait).
The rollout workers hand their outcomes to the driver this way, and the gateways their
call-journal records."""

from __future__ import annotations

import asyncio
from typing import Any


class Mailbox:
    """Items not yet taken. Used from one event loop (the actor's); its event is made on
    first use, inside that loop."""

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._arrived: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        return self._arrived

    def put(self, *items: Any) -> None:
        self._items.extend(items)
        self._event().set()

    def wake(self) -> None:
        """End a waiting :meth:`take` now, with whatever is held (perhaps nothing)."""
        self._event().set()

    async def take(self, wait_s: float) -> list[Any]:
        """Every item held, waiting up to ``wait_s`` for the first one."""
        event = self._event()
        if not self._items and wait_s > 0:
            try:
                await asyncio.wait_for(event.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        out, self._items = self._items, []
        event.clear()
        return out
