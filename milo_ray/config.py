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
class RoleBudgetConfig:
    """Caps of one agent role (``run.budget.roles.<role>``); None: unlimited."""

    tokens: Optional[int] = None
    cost_usd: Optional[float] = None


@dataclass
class RoleBudgetsConfig:
    """``run.budget.roles``: one set of caps per agent role."""

    solver: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    mutator: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    orchestrator: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    judge: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    optimizer: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    embedder: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)


@dataclass
class BudgetConfig:
    """Caps on what a run may spend. ``executions`` counts rollouts (cached ones are
    free); None means unlimited. ``tokens`` and ``cost_usd`` count rollouts and every
    agent call of the search (the ``agent_calls`` table) and stop new work once
    reached. ``roles``: per-role caps, e.g. ``run.budget.roles.judge.tokens=2000000``
    (roles: solver, mutator, orchestrator, judge, optimizer, embedder); reaching one
    stops new work of that role, and the run ends with its incumbent."""

    executions: Optional[int] = None
    tokens: Optional[int] = None
    cost_usd: Optional[float] = None
    roles: RoleBudgetsConfig = field(default_factory=RoleBudgetsConfig)


@dataclass
class RunConfig:
    """Run-level keys.

    dir: the run directory, the only directory a run writes (default:
        ``runs/<timestamp>``; in a multirun sweep, the sweep's directory, one
        subdirectory per job).
    resume: path of an interrupted run to continue; its stored config is used (only
        ``run.time_limit_s``, ``run.progress``, ``run.budget.*`` and ``execution.*`` may be
        given again), finished rollouts are never executed again.
    seed: the run seed; every island, candidate and rollout derives its own from it.
    time_limit_s: wall-clock limit of the run, honoured by every method; past it no new
        work starts, in-flight work settles, then the final evaluation and summary run.
        A resumed run keeps its stored limit (unless given again) and counts the time
        its earlier sessions ran.
    progress: live progress display: True shows it on a terminal, False never, None
        (default) also only on a terminal. A pipe or a log file never gets one.
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
    group_limit: max concurrent rollouts of a group that sets no limit of its own: an
        SSR race, one harness of ``method=eval``, MILO's seed and final evaluations
        (None: only the slots limit). MILO islands use ``method.island_concurrency``.
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
    """The frozen solver model. ``id`` is part of every rollout's cache key.

    usd_per_mtok_input / usd_per_mtok_output: prices in USD per million tokens. They
        price every rollout whose executor reports no cost of its own, which is what
        ``run.budget.cost_usd`` counts; None: the model is unpriced, and a USD cap is
        refused rather than silently never reached.
    """

    id: str = "offline-surrogate"
    usd_per_mtok_input: Optional[float] = None
    usd_per_mtok_output: Optional[float] = None


@dataclass
class AgentsConfig:
    """The agents of the search, each a ``_target_`` spec built where it runs.

    mutators: MILO's mutator pool G (``method.pool_size`` takes the first N);
    orchestrator: MILO's orchestrator; judge, optimizer, embedder: SSR's evidence
    judge, candidate optimizer and record embedder."""

    mutators: list[Any] = field(default_factory=list)
    orchestrator: Any = None
    judge: Any = None
    optimizer: Any = None
    embedder: Any = None


@dataclass
class BackendConfig:
    """``backend``: which agents run the search (offline stand-ins or LLM agents)."""

    agents: AgentsConfig = field(default_factory=AgentsConfig)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
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
    cs.store(group="backend", name="backend_schema", node=BackendConfig)
    cs.store(group="method", name="eval_schema", node=EvalConfig)
    for group_name, module, cls in _METHOD_SCHEMAS:
        mod = __import__(module, fromlist=[cls])
        cs.store(group="method", name=group_name, node=getattr(mod, cls))


_METHOD_SCHEMAS: list[tuple[str, str, str]] = [
    ("milo_schema", "milo_ray.milo.config", "MiloConfig"),
    ("ssr_schema", "milo_ray.ssr.config", "SSRConfig"),
]
