"""Running a task check: compose the config as a run does, load the suite keeping the
invalid tasks as verdicts, make the static checks, run every runnable task's reference
solution (``repeat`` times) and a do-nothing agent through the rollout scheduler in one
batch, and decide each task's verdict.

The config is composed from ``conf/`` with the same overrides a run takes
(``benchmark=harbor|swe`` is chosen from PATH; ``sandbox=docker sandbox.host_mounts=[/usr,/etc]``,
``benchmark.test_cmd=...``, ``execution.num_cpus=2`` ... apply as they would to a run), so
a suite checked here is loaded and sandboxed exactly as the run will load and sandbox it.
Every task of PATH is checked whatever ``benchmark.splits`` says; the splits (and
``split_seed``) are used only to divide the ``ok`` tasks in the split file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from milo_ray.config.errors import UserError
from milo_ray.tasks.verdicts import UNRUNNABLE, Graded, StaticFindings, TaskVerdict, decide

CHECK_SPLIT = "check"


@dataclass
class CheckResult:
    """The check of one suite: a verdict per task (in task-id order), the composed
    config's benchmark section, the sandbox's name and the wall time."""

    suite: str
    kind: str  # harbor | swe
    sandbox: str
    verdicts: list[TaskVerdict]
    benchmark_cfg: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    repeat: int = 1

    def by_verdict(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for v in self.verdicts:
            out.setdefault(v.verdict, []).append(v.task_id)
        return out


def suite_kind(path: Path) -> str:
    """``paperbench`` for a directory of PaperBench papers (a ``rubric.json`` in it or in a
    directory of it), ``are`` for ARE scenarios (a directory of scenario JSON or a JSONL
    file of them), ``harbor`` for any other directory, ``swe`` for any other JSONL file;
    ``UserError`` otherwise."""
    from milo_ray.benchmarks.are.scenarios import looks_like_suite

    if looks_like_suite(path):
        return "are"
    if path.is_dir():
        if (path / "rubric.json").is_file() or any((d / "rubric.json").is_file() for d in path.iterdir()):
            return "paperbench"
        return "harbor"
    if path.is_file() and path.suffix in (".jsonl", ".json", ".ndjson"):
        return "swe"
    if not path.exists():
        raise UserError(f"PATH={str(path)!r}: no such file or directory (give a directory of Harbor tasks or a "
                        "JSONL file of SWE rows)")
    raise UserError(f"PATH={str(path)!r}: neither a directory of Harbor tasks nor a .jsonl file of SWE rows")


def compose(path: Path, overrides: Sequence[str] = ()) -> tuple[str, Any]:
    """(kind, config) composed from ``conf/`` as ``python -m milo_ray.run benchmark=KIND
    benchmark.path=PATH *overrides`` would compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from milo_ray.config.schemas import register_configs
    from milo_ray.config.paths import conf_dir

    kind = suite_kind(path)
    # benchmark=KIND naming what PATH is anyway is accepted (a run's command line, reused).
    overrides = [o for o in overrides if o.lstrip("+") != f"benchmark={kind}"]
    for o in overrides:
        if o.split("=", 1)[0].lstrip("+~") in ("benchmark", "benchmark.path"):
            raise UserError(f"{o}: the check chooses the benchmark from PATH ({kind}); give the suite as PATH")
    register_configs()
    OmegaConf.register_new_resolver("first_set", lambda *xs: next((x for x in xs if x not in (None, "")), None),
                                    replace=True)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=[f"benchmark={kind}", f"benchmark.path={path}", *overrides])
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise UserError(f"overrides: {str(exc).strip().splitlines()[0]}") from None
    finally:
        GlobalHydra.instance().clear()
    return kind, cfg


def load_suite(cfg: Any) -> Any:
    """The benchmark of every task of the suite in one split, invalid tasks kept aside."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from milo_ray.benchmarks.base import BenchmarkDataMissing

    try:
        return instantiate(cfg.benchmark, splits={CHECK_SPLIT: 1.0}, split_file=None, skip_invalid=True,
                           _convert_="all")
    except BenchmarkDataMissing as exc:
        raise UserError(f"benchmark: {exc}") from None
    except InstantiationException as exc:
        cause = exc.__cause__ or exc
        if isinstance(cause, (ValueError, TypeError, BenchmarkDataMissing)):
            raise UserError(f"benchmark: {str(cause).strip()}") from None
        raise


def executor_config(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    executor = cfg.get("executor") or {}
    return {"_target_": "milo_ray.tasks.executor.CheckExecutor",
            "sandbox": OmegaConf.to_container(cfg.sandbox, resolve=True),
            "scratch_dir": executor.get("scratch_dir"), "keep_scratch": bool(executor.get("keep_scratch", False)),
            # The grader role, for a suite whose verifier needs a model (benchmark=paperbench).
            "grader": OmegaConf.to_container(executor["grader"], resolve=True) if executor.get("grader") else None}


def run_check(path: str | Path, overrides: Sequence[str] = (), *, repeat: int = 1, noop: bool = True,
              progress: bool | None = False) -> CheckResult:
    """Check every task of the suite at ``path`` (module docstring). ``repeat``: runs of the
    reference solution per task (2 or more finds flaky verifiers); ``noop``: also grade a
    do-nothing agent (without it a trivial task is reported ``ok``)."""
    from omegaconf import OmegaConf

    from milo_ray.execution.agent_executor import build_factory
    from milo_ray.tasks.static import static_findings

    if int(repeat) < 1:
        raise UserError(f"--repeat={repeat}: need at least one run of the reference solution")
    t0 = time.monotonic()
    path = Path(path).expanduser().resolve()
    kind, cfg = compose(path, overrides)
    if kind == "paperbench" or (kind == "are" and cfg.benchmark.get("judge") == "grader"):
        from milo_ray.execution.grader import GraderSettings

        try:
            grader = GraderSettings.of(OmegaConf.to_container(cfg.executor.grader, resolve=True))
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if grader is None:
            raise UserError(f"executor.grader: a {kind} suite here is graded by the grader role; give "
                            "executor.grader.llm.model=PROVIDER/NAME, or executor.grader.scripted=true for "
                            "deterministic offline verdicts")
    benchmark = load_suite(cfg)
    try:
        factory = build_factory(cfg.sandbox)
    except (ValueError, TypeError) as exc:
        raise UserError(f"sandbox: {exc}") from None
    tasks = benchmark.tasks(CHECK_SPLIT)
    static = static_findings(factory, tasks)
    runnable = [t for t in tasks if static[t.task_id].blocker is None]
    graded = _run(cfg, runnable, repeat=int(repeat), noop=noop, progress=progress) if runnable else {}
    verdicts = [decide(tid, StaticFindings(blocker=(UNRUNNABLE, why)))
                for tid, why in getattr(benchmark, "invalid_tasks", {}).items()]
    for t in tasks:
        oracle, nothing = graded.get(t.task_id, ([], None))
        verdicts.append(decide(t.task_id, static[t.task_id], oracle, nothing))
    verdicts.sort(key=lambda v: v.task_id)
    bench_cfg = OmegaConf.to_container(cfg.benchmark, resolve=True)
    return CheckResult(suite=str(path), kind=kind, sandbox=getattr(factory, "name", "?"), verdicts=verdicts,
                       benchmark_cfg=bench_cfg, seconds=time.monotonic() - t0, repeat=int(repeat))


def _run(cfg: Any, tasks: list[Any], *, repeat: int, noop: bool,
         progress: bool | None) -> dict[str, tuple[list[Graded], Graded | None]]:
    """task id -> (oracle runs, do-nothing run), every rollout in one scheduler batch."""
    from milo_ray.core.rollouts import RolloutRequest
    from milo_ray.execution.cluster import connect
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.store.memory import MemoryRunStore
    from milo_ray.tasks.executor import CHECK_MODEL_ID, DO_NOTHING, ORACLE

    connect(cfg.execution)
    store = MemoryRunStore()
    requests = [RolloutRequest(ORACLE.harness_id, t.task_id, i, 0, split=CHECK_SPLIT, method="task-check",
                               stage="oracle", group="oracle") for t in tasks for i in range(repeat)]
    if noop:
        requests += [RolloutRequest(DO_NOTHING.harness_id, t.task_id, 0, 0, split=CHECK_SPLIT, method="task-check",
                                    stage="do-nothing", group="do-nothing") for t in tasks]
    ex = cfg.execution
    with RolloutScheduler(executor_config=executor_config(cfg), tasks=tasks, store=store, model_id=CHECK_MODEL_ID,
                          run_id="task-check", slots_per_node=ex.slots_per_node, slot_resource=ex.slot_resource,
                          slots_per_worker=ex.slots_per_worker, max_workers=ex.max_workers,
                          worker_idle_s=ex.worker_idle_s, max_retries=ex.max_retries,
                          progress=progress) as scheduler:
        scheduler.add_harness(ORACLE)
        scheduler.add_harness(DO_NOTHING)
        results = scheduler.run(requests)
    out: dict[str, tuple[list[Graded], Graded | None]] = {t.task_id: ([], None) for t in tasks}
    for r in results:
        g = Graded(score=float(r.score), error=r.error, error_kind=r.error_kind)
        oracle, nothing = out[r.task_id]
        if r.harness_id == ORACLE.harness_id:
            oracle.append(g)
        else:
            out[r.task_id] = (oracle, g)
    return out
