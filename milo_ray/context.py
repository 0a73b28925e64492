"""What a method receives from the entry point: one object, built once per run."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from milo_ray.benchmarks.base import Benchmark
from milo_ray.config.schemas import ModelConfig, model_config
from milo_ray.search.agent_calls import AgentCallLog
from milo_ray.store.base import RunStore


@dataclass
class RunContext:
    """Run-wide services. ``deadline`` is a ``time.monotonic()`` instant (or None):
    past it a method starts no new work, settles in-flight work, then runs its final
    evaluation and summary. ``scheduler`` is a ``milo_ray.execution.scheduler.RolloutScheduler``.
    ``elapsed_before_s``: seconds the earlier sessions of a resumed run already spent;
    time limits count them (``deadline`` already does). ``agents``: the ``backend.agents``
    config (mutators, orchestrator, judge, optimizer, embedder), checked before the run
    started. ``agent_calls``: the run's :class:`~milo_ray.search.agent_calls.AgentCallLog`;
    every agent call is recorded there. ``session``: this session of the run (a resumed run gets a new one);
    agents built for it are never reused by another run or session. ``model``: the solver's
    :class:`~milo_ray.config.schemas.ModelConfig` (checked; ``model.id == model_id``, the cache
    identity; a context built without one gets the model named by ``model_id``).
    ``budget``: the run's budget ledger (the scheduler's). ``agent_env``: the driver's
    values of the key variables the LLM agents read, handed to their Ray tasks (never
    stored)."""

    run_id: str
    run_dir: Path
    seed: int
    store: RunStore
    benchmark: Benchmark
    scheduler: Any
    model_id: str
    deadline: float | None = None
    resumed: bool = False
    elapsed_before_s: float = 0.0
    agents: dict[str, Any] = field(default_factory=dict)
    agent_calls: Any = None
    session: str = field(default_factory=lambda: uuid.uuid4().hex)
    model: ModelConfig | None = None
    agent_env: dict[str, str] = field(default_factory=dict)
    # The run's ``sandbox`` config as a plain mapping: mutation children are import-checked
    # in that kind of sandbox (None: the default, bwrap).
    sandbox: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.model = model_config(self.model if self.model is not None else {"id": self.model_id})
        if self.model.id != self.model_id:
            raise ValueError(f"RunContext: model.id={self.model.id!r} but model_id={self.model_id!r}; the cache "
                             "identity has one source (model.id)")
        if self.agent_calls is None:
            self.agent_calls = AgentCallLog(self.store, budget=getattr(self.scheduler, "budget", None),
                                            resumed=self.resumed)

    @property
    def budget(self) -> Any:
        """The run's :class:`~milo_ray.execution.budget.BudgetLedger` (None without a scheduler ledger)."""
        return getattr(self.scheduler, "budget", None)

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def out_of_time(self) -> bool:
        return self.time_left() <= 0


class Method(Protocol):
    """A search method (eval, milo, ssr). Built by Hydra from ``cfg.method``."""

    name: str

    def run(self, ctx: RunContext) -> dict[str, Any]:
        """Run to completion (or until the deadline/budget), return a JSON-able summary
        that the entry point prints and stores in the manifest."""
        ...
