"""Config composition and input errors of the entry point (Hydra compose(), no Ray)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class

from milo_ray.config.schemas import register_configs
from milo_ray.config.errors import UserError
from milo_ray.config.validate import check_overrides
from milo_ray.run import CONF_DIR

register_configs()
EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
METHODS = sorted(p.stem for p in (Path(CONF_DIR) / "method").glob("*.yaml"))
BENCHMARKS = sorted(p.stem for p in (Path(CONF_DIR) / "benchmark").glob("*.yaml"))


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def test_default_config_composes_with_typed_run_keys():
    cfg = _compose([])
    assert isinstance(cfg.run.seed, int)
    assert cfg.run.budget.executions is None or isinstance(cfg.run.budget.executions, int)
    assert cfg.execution.slots_per_node >= 1


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_names_importable_targets(experiment):
    cfg = _compose([f"+experiment={experiment}"])
    for section in ("method", "benchmark"):
        assert get_class(cfg[section]["_target_"]) is not None


@pytest.mark.parametrize("method", METHODS)
def test_every_method_config_composes(method):
    cfg = _compose([f"method={method}"])
    assert get_class(cfg.method._target_) is not None


@pytest.mark.parametrize("benchmark_name", BENCHMARKS)
def test_every_benchmark_config_composes(benchmark_name):
    cfg = _compose([f"benchmark={benchmark_name}"])
    assert get_class(cfg.benchmark._target_) is not None


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["foo=1"], "foo: unknown config key"),
        (["run.sed=1"], "run.sed: unknown config key"),
        (["+run.extra=1"], "run.extra: unknown config key"),
        (["run.seed=abc"], "run.seed:"),
        (["execution.slots_per_node=2.5"], "execution.slots_per_node:"),
        (["+experiment=no_such_experiment"], "no experiment named 'no_such_experiment'"),
        (["method=no_such_method"], "no option for 'method' named 'no_such_method'"),
        (["run.time_limit_s=-5"], "run.time_limit_s"),
        (["run.budget.executions=-1"], "run.budget.executions"),
        (["run.resume=/nonexistent/run"], "run.resume=/nonexistent/run"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(argv, needle):
    with pytest.raises(UserError) as info:
        check_overrides(CONF_DIR, argv)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def _cli(tmp_path, *args: str) -> tuple[int, list[str]]:
    """Run the entry point; its exit code and the non-empty lines it wrote to stderr."""
    proc = subprocess.run([sys.executable, "-m", "milo_ray.run", *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


def test_cli_bad_key_exits_2_with_one_line_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "existing"
    run_dir.mkdir()
    (run_dir / "keep.txt").write_text("x")
    code, err_lines = _cli(tmp_path, "nosuchkey=1", f"run.dir={run_dir}")
    assert code == 2
    assert len(err_lines) == 1 and err_lines[0].startswith("error: nosuchkey")
    assert sorted(p.name for p in run_dir.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "runs").exists()


def test_cli_bad_constructor_argument_exits_2_naming_the_section(tmp_path):
    code, err_lines = _cli(tmp_path, "benchmark.preset=no_such_preset", f"run.dir={tmp_path / 'r'}")
    assert code == 2
    assert len(err_lines) == 1 and err_lines[0].startswith("error: benchmark: ")
    assert "no_such_preset" in err_lines[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("override,key", [("execution.max_retries=-1", "execution.max_retries"),
                                          ("execution.group_limit=0", "execution.group_limit"),
                                          ("run.budget.executions=-5", "run.budget.executions")])
def test_cli_bad_setting_value_exits_2_before_the_run_directory_exists(tmp_path, override, key):
    code, err_lines = _cli(tmp_path, override, f"run.dir={tmp_path / 'r'}")
    assert code == 2, err_lines[-5:]
    assert len(err_lines) == 1 and err_lines[0].startswith(f"error: {key}")
    assert not (tmp_path / "r").exists()
