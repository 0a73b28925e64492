"""Entry point: ``python -m milo_ray.run [overrides] [+experiment=NAME] [-m sweeps]``.

Composes the Hydra config under ``conf/``, rejects bad input with one line and exit
code 2 before anything is written, connects to Ray, opens (or resumes) the run's
Parquet store, builds the method and runs it, then records the outcome in
``manifest.json`` and prints the run directory.

Exit codes: 0 finished, 1 the run crashed (traceback printed, manifest ``failed``),
2 bad input (one line, nothing written), 3 the method ran to its end but every rollout of
this session failed as infrastructure (manifest ``failed_infra``: no score of the run
measures a harness; the log names the failures), 130 interrupted (resumable).

The run directory (``run.dir``, default ``runs/<timestamp>``) is the only directory a
run writes: Hydra's own output directory is the working directory and Hydra writes
no files there (the manifest holds the resolved config; ``run.log`` is written by the
run itself once its input has been accepted).
"""

from __future__ import annotations

import os

# Offline paths must never reach for the network at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from milo_ray import redaction
from milo_ray.config.errors import UserError, jobs_launched, set_jobs_launched
from milo_ray.config.paths import conf_dir
from milo_ray.config.schemas import register_configs
from milo_ray.config.validate import (check_composition, check_overrides, check_resume_overrides, check_seed_harnesses,
                                      check_settings, override_key)
from milo_ray.run_log import RUN_LOG, attach_run_log, to_run_log
from milo_ray.manifest import (EMBEDDER_LOADED, build_manifest, deadline_for, elapsed_before, finish_manifest, new_run_id,
                               read_manifest)

# The repository's conf/ in a checkout, the packaged copy in an installed wheel.
CONF_DIR = conf_dir()
log = logging.getLogger(__name__)

EXIT_CRASH, EXIT_BAD_INPUT, EXIT_INFRA, EXIT_INTERRUPTED = 1, 2, 3, 130
FAILED_INFRA = "failed_infra"

register_configs()
# `hydra.sweep.dir` follows run.dir when one is given (conf/config.yaml).
OmegaConf.register_new_resolver("first_set", lambda *xs: next((x for x in xs if x not in (None, "")), None),
                                replace=True)


def _run_dir(cfg: DictConfig) -> Path:
    """Where this job writes: in a sweep, the job's subdirectory of the sweep directory;
    otherwise run.dir, or a fresh ``runs/<timestamp>``."""
    from hydra.types import RunMode

    hc = HydraConfig.get()
    location = _object_store_location(cfg)
    if hc.mode == RunMode.MULTIRUN:
        if location is not None:
            raise UserError(f"run.dir={location}: a sweep's jobs cannot write to object storage yet; give each run "
                            "its own run.dir=s3://BUCKET/PREFIX, or sweep into a local directory")
        return Path(hc.runtime.output_dir).resolve()
    if location is not None:  # the working copy of a run whose truth is the bucket
        return location.local_copy(Path("runs").resolve())
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser().resolve()
    base = Path("runs") / time.strftime("%Y-%m-%d_%H-%M-%S")
    path, n = base, 2
    while path.exists():  # two runs started within the same second
        path, n = base.with_name(f"{base.name}_{n}"), n + 1
    return path.resolve()


def _object_store_location(cfg: DictConfig) -> Any:
    """run.dir as a checked object-store location (``milo_ray.store.remote.RunURI``), or
    None for a local directory; a bad URI is bad input naming run.dir (no network used)."""
    from milo_ray.store.remote import RemoteConfigError, RunURI, is_uri

    if not is_uri(cfg.run.dir):
        return None
    try:
        return RunURI.parse(str(cfg.run.dir), field="run.dir")
    except RemoteConfigError as exc:
        raise UserError(str(exc)) from None


def _invocation_overrides() -> list[str]:
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # called outside a Hydra job (tests)
        return []


def _resume_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The stored config of the run being resumed, with this machine's execution
    settings; the time limit, progress choice and budget are the stored ones unless
    this invocation gives them again. Any other override is refused (it would be
    silently ignored otherwise)."""

    check_resume_overrides(overrides)
    path, location = _resume_location(str(cfg.run.resume))
    manifest = read_manifest(path)
    stored = OmegaConf.create(manifest["config"])
    OmegaConf.set_struct(stored, False)
    stored.run.dir = str(location or path)
    stored.run.resume = str(location or path)
    given = {override_key(o) for o in overrides}
    for key in ("run.time_limit_s", "run.progress", "run.report", "run.budget.executions", "run.budget.tokens",
                "run.budget.cost_usd", "run.budget.roles", "run.budget.sweep.ledger", "run.budget.sweep.cost_usd"):
        if key in given or (key.startswith("run.budget.") and "run.budget" in given):
            OmegaConf.update(stored, key, OmegaConf.select(cfg, key), force_add=True)
    stored.execution = cfg.execution
    if "executor" not in stored:
        # A run stored before the executor became its own config group: its benchmark named
        # the (surrogate) executor and the model id. Both now come from the executor and model
        # groups, with the same cache identity, so the run continues unchanged.
        stored.executor = OmegaConf.to_container(cfg.executor, resolve=False)
        if isinstance(stored.get("benchmark"), DictConfig) and "model_id" in stored.benchmark:
            del stored.benchmark["model_id"]
    return stored


def _resume_location(resume: str) -> tuple[Path, Any]:
    """The local directory holding the manifest of the run ``run.resume`` names, and its
    object-store location (None for a local run). For ``run.resume=s3://...`` the manifest is
    fetched into the working copy first, so the resume works on a machine that never saw it."""
    from milo_ray.store.remote import Remote, RemoteConfigError, RunURI, is_uri

    if not is_uri(resume):
        return Path(resume).expanduser().resolve(), None
    try:
        location = RunURI.parse(resume, field="run.resume")
        remote = Remote(location, field="run.resume")
        remote.check_bucket()
        text = remote.get_bytes("manifest.json")
    except RemoteConfigError as exc:
        raise UserError(str(exc)) from None
    if text is None:
        raise UserError(f"run.resume={resume}: no run there (manifest.json missing); pass the run.dir of a run "
                        "written to object storage")
    path = location.local_copy(Path("runs").resolve())
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_bytes(text)  # the store's open replaces it with the same bytes
    return path, location


def _build(section: str, node: DictConfig) -> Any:
    """Instantiate one config section. Arguments its constructor does not take are bad
    input (the spec is bound to the constructor's signature first, nested specs too), and
    so is a constructor's ``ValueError`` about a value; anything else a constructor raises,
    a ``TypeError`` included, is a bug in it and propagates as a crash (exit 1)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from milo_ray.benchmarks.base import BenchmarkDataMissing
    from milo_ray.config.targets import CompositionError, check_spec

    try:
        check_spec(section, OmegaConf.to_container(node, resolve=True))
    except CompositionError as exc:
        raise UserError(str(exc)) from None
    try:
        return instantiate(node, _convert_="all")
    except BenchmarkDataMissing as exc:
        raise UserError(f"{section}: {str(exc).strip()}") from None
    except InstantiationException as exc:
        cause = exc.__cause__ or exc
        if isinstance(cause, (ValueError, BenchmarkDataMissing)):
            # The whole message: a suite with several broken tasks lists every one of them
            # on the lines after its first (a first line alone would say only how many).
            raise UserError(f"{section}: {str(cause).strip()}") from None
        if cause is not exc:
            raise cause from None  # the constructor's own failure, with its own traceback
        raise


def _activity_times(store: Any) -> list[float]:
    """When the run did something: every event's time and every rollout's finish time."""
    times = store.read("events").column("time").to_pylist()
    return times + store.read("rollouts").column("finished_at").to_pylist()


def _embedder_loads(store: Any) -> list[dict[str, Any]]:
    """Payloads of the run's ``embedder.loaded`` events (every session), oldest first."""
    from milo_ray.search.events import read_payloads

    return read_payloads(store, EMBEDDER_LOADED)


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """What a composed config builds before the run writes anything."""

    plan: Any  # milo_ray.config.targets.Composition: model, executor spec, agents
    benchmark: Any
    method: Any
    tracker: Any
    tasks: dict[str, Any]  # task id -> task, every split
    skipped: dict[str, str]  # task id -> why, for tasks run.skip_unrunnable_tasks dropped
    plugin: Any = None  # the method's milo_ray.search.plugin.MethodPlugin (milo_ray.methods)


def prepare_run(cfg: DictConfig) -> PreparedRun:
    """Every check of a composed config that a run makes before it writes anything, raising
    ``UserError`` (one line naming the key): the settings, the composition, building the
    benchmark, method and tracker, the method's preflight and whether the executor can run
    the tasks. Writes nothing and starts no Ray, so a launcher can check every point of a
    sweep before it submits one (milo_ray.sweep)."""
    check_settings(cfg)
    plan = check_composition(cfg)  # model, executor, benchmark, method and agents, nothing built yet
    _register_secrets(plan)
    benchmark = _build("benchmark", cfg.benchmark)
    # Tasks the sandbox cannot run are refused by name, or skipped with a warning when the
    # run asks for it, before the method sees the splits.
    from milo_ray.tasks.preflight import check_runnable, skip_tasks  # the sandbox's refusals; under Docker, missing images

    skipped = check_runnable(plan.executor, cfg.executor, [t for s in benchmark.splits().values() for t in s],
                             skip=bool(OmegaConf.select(cfg, "run.skip_unrunnable_tasks", default=False)))
    if skipped:
        skip_tasks(benchmark, skipped)
    check_seed_harnesses(benchmark, cfg.get("sandbox"))
    method = _build("method", cfg.method)
    plugin = _method_plugin(method)
    tracker = _build("tracking", cfg.tracking) if cfg.get("tracking") is not None else None
    try:
        plugin.preflight(method, benchmark, plan.agents)
    except ValueError as exc:
        raise UserError(str(exc).strip()) from None
    tasks = {t.task_id: t for split in benchmark.splits().values() for t in split}
    return PreparedRun(plan=plan, benchmark=benchmark, method=method, tracker=tracker, tasks=tasks,
                       skipped=skipped, plugin=plugin)


def _method_plugin(method: Any) -> Any:
    """The built method's plugin (milo_ray.methods); a method without one is bad input."""
    from milo_ray.methods import plugin_for_method

    try:
        return plugin_for_method(method)
    except LookupError as exc:
        raise UserError(f"method._target_: {exc}") from None


class InfraOnly(Exception):
    """The method finished but every rollout of the session failed as infrastructure."""


def _infra_only(store: Any, since: float) -> str | None:
    """Why the rollouts this session recorded (finished at or after ``since``) measure
    nothing -- every one an infrastructure failure -- or None (some rollout produced a
    score, or none ran)."""
    rows = store.read("rollouts").select(["error_kind", "finished_at", "error"]).to_pylist()
    mine = [r for r in rows if (r["finished_at"] or 0.0) >= since]
    if not mine or any(r["error_kind"] != "infra" for r in mine):
        return None
    first = next((r["error"] for r in mine if r["error"]), "no error text")
    return (f"all {len(mine)} rollouts failed as infrastructure (retried and recorded with error_kind=infra); "
            f"the first: {str(first).splitlines()[0][:300]}")


def _sweep_budget(cfg: DictConfig) -> tuple[str, float] | None:
    """(ledger, USD cap) of the capped sweep this run is a job of (``run.budget.sweep``)."""
    sweep = OmegaConf.select(cfg, "run.budget.sweep", default=None)
    if sweep is None or sweep.get("ledger") is None:
        return None
    return str(sweep.ledger), float(sweep.cost_usd)


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """Run one configured job to completion; returns the method's summary."""
    from milo_ray.agents.embedder import watch_loads
    from milo_ray.context import RunContext
    from milo_ray.evaluation import print_run_summary
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.cluster import connect
    from milo_ray.boundary.gateway.call_journal import JOURNAL_DIR
    from milo_ray.boundary.gateway.role_journal import RoleJournal
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.config.targets import agent_env, worker_env
    from milo_ray.search.agent_calls import AgentCallLog, role_caps
    from milo_ray.store.integrity import DiskFull

    resumed = bool(cfg.run.resume)
    if resumed:
        cfg = _resume_config(cfg, _invocation_overrides())
    run_dir = _run_dir(cfg)
    location = _object_store_location(cfg)

    # Everything that can fail on bad input happens before the store is touched.
    prepared = prepare_run(cfg)
    plan, benchmark, method, tracker, tasks, skipped = (prepared.plan, prepared.benchmark, prepared.method,
                                                        prepared.tracker, prepared.tasks, prepared.skipped)
    agents = plan.agents
    # a run held by another driver, or damaged, or a bucket that cannot be used, is refused before Ray starts
    store = _open_store(run_dir, resumed, location)
    try:
        cluster = connect(cfg.execution)
    except BaseException:
        store.close()
        raise

    manifest = build_manifest(cfg, run_dir=run_dir, cluster=cluster, resumed=resumed, run_id=store.run_id)
    manifest["method_name"] = prepared.plugin.name  # the read side finds the method's plugin by it
    if skipped:
        manifest["skipped_tasks"] = dict(skipped)
    store.write_manifest(manifest)
    log_file = attach_run_log(run_dir)
    session = len(manifest["history"])
    to_run_log(log_file, "session %d of run %s started (%s) on %s; milo_ray git %s; overrides: %s", session,
                manifest["run_id"], "resumed" if resumed else "new run", manifest["history"][-1]["host"],
                manifest.get("git_sha") or "unknown", " ".join(_invocation_overrides()) or "none")
    for task_id, why in skipped.items():
        log.warning("run.skip_unrunnable_tasks: task %s skipped: %s", task_id, why)
    if skipped:
        store.event("tasks_skipped", {"reason": "run.skip_unrunnable_tasks", "tasks": dict(skipped)})
    scheduler = RolloutScheduler(
        executor_config=plan.executor,
        tasks=tasks,
        store=store,
        model_id=plan.model.id,
        run_id=manifest["run_id"],
        budget=BudgetLedger(
            executions=cfg.run.budget.executions,
            tokens=cfg.run.budget.tokens,
            cost_usd=cfg.run.budget.cost_usd,
        ),
        slots_per_node=cfg.execution.slots_per_node,
        slot_resource=cfg.execution.slot_resource,
        slots_per_worker=cfg.execution.slots_per_worker,
        max_workers=cfg.execution.max_workers,
        worker_idle_s=cfg.execution.worker_idle_s,
        default_group_limit=cfg.execution.group_limit,
        max_retries=cfg.execution.max_retries,
        progress=cfg.run.progress,
        usd_per_mtok=None if plan.model.usd_per_mtok_input is None
        else (plan.model.usd_per_mtok_input, plan.model.usd_per_mtok_output),
        worker_env=worker_env(plan.model),
        sweep_budget=_sweep_budget(cfg),
    )
    elapsed = elapsed_before(manifest["history"], _activity_times(store)) if resumed else 0.0
    if elapsed:
        log.info("resuming: earlier sessions ran %.0f s of the run's time", elapsed)
    deadline = deadline_for(cfg.run.time_limit_s, elapsed)
    ctx = RunContext(
        run_id=manifest["run_id"],
        run_dir=run_dir,
        seed=int(cfg.run.seed),
        store=store,
        benchmark=benchmark,
        scheduler=scheduler,
        model_id=plan.model.id,
        model=plan.model,
        deadline=deadline,
        resumed=resumed,
        elapsed_before_s=elapsed,
        agents=agents,
        agent_env=agent_env(agents),
        sandbox=OmegaConf.to_container(cfg.sandbox, resolve=True) if cfg.get("sandbox") is not None else None,
        agent_calls=AgentCallLog(store, budget=scheduler.budget, resumed=resumed,
                                 caps=role_caps(OmegaConf.to_container(cfg.run.budget.roles, resolve=True)),
                                 journal=RoleJournal(run_dir / JOURNAL_DIR)),
    )
    scheduler.agent_calls = ctx.agent_calls  # real rollouts' model calls land there (role solver)
    if resumed and (recovered := scheduler.recover_calls()):
        log.info("resuming: recorded %d model call(s) of attempts the last session never reported", recovered)
    if resumed and (recovered := ctx.agent_calls.journal.recover(ctx.agent_calls)):
        log.info("resuming: recorded %d search agent call(s) the last session never got an outcome of", recovered)
    tracking = _live_views(cfg, store, scheduler, tracker, run_dir=run_dir, manifest=manifest, resumed=resumed,
                           deadline=deadline, method=prepared.plugin)
    status = "failed"
    summary: dict[str, Any] = {}
    infra: str | None = None
    session_started = time.time()
    try:
        with watch_loads(lambda load: store.event(EMBEDDER_LOADED, dataclasses.asdict(load))):
            summary = prepared.plugin.run(method, ctx)
        infra = _infra_only(store, session_started)
        status = FAILED_INFRA if infra else "finished"
        print_run_summary(summary)
        if infra:
            log.error("%s", infra)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except Exception as exc:
        full = disk_full(exc)
        if full is not None:
            status = DISK_FULL
            raise full from None
        # Into run.log only: Hydra prints the traceback on the console.
        log_file.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, "the run crashed", (), sys.exc_info()))
        raise
    finally:
        ctx.agent_calls.journal.finish(ctx.agent_calls)  # agent calls that timed out or were lost
        scheduler.close()
        try:
            store.flush()
            store.write_manifest(finish_manifest(manifest, status=status, summary=summary, budget=scheduler.budget,
                                                 embedder_loads=_embedder_loads(store)))
        except DiskFull:
            status = DISK_FULL  # the manifest keeps its last whole version; resume reads it
        report = _write_report(run_dir) if status == "finished" and OmegaConf.select(
            cfg, "run.report", default=True) else None
        if tracking is not None:
            tracking.finish(status=status, summary=summary, run_dir=run_dir, report=report)
        try:
            store.close()  # releases the run even when its last buffer cannot be written
        except DiskFull:
            pass
        _scrub_run_dir(run_dir)
        to_run_log(log_file, "session %d ended: status %s after %.0f s%s", session, status, time.time() - session_started,
                    "".join(f"; {k}={v:.4f}" if isinstance(v, float) else f"; {k}={v}"
                            for k, v in summary.items() if k in _HEADLINE_KEYS))
        logging.getLogger().removeHandler(log_file)
        log_file.close()
        if location is not None:
            _publish(location, run_dir, report)
        where = location or run_dir
        print(f"run directory: {where}  (status: {status}; resume with run.resume={where})")
        if report is not None:
            print(f"report: {report}")
    if infra:
        raise InfraOnly(infra)
    return summary


DISK_FULL = "disk_full"


def disk_full(exc: BaseException) -> Any:
    """The full-disk error behind ``exc`` (itself, or what it was raised from), if any: a
    full disk stops a run cleanly instead of crashing it."""
    from milo_ray.store.integrity import DiskFull

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, DiskFull):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _open_store(run_dir: Path, resumed: bool, location: Any = None) -> Any:
    """The run's store, opened for writing: a run another live driver holds, or one whose
    stored files changed after they were written, is bad input naming the file. With an
    object-store ``location`` the store mirrors ``run_dir`` (its working copy) to the bucket;
    a missing bucket or credentials are bad input naming run.dir."""
    from milo_ray.store.integrity import RunLocked
    from milo_ray.store.parquet import ParquetRunStore

    run_id = read_manifest(run_dir)["run_id"] if resumed else new_run_id()
    try:
        if location is None:
            return ParquetRunStore(run_dir, run_id=run_id)
        from milo_ray.store.mirrored import MirroredRunStore

        # The bucket's keys are the driver's: never persisted, whatever a row or file holds.
        redaction.register_env(["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"])
        return MirroredRunStore(location, run_dir, run_id=run_id)
    except (RunLocked, ValueError) as exc:  # IntegrityError and RemoteConfigError are ValueErrors
        raise UserError(str(exc)) from None


def _publish(location: Any, run_dir: Path, report: Path | None) -> None:
    """The session's run.log and report, copied beside the store's files in the bucket."""
    from milo_ray.store.mirrored import publish

    publish(location, run_dir, [run_dir / RUN_LOG, *(sorted(report.parent.rglob("*")) if report else [])])


def _write_report(run_dir: Path) -> Path | None:
    """The finished run's report (``<run dir>/report/report.html``), or None when it could
    not be written: the run's results stand without it, and the log says why."""
    try:
        from milo_ray.report import write_report

        return write_report(run_dir)
    except Exception as exc:
        log.warning("no report written (%s: %s); write it with: python -m milo_ray.report %s",
                    type(exc).__name__, exc, run_dir)
        return None


def _live_views(cfg: DictConfig, store: Any, scheduler: Any, tracker: Any, *, run_dir: Path,
                manifest: dict[str, Any], resumed: bool, deadline: float | None, method: Any = None) -> Any:
    """Feed the progress display's run status and the tracker from the store's writes;
    returns the tracking session (None: nothing tracked). Without a display or a
    tracker nothing listens, so a quiet run pays nothing."""
    from milo_ray.tracking import NoTracking, RunStatus, start_tracking

    tracked = tracker is not None and not isinstance(tracker, NoTracking)
    if not (scheduler.progress.enabled or scheduler.progress.plain or tracked):
        return None
    live = RunStatus(method=method, budget=scheduler.budget, deadline=deadline,
                     max_rounds=OmegaConf.select(cfg, "method.max_rounds", default=None))
    if resumed:
        live.replay(store)
    store.add_listener(live.observe)
    scheduler.progress.attach(live)
    return start_tracking(tracker, store=store, status=live, run_id=manifest["run_id"], run_dir=run_dir,
                          config=manifest["config"], resumed=resumed)


# The summary's figures a session's closing line in run.log names (the console prints them too).
_HEADLINE_KEYS = ("executions_used", "stop_reason", "rounds", "best_seed_true_quality", "final_true_quality")


def _register_secrets(plan: Any) -> None:
    """The values of the run's key variables (the solver's and every LLM role's) are
    redacted from everything this process persists (``milo_ray/redaction.py``)."""
    from milo_ray.llm.client import key_env
    from milo_ray.config.targets import agent_env, worker_env

    redaction.register_env([key_env(plan.model)])
    redaction.register(worker_env(plan.model))
    redaction.register(agent_env(plan.agents))


def _scrub_run_dir(run_dir: Path) -> None:
    """The run's processes write some files themselves (harness copies, evidence, agent
    transcripts): at the end of every session, finished or not, any of them holding a
    registered secret is redacted in place (the store's own files are redacted as written)."""
    changed = redaction.scrub_tree(run_dir)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        log.warning("redacted key values from %d file(s) the run wrote: %s", len(changed), shown)


_job_started = False  # a Hydra exit code 1 after a job started is a crash, before it bad input


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    global _job_started
    from milo_ray.store.integrity import DiskFull  # the store (pyarrow) stays off --help's path

    _job_started = True
    try:
        run_job(cfg)
    except UserError as exc:
        print(f"error: {redaction.redact(str(exc))}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except (InfraOnly, DiskFull) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_INFRA) from None
    except KeyboardInterrupt:
        print("interrupted: finished rollouts are stored; resume with run.resume=<run directory>", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None


def main(argv: list[str] | None = None) -> int:
    global _job_started
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("--help", "-h") for a in argv):
        from milo_ray.config.help import usage

        print(usage(CONF_DIR))
        return 0
    try:
        check_overrides(CONF_DIR, argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sys.argv = [sys.argv[0], *argv]
    _job_started = False
    set_jobs_launched(False)
    try:
        _hydra_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_CRASH)
        if code == 1 and not (_job_started or jobs_launched()):
            return EXIT_BAD_INPUT  # Hydra's own composition errors (e.g. in a sweep) are input errors
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
