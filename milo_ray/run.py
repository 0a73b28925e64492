"""Entry point: ``python -m milo_ray.run [overrides] [+experiment=NAME] [-m sweeps]``.

Composes the Hydra config under ``conf/``, rejects bad input with one line and exit
code 2 before anything is written, connects to Ray, opens (or resumes) the run's
Parquet store, builds the method and runs it, then records the outcome in
``manifest.json`` and prints the run directory.
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

import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from milo_ray.config import register_configs
from milo_ray.config_errors import UserError, check_overrides, check_settings, explain
from milo_ray.manifest import build_manifest, elapsed_before, finish_manifest

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
log = logging.getLogger(__name__)

register_configs()


def _run_dir(cfg: DictConfig) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser().resolve()
    return Path(HydraConfig.get().runtime.output_dir).resolve()


def _resume_config(cfg: DictConfig) -> DictConfig:
    """The stored config of the run being resumed, with this machine's execution
    settings and this invocation's time limit and progress choice."""
    from milo_ray.manifest import read_manifest

    path = Path(cfg.run.resume).expanduser().resolve()
    manifest = read_manifest(path)
    stored = OmegaConf.create(manifest["config"])
    OmegaConf.set_struct(stored, False)
    stored.run.dir = str(path)
    stored.run.resume = str(path)
    stored.run.time_limit_s = cfg.run.time_limit_s
    stored.run.progress = cfg.run.progress
    stored.execution = cfg.execution
    return stored


def _build(section: str, node: DictConfig) -> Any:
    """Instantiate one config section; a constructor's complaint about its arguments is
    bad input, reported as one line naming the section."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from milo_ray.benchmarks.base import BenchmarkDataMissing

    try:
        return instantiate(node, _convert_="all")
    except BenchmarkDataMissing as exc:
        raise UserError(f"{section}: {exc}") from None
    except InstantiationException as exc:
        cause = exc.__cause__ or exc
        if isinstance(cause, (ValueError, TypeError, BenchmarkDataMissing)):
            raise UserError(f"{section}: {str(cause).strip().splitlines()[0]}") from None
        raise


def _activity_times(store: Any) -> list[float]:
    """When the run did something: every event's time and every rollout's finish time."""
    times = store.read("events").column("time").to_pylist()
    return times + store.read("rollouts").column("finished_at").to_pylist()


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """Run one configured job to completion; returns the method's summary."""
    from milo_ray.context import RunContext
    from milo_ray.evaluation import print_run_summary
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.cluster import connect
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.store.parquet import ParquetRunStore

    resumed = bool(cfg.run.resume)
    if resumed:
        cfg = _resume_config(cfg)
    run_dir = _run_dir(cfg)

    # Everything that can fail on bad input happens before the store is touched.
    check_settings(cfg)
    benchmark = _build("benchmark", cfg.benchmark)
    method = _build("method", cfg.method)
    cluster = connect(cfg.execution)

    manifest = build_manifest(cfg, run_dir=run_dir, cluster=cluster, resumed=resumed)
    store = ParquetRunStore(run_dir, run_id=manifest["run_id"])
    store.write_manifest(manifest)
    tasks = {t.task_id: t for split in benchmark.splits().values() for t in split}
    scheduler = RolloutScheduler(
        executor_config=benchmark.executor_config(),
        tasks=tasks,
        store=store,
        model_id=cfg.model.id,
        run_id=manifest["run_id"],
        budget=BudgetLedger(
            executions=cfg.run.budget.executions,
            tokens=cfg.run.budget.tokens,
            cost_usd=cfg.run.budget.cost_usd,
        ),
        slots_per_node=cfg.execution.slots_per_node,
        default_group_limit=cfg.execution.group_limit,
        max_retries=cfg.execution.max_retries,
        progress=cfg.run.progress,
    )
    elapsed = elapsed_before(manifest["history"], _activity_times(store)) if resumed else 0.0
    if elapsed:
        log.info("resuming: earlier sessions ran %.0f s of the run's time", elapsed)
    deadline = time.monotonic() + cfg.run.time_limit_s - elapsed if cfg.run.time_limit_s else None
    ctx = RunContext(
        run_id=manifest["run_id"],
        run_dir=run_dir,
        seed=int(cfg.run.seed),
        store=store,
        benchmark=benchmark,
        scheduler=scheduler,
        model_id=cfg.model.id,
        deadline=deadline,
        resumed=resumed,
        elapsed_before_s=elapsed,
        extras={"agents": OmegaConf.to_container(cfg.backend.get("agents", {}), resolve=True)},
    )
    status = "failed"
    summary: dict[str, Any] = {}
    try:
        summary = method.run(ctx) or {}
        status = "finished"
        print_run_summary(summary)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        scheduler.close()
        store.flush()
        store.write_manifest(finish_manifest(manifest, status=status, summary=summary, budget=scheduler.budget))
        store.close()
        print(f"run directory: {run_dir}  (status: {status}; resume with run.resume={run_dir})")
    return summary


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        run_job(cfg)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted: finished rollouts are stored; resume with run.resume=<run directory>", file=sys.stderr)
        raise SystemExit(130) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_overrides(CONF_DIR, argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.argv = [sys.argv[0], *argv]
    try:
        _hydra_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        # Hydra reports its own composition errors with exit 1; those are input errors.
        return 2 if code == 1 else code
    return 0


if __name__ == "__main__":
    sys.exit(main())
