"""The ``ray_jobs`` launcher: one Ray job per sweep point (see milo_ray/sweep/).

Hydra's plugin loader imports this module at every start, so it imports only the
launcher's config; the launcher itself is imported when a sweep uses it."""

from __future__ import annotations

import sys
from typing import Any, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from milo_ray.sweep.settings import launcher_config_node

ConfigStore.instance().store(group="hydra/launcher", name="ray_jobs", node=launcher_config_node(), provider="milo_ray")

EXIT_BAD_INPUT, EXIT_JOB_FAILED, EXIT_INTERRUPTED = 2, 1, 130


class SweepJobFailed(RuntimeError):
    """A sweep job that did not succeed (the JobReturn's value for Hydra)."""


class RayJobsLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self._settings = settings
        self._launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        # Every point is checked here, before the sweeper makes the sweep directory.
        from milo_ray.config.errors import UserError
        from milo_ray.sweep.launcher import SweepLauncher
        from milo_ray.sweep.settings import settings_from

        try:
            self._launcher = SweepLauncher(settings_from(self._settings))
            self._launcher.setup(config, hydra_context.config_loader)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(EXIT_BAD_INPUT) from None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from milo_ray.config.errors import UserError

        try:
            points, result = self._launcher.launch(job_overrides, initial_job_idx)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:
            print("interrupted: the sweep's running jobs were stopped; each stopped run resumes with "
                  "python -m milo_ray.run run.resume=<its run directory>", file=sys.stderr)
            raise SystemExit(EXIT_INTERRUPTED) from None
        for name, path in result.summary.items():
            print(f"sweep {name}: {path}", file=sys.stderr)
        if result.failed:
            shown = "; ".join(f"job {o.num}: {o.error()}" for o in result.failed)
            print(f"sweep: {len(result.failed)} of {len(result.outcomes)} job(s) failed ({shown})", file=sys.stderr)
            raise SystemExit(EXIT_JOB_FAILED)
        returns = []
        for point, outcome in zip(points, result.outcomes):
            with open_dict(point.config):
                point.config.hydra.job.num = point.num
            returns.append(JobReturn(overrides=list(point.overrides), cfg=point.config, hydra_cfg=point.config,
                                     working_dir=outcome.run_dir, task_name=str(point.config.hydra.job.name),
                                     status=JobStatus.COMPLETED, _return_value=outcome))
        return returns
