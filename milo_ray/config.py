"""Structured configs for the entry point (Hydra ConfigStore).

The top-level ``Config`` types the run-level keys every method honours; each
swappable part is one Hydra group under ``conf/`` (method, benchmark, backend, model,
execution) built with ``_target_``. Method schemas register here as
``<method>_schema`` so ``conf/method/<method>.yaml`` files are type-checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class BudgetConfig:
    """Caps on what a run may spend. ``executions`` counts rollouts (cached ones are
    free); None means unlimited. Token and USD caps stop new work once reached."""

    executions: Optional[int] = None
    tokens: Optional[int] = None
    cost_usd: Optional[float] = None


@dataclass
class RunConfig:
    """Run-level keys.

    dir: the run directory (default: Hydra's output dir for this job).
    resume: path of an interrupted run to continue; its stored config is used, finished
        rollouts are never executed again.
    seed: the run seed; every island, candidate and rollout derives its own from it.
    time_limit_s: wall-clock limit; past it no new work starts, in-flight work settles,
        then the final evaluation and summary run.
    progress: live progress display (None: only when stdout is a terminal).
    """

    dir: Optional[str] = None
    resume: Optional[str] = None
    seed: int = 0
    time_limit_s: Optional[float] = None
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    progress: Optional[bool] = None


@dataclass
class ExecutionConfig:
    """Where rollouts run.

    address: None starts (or joins, if ``join_running``) a Ray instance on this machine;
        ``auto`` or ``ray://host:10001`` joins an existing cluster.
    join_running: with address None, join a Ray instance started on this machine with
        `ray start` (so concurrent multirun jobs share it) instead of starting a private one.
    num_cpus: CPUs of a locally started instance (None: all).
    slots_per_node: sandbox slots per node (custom resource ``sandbox_slot``); the
        rollout concurrency of each node's worker.
    group_limit: max concurrent rollouts of one island or race (None: unlimited).
    max_retries: retries of an infrastructure failure before it is recorded.
    dashboard: start the Ray dashboard with a locally started instance.
    """

    address: Optional[str] = None
    join_running: bool = True
    num_cpus: Optional[int] = None
    slots_per_node: int = 8
    group_limit: Optional[int] = None
    max_retries: int = 3
    dashboard: bool = False


@dataclass
class ModelConfig:
    """The frozen solver model. ``id`` is part of every rollout's cache key."""

    id: str = "offline-surrogate"


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    backend: Any = MISSING
    benchmark: Any = MISSING
    method: Any = MISSING


@dataclass
class EvalConfig:
    """Evaluate harnesses (the benchmark's seeds by default) with k rollouts per task.

    split: which split to evaluate; names: seed names to keep (empty: all)."""

    _target_: str = "milo_ray.evaluation.EvalMethod"
    k: int = 5
    split: str = "test"
    names: list[str] = field(default_factory=list)


def register_configs() -> None:
    """Register the top-level schema and every method schema (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="execution", name="execution_schema", node=ExecutionConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="method", name="eval_schema", node=EvalConfig)
    for group_name, module, cls in _METHOD_SCHEMAS:
        mod = __import__(module, fromlist=[cls])
        cs.store(group="method", name=group_name, node=getattr(mod, cls))


_METHOD_SCHEMAS: list[tuple[str, str, str]] = [
    ("milo_schema", "milo_ray.milo.config", "MiloConfig"),
    ("ssr_schema", "milo_ray.ssr.config", "SSRConfig"),
]
