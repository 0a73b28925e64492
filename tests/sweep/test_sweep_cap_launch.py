"""``hydra.launcher.max_usd``: checked as typed on the command line, and handed to every job
as the run settings naming the sweep's one ledger (``run.budget.sweep``), which compose into
the job's config and reach its scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from milo_ray.config.errors import UserError
from milo_ray.sweep.launcher import sweep_budget_overrides
from milo_ray.sweep.settings import settings_from


def _compose(*overrides: str, hydra: bool = False):
    from hydra import compose, initialize_config_dir

    from milo_ray.run import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def test_max_usd_is_read_from_the_command_line_and_bad_values_name_it():
    cfg = _compose("hydra/launcher=ray_jobs", "hydra.launcher.max_usd=25", hydra=True)
    assert settings_from(cfg.hydra.launcher).max_usd == 25.0
    unset = _compose("hydra/launcher=ray_jobs", hydra=True)
    assert settings_from(unset.hydra.launcher).max_usd is None
    for bad in (0, -3.5):
        bad_cfg = _compose("hydra/launcher=ray_jobs", f"hydra.launcher.max_usd={bad}", hydra=True)
        with pytest.raises(UserError, match="hydra.launcher.max_usd"):
            settings_from(bad_cfg.hydra.launcher)


def test_every_job_of_a_sweep_names_one_ledger_and_the_cap_reaches_its_scheduler():
    from milo_ray.run import _sweep_budget

    a = sweep_budget_overrides(12.5, Path("/sweeps/s1"))
    assert a == sweep_budget_overrides(12.5, Path("/sweeps/s1"))  # every job, and a relaunch into it: one ledger
    other = sweep_budget_overrides(12.5, Path("/sweeps/s2"))
    assert a[0] != other[0] and a[0].startswith("run.budget.sweep.ledger=sweep-")
    assert sweep_budget_overrides(None, Path("/sweeps/s1")) == []
    cfg = _compose("method=eval", *a)
    assert _sweep_budget(cfg) == (a[0].split("=", 1)[1], 12.5)
    assert _sweep_budget(_compose("method=eval")) is None
