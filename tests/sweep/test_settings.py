"""The launcher's settings as typed on a command line (Hydra's override grammar)."""

from __future__ import annotations

import pytest

from milo_ray.sweep.settings import settings_from


def _launcher(*overrides: str):
    from hydra import compose, initialize_config_dir

    from milo_ray.run import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["hydra/launcher=ray_jobs", *overrides],
                      return_hydra_config=True)
    return settings_from(cfg.hydra.launcher)


@pytest.mark.parametrize("form", ["hydra.launcher.entrypoint_resources={driver_slot:1}",
                                  "hydra.launcher.entrypoint_resources.driver_slot=1",
                                  "++hydra.launcher.entrypoint_resources.driver_slot=1",
                                  "+hydra.launcher.entrypoint_resources.driver_slot=1"])
def test_the_driver_pin_is_accepted_in_every_command_line_form(form):
    assert _launcher(form).entrypoint_resources == {"driver_slot": 1.0}


def test_unset_mappings_mean_none_and_runtime_env_takes_dotted_keys():
    unset = _launcher()
    assert unset.entrypoint_resources is None and unset.runtime_env is None and unset.driver_node == "auto"
    assert _launcher("hydra.launcher.runtime_env.working_dir=/code").runtime_env == {"working_dir": "/code"}
