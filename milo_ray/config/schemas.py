"""Structured configs for the entry point (Hydra ConfigStore).

The top-level ``Config`` types the run-level keys every method honours; each
swappable part is one Hydra group under ``conf/`` (method, benchmark, executor, backend,
model, execution) built with ``_target_``. The benchmark supplies tasks, splits, grading
data and seed harnesses; the executor says how one harness runs on one task and gets the
``model`` by interpolation; ``model.id`` is the one cache identity of the solver. Method schemas register here as
``<method>_schema`` so ``conf/method/<method>.yaml`` files are type-checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from milo_ray.core.llm_endpoint import LLMEndpoint
from milo_ray.core.problems import Problem, raise_invalid


def setting(default: Any = dataclasses.MISSING, *, help: str, factory: Any = dataclasses.MISSING) -> Any:
    """A schema field with its one-line ``--help`` text (``milo_ray.config.help`` lists it)."""
    return field(default=default, default_factory=factory, metadata={"help": help})


@dataclass
class RoleBudgetConfig:
    """Caps of one agent role (``run.budget.roles.<role>``); None: unlimited."""

    tokens: Optional[int] = setting(None, help="token cap of this agent role (null: unlimited)")
    cost_usd: Optional[float] = setting(None, help="USD cap of this agent role (null: unlimited)")


@dataclass
class RoleBudgetsConfig:
    """``run.budget.roles``: one set of caps per agent role."""

    solver: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    mutator: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    orchestrator: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    judge: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    optimizer: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    embedder: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)
    grader: RoleBudgetConfig = field(default_factory=RoleBudgetConfig)


@dataclass
class SweepBudgetConfig:
    """``run.budget.sweep``: the spend cap of the sweep this run is a job of, set by the
    ``ray_jobs`` launcher from ``hydra.launcher.max_usd`` (not by hand). ``ledger`` names the
    sweep's shared ledger (a detached actor every job of the sweep charges); ``cost_usd`` is
    the sweep's cap. Both null: the run is not part of a capped sweep."""

    ledger: Optional[str] = setting(None, help="the sweep's shared spend ledger (set by the launcher)")
    cost_usd: Optional[float] = setting(None, help="the sweep's USD cap, every job's model calls together "
                                                   "(hydra.launcher.max_usd)")


@dataclass
class BudgetConfig:
    """Caps on what a run may spend. ``executions`` counts rollouts (cached ones are
    free); None means unlimited. ``tokens`` and ``cost_usd`` count rollouts and every
    agent call of the search (the ``agent_calls`` table) and stop new work once
    reached; with an executor whose model calls go through the gateway
    (``executor=deepagents``) they also stop the running rollouts' calls (stop reason
    ``run_budget``; docs/security.md states the overrun bound). ``roles``: per-role caps, e.g. ``run.budget.roles.judge.tokens=2000000``
    (roles: solver, mutator, orchestrator, judge, optimizer, embedder, grader); reaching one
    stops new work of that role, and the run ends with its incumbent."""

    executions: Optional[int] = setting(None, help="rollout budget; cached rollouts are free (null: unlimited)")
    tokens: Optional[int] = setting(None, help="token cap on rollouts and agent calls (null: unlimited)")
    cost_usd: Optional[float] = setting(None, help="USD cap on rollouts and agent calls; needs model prices "
                                                   "(null: unlimited)")
    roles: RoleBudgetsConfig = setting(factory=RoleBudgetsConfig, help="per-role caps")
    sweep: SweepBudgetConfig = setting(factory=SweepBudgetConfig, help="the cap of the sweep this run is a job of "
                                                                       "(set by hydra.launcher.max_usd)")


@dataclass
class RunConfig:
    """Run-level keys.

    dir: the run directory, the only directory a run writes (default:
        ``runs/<timestamp>``; in a multirun sweep, the sweep's directory, one
        subdirectory per job).
    resume: path of an interrupted run to continue; its stored config is used (only
        ``run.time_limit_s``, ``run.progress``, ``run.report``, ``run.budget.*`` and ``execution.*`` may be
        given again), finished rollouts are never executed again.
    seed: the run seed; every island, candidate and rollout derives its own from it.
    time_limit_s: wall-clock limit of the run, honoured by every method; past it no new
        work starts, in-flight work settles, then the final evaluation and summary run.
        A resumed run keeps its stored limit (unless given again) and counts the time
        its earlier sessions ran.
    progress: live progress display (rollouts, one line per MILO island or SSR race, the
        run's best, spend and ETA): None (default) shows it on a terminal only, True also
        as plain ``[progress]`` lines on stderr when there is none, False never.
    report: when the run finishes, write its report (``<run dir>/report/report.html`` with
        its figures, as ``python -m milo_ray.report RUN_DIR`` does) and print its path;
        False skips it (a failing report is logged and never fails the run).
    skip_unrunnable_tasks: a task the configured sandbox cannot run (e.g. a Dockerfile with
        RUN steps under ``sandbox=bwrap``) refuses the whole run by default, naming every
        such task; True drops those tasks from every split instead, with a warning per task
        on the console and in ``run.log``, an ``tasks_skipped`` event and the manifest's
        ``skipped_tasks``.
    """

    dir: Optional[str] = setting(None, help="the run directory, the only one a run writes (default runs/<timestamp>)")
    resume: Optional[str] = setting(None, help="continue an interrupted run from its directory, with its stored config")
    seed: int = setting(0, help="the run seed (islands, candidates and rollouts derive theirs)")
    time_limit_s: Optional[float] = setting(None, help="wall-clock limit of the run, earlier sessions counted "
                                                       "(null: none)")
    budget: BudgetConfig = setting(factory=BudgetConfig, help="what the run may spend")
    progress: Optional[bool] = setting(None, help="live progress (rollouts, islands/races, best, spend, ETA; "
                                                  "true/false; null: when a terminal)")
    report: bool = setting(True, help="write the run's HTML report when it finishes")
    skip_unrunnable_tasks: bool = setting(False, help="drop tasks the sandbox cannot run, with a warning, instead "
                                                      "of refusing the run")


@dataclass
class ExecutionConfig:
    """Where rollouts run.

    address: None starts (or joins, if ``join_running``) a Ray instance on this machine;
        ``auto`` or ``ray://host:10001`` joins an existing cluster.
    join_running: with address None, join a Ray instance started on this machine with
        `ray start` (so concurrent multirun jobs share it) instead of starting a private one.
    num_cpus: CPUs of a locally started instance (None: all).
    slots_per_node: sandbox slots (the Ray resource ``slot_resource``) the node of a
        locally started instance declares; on a one-node instance that declares none,
        the rollouts that node runs at once.
    slot_resource: the Ray resource a node declares per sandbox it can run (``ray start
        --resources='{"sandbox_slot": 8}'``); each running rollout holds one, so the
        autoscaler sees the demand and concurrent runs never oversubscribe a node.
    slots_per_worker: slots of one rollout worker actor (one process running that many
        rollouts as coroutines); None: ``slots_per_node``. Capped at the smallest slot
        count a node declares; a node's slots are best a multiple of it.
    max_workers: cap on the worker actors of one run (None: as many as its queue fills).
    worker_idle_s: a worker with no rollout for this long is released, its slots with it
        (so the autoscaler can remove an idle node).
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
    slot_resource: str = "sandbox_slot"
    slots_per_worker: Optional[int] = None
    max_workers: Optional[int] = None
    worker_idle_s: float = 60.0
    group_limit: Optional[int] = None
    max_retries: int = 3
    dashboard: bool = False


OFFLINE_MODEL_ID = "offline-surrogate"


@dataclass
class ModelConfig(LLMEndpoint):
    """``model``: the frozen solver. The executor receives it as ``${model}``.

    id: the model's cache identity, part of every rollout's cache key (runs against
        different models never share results). Defaults to ``solver`` when that is set.
    solver: the litellm model string (``openai/NAME``, ``bedrock/...``, ``anthropic/...``,
        ``hosted_vllm/...``); None offline, where the surrogate executor simulates the solver.
    extra_body: extra JSON fields sent with every request (e.g. vLLM sampling options).

    The endpoint fields (``api_base``, ``api_key_env``, ``temperature``, retries, ``rpm`` /
    ``tpm``, prices) are :class:`~milo_ray.core.llm_endpoint.LLMEndpoint`'s, shared with every
    search role's ``llm`` block. The prices price every rollout whose executor reports no
    cost of its own, which is what ``run.budget.cost_usd`` counts.
    """

    id: Optional[str] = None
    solver: Optional[str] = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def check(self) -> "ModelConfig":
        """This config with ``id`` filled in from ``solver`` when not given;
        :class:`~milo_ray.core.problems.InvalidSettings` (a ``ValueError``) listing every
        problem, each naming the field and the fix."""
        problems = []
        if self.solver is not None and (not isinstance(self.solver, str) or not self.solver.strip()
                                        or any(c.isspace() for c in self.solver)):
            problems.append(Problem(f"model.solver={self.solver!r}", "not a litellm model string",
                                    "give one such as openai/gpt-4o-mini, anthropic/claude-sonnet-4-5 or "
                                    "bedrock/<model id>"))
        ident = self.id if self.id not in (None, "") else self.solver
        if not ident and not problems:
            problems.append(Problem("model.solver", "missing", "give the litellm model string (e.g. "
                                    "model.solver=openai/gpt-4o-mini), or at least model.id, the model's cache identity"))
        problems += self.endpoint_problems("model")
        if not isinstance(self.extra_body, Mapping):
            problems.append(Problem("model.extra_body", f"must be a mapping of extra request fields, got "
                                    f"{type(self.extra_body).__name__}"))
        raise_invalid(problems)
        return dataclasses.replace(self, id=str(ident), extra_body=dict(self.extra_body))


def model_config(value: Any = None) -> ModelConfig:
    """A checked :class:`ModelConfig` from a ModelConfig, a mapping (a composed ``model``
    node, or the ``${model}`` an executor receives) or None (the offline model)."""
    if value is None:
        return ModelConfig(id=OFFLINE_MODEL_ID).check()
    if isinstance(value, ModelConfig):
        return value.check()
    if type(value).__name__ == "DictConfig":
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, Mapping):
        raise ValueError(f"model: expected a mapping of model fields, got {type(value).__name__}")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"model.{unknown[0]}: unknown model field; the fields are {sorted(known)}")
    return ModelConfig(**value).check()


@dataclass
class AgentsConfig:
    """The agents of the search, each a ``_target_`` spec built where it runs.

    mutators: MILO's mutator pool G (``method.pool_size`` takes the first N), each spec
        named by its ``name`` key (else its personality/model/class; names are unique);
        a spec's ``seats`` key (an integer >= 1) is how many mutations its account allows
        at once, shared by every spec of every run on the cluster with the same account
        (CLI binary, or provider key variable + api base); without it a spec gets
        ``method.mutator_concurrency`` concurrent mutations in each run;
    orchestrator: MILO's orchestrator; judge, optimizer, embedder: SSR's evidence
    judge, candidate optimizer and record embedder.

    Before a run writes anything every spec given is checked without being built (its
    ``_target_`` importable, every key a keyword its constructor accepts), and every
    role the method declares in ``agent_roles`` must be set
    (:mod:`milo_ray.config.targets`)."""

    mutators: list[Any] = field(default_factory=list)
    orchestrator: Any = None
    judge: Any = None
    optimizer: Any = None
    embedder: Any = None


@dataclass
class BackendConfig(LLMEndpoint):
    """``backend``: which agents run the search (offline stand-ins or LLM agents).

    The other fields are the default model of every LLM search role (``backend=litellm``
    hands them to each agent spec's ``llm``; a spec may override any of them, e.g.
    ``backend.agents.judge.llm.model=...``): ``model`` is the litellm model string,
    ``context_tokens`` how much one call may read (the judge condenses longer
    trajectories), and the endpoint fields are :class:`LLMEndpoint`'s, as for the solver.
    Setting ``model`` with a backend whose agents use no LLM is refused, never ignored.
    """

    agents: AgentsConfig = field(default_factory=AgentsConfig)
    model: Optional[str] = None
    request_timeout_s: Optional[float] = 600.0
    context_tokens: int = 128000


@dataclass
class MlflowTrackingConfig:
    """``tracking=mlflow``: also log the run to MLflow (params, per-round metrics, final
    test metrics, manifest and report). uri: the tracking store (None: a local file store
    ``<run dir>/mlruns``); experiment: the MLflow experiment's name."""

    _target_: str = "milo_ray.tracking.mlflow.MlflowTracking"
    uri: Optional[str] = None
    experiment: str = "milo_ray"


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    benchmark: Any = MISSING
    executor: Any = MISSING
    # The sandbox real executors run agents in (conf/sandbox/); the surrogate ignores it.
    sandbox: Any = None
    method: Any = MISSING
    # Experiment tracking (conf/tracking/: none, mlflow); None in runs stored before it existed.
    tracking: Any = None


@dataclass
class EvalConfig:
    """Evaluate harnesses (the benchmark's seeds by default) with k rollouts per task.

    k: rollouts per (harness, task).
    split: which split to evaluate.
    names: seed names to keep (empty: all)."""

    _target_: str = "milo_ray.evaluation.EvalMethod"
    k: int = 5
    split: str = "test"
    names: list[str] = field(default_factory=list)


def register_configs() -> None:
    """Register the top-level schema and every method schema, and the config resolvers
    (idempotent). ``${cpu_count:}``: this machine's CPUs (CPU-bound executors run one
    rollout per core, e.g. the instance-level experiments)."""
    import os

    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("cpu_count", lambda: os.cpu_count() or 1, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="execution", name="execution_schema", node=ExecutionConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="backend", name="backend_schema", node=BackendConfig)
    cs.store(group="method", name="eval_schema", node=EvalConfig)
    cs.store(group="tracking", name="mlflow_schema", node=MlflowTrackingConfig)
    for group_name, module, cls in _METHOD_SCHEMAS:
        mod = __import__(module, fromlist=[cls])
        cs.store(group="method", name=group_name, node=getattr(mod, cls))


_METHOD_SCHEMAS: list[tuple[str, str, str]] = [
    ("milo_schema", "milo_ray.milo.config", "MiloConfig"),
    ("ssr_schema", "milo_ray.ssr.config", "SSRConfig"),
]
