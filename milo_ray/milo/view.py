"""What MILO's parts other than the driver may see of a run: :class:`PopulationView`.

The orchestrator moves (:mod:`milo_ray.milo.orchestrator`), child handling
(:mod:`milo_ray.milo.children`), node recording (:mod:`milo_ray.milo.records`) and the
summary (:mod:`milo_ray.milo.summary`) take a ``PopulationView`` instead of the
driver class, so none of them imports :mod:`milo_ray.milo.loop` and the driver is
the only module that knows how rounds are scheduled.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from milo_ray.context import RunContext
from milo_ray.harness.model import Harness
from milo_ray.milo.config import MiloConfig
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.state import MiloState
from milo_ray.search.events import Event
from milo_ray.search.mutation import ValidationOptions
from milo_ray.search.recording import HarnessRecorder


class PopulationView(Protocol):
    """The run as its parts use it: config and services, the projected state, the one
    way to change that state (``emit``), and the few driver services they call."""

    cfg: MiloConfig
    ctx: RunContext  # seed, agent_calls, scheduler, store, benchmark
    state: MiloState
    run_dir: Path
    seeds: list[Harness]  # the seed harnesses this run may start from (method.seeds)
    pool_names: list[str]  # the mutator pool G
    forbidden: tuple[str, ...]  # task ids and instructions a child may not embed
    validation: ValidationOptions  # how the mutation runner validates children
    lock: asyncio.Lock  # held while B_search changes or a child is judged on it
    stop: bool
    harness_rows: HarnessRecorder  # the one writer of the run's harnesses rows (one per node)

    def emit(self, event: Event, *, island: int | None = None, round: int | None = None,
             harness_id: str | None = None) -> None:
        """Append the event to the store, then apply it to ``state``."""

    def harness(self, node: LineageNode) -> Harness:
        """A node's harness (sources are blobs in the store; this is their cache)."""

    def remember(self, harness: Harness) -> None:
        """Cache a harness whose node is about to be recorded."""

    def orchestrator(self) -> Any:
        """The orchestrator agent (built on first use)."""

    def orchestrator_spec(self) -> Any:
        """The orchestrator's ``_target_`` spec (or object), for the graft task that
        builds it where it runs."""

    def role_refused(self, role: str) -> str | None:
        """None while ``role`` may start new agent calls; otherwise why not (recorded
        once as a ``milo.role_budget`` event)."""

    def spawn(self, island: int) -> None:
        """Start driving a newly founded island."""
