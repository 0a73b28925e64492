"""A sweep's points: expanded from the command line the way Hydra's basic sweeper does,
each composed and put through the checks a run makes before it writes anything
(:func:`milo_ray.run.prepare_run`). The first bad point refuses the whole sweep, in one
line naming the point and the field, before any job is submitted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from milo_ray.config.errors import UserError
from milo_ray.config.errors import ConfigError
from milo_ray.config.validate import explain, override_key, override_problems, parse_overrides

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
# Settings of the one Ray a sweep's jobs share (a job's driver joins it, so these cannot
# differ between its points): how the local Ray is found or sized.
SWEEP_LEVEL_EXECUTION = ("num_cpus", "join_running", "dashboard")


@dataclass(frozen=True)
class SweepPoint:
    num: int  # the job number: its run directory is <sweep dir>/<num>
    overrides: tuple[str, ...]  # the point's overrides, as the sweeper made them
    config: Any  # the composed config (DictConfig, hydra node included)


class SweepRefused(UserError):
    """A sweep point failed its checks; nothing was submitted."""

    def __init__(self, num: int, overrides: Sequence[str], reason: str) -> None:
        shown = " ".join(overrides) or "(no overrides)"
        super().__init__(f"sweep point {num} ({shown}): {reason}; nothing was submitted")


def expand(config: Any, config_loader: Any) -> list[list[str]]:
    """Every point's overrides, in the basic sweeper's order. Only Hydra's basic sweeper is
    supported, as one batch: the launcher checks all points before it submits one."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != BASIC_SWEEPER:
        raise UserError(f"hydra/sweeper: the ray_jobs launcher works with Hydra's basic sweeper only "
                        f"(got {sweeper.get('_target_')}); drop the hydra/sweeper override")
    if sweeper.get("max_batch_size") is not None:
        raise UserError(f"hydra.sweeper.max_batch_size={sweeper.max_batch_size}: the ray_jobs launcher checks and "
                        "submits a sweep as one batch; cap concurrent jobs with hydra.launcher.max_concurrent")
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    arguments = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(params + arguments)
    return BasicSweeper.split_arguments(parsed, None)[0]


def check_point(cfg: Any, overrides: Sequence[str] = ()) -> None:
    """The checks ``python -m milo_ray.run`` makes before it writes anything (``UserError``)."""
    from milo_ray.run import CONF_DIR, prepare_run

    if cfg.run.resume:
        raise UserError(f"run.resume={cfg.run.resume}: a sweep starts new runs; resume a run on its own "
                        "with python -m milo_ray.run run.resume=<run dir>")
    parsed, problems = parse_overrides([o for o in overrides if not override_key(o).startswith("hydra")])
    problems += override_problems(parsed, CONF_DIR)
    if problems:
        raise ConfigError(problems)
    prepare_run(cfg)


def compose_points(config: Any, config_loader: Any, job_overrides: Sequence[Sequence[str]],
                   initial_job_idx: int = 0) -> list[SweepPoint]:
    """Compose and check every point; raises :class:`SweepRefused` at the first bad one."""
    from milo_ray.run import CONF_DIR

    points = []
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        try:
            cfg = config_loader.load_sweep_config(config, list(overrides))
        except Exception as exc:  # Hydra raises several unrelated types for input errors
            raise SweepRefused(num, overrides, explain(exc, CONF_DIR).line()) from None
        try:
            check_point(cfg, overrides)
        except UserError as exc:
            raise SweepRefused(num, overrides, str(exc)) from None
        points.append(SweepPoint(num=num, overrides=tuple(overrides), config=cfg))
    _check_shared_execution(points)
    return points


def _check_shared_execution(points: list[SweepPoint]) -> None:
    for key in SWEEP_LEVEL_EXECUTION:
        values = {p.num: p.config.execution[key] for p in points}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"point {n}: {v}" for n, v in values.items())
            raise UserError(f"execution.{key} differs between sweep points ({shown}): a sweep's jobs share one Ray, "
                            f"which this setting finds or sizes; give it once for the whole sweep; "
                            "nothing was submitted")


def job_overrides(point: SweepPoint, run_dir: str) -> list[str]:
    """The point's overrides for its job's driver: its own run directory replaces any run.dir
    (in a sweep, run.dir names the sweep's directory)."""
    return [o for o in point.overrides if override_key(o) != "run.dir"] + [f"run.dir={run_dir}"]
