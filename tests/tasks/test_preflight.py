"""Every run's preflight: tasks whose image is not on the Docker host are named all in
one message before the run writes anything; run.skip_unrunnable_tasks=true skips them
with a warning instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from milo_ray.config.errors import UserError
from milo_ray.tasks.check import compose

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_suite import make_task  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def docker_suite(tmp_path, fake_docker):
    suite = tmp_path / "suite"
    for name in ("gone-a", "gone-b"):
        make_task(suite, name, toml_extra=f'docker_image = "registry.example/{name}:1"\n')
        (suite / name / "environment" / "Dockerfile").unlink()
    make_task(suite, "present", toml_extra='docker_image = "present:1"\n')
    (suite / "present" / "environment" / "Dockerfile").unlink()
    overrides = ["method=eval", "executor.agent=oracle", "sandbox=docker", f"sandbox.docker=[{fake_docker}]",
                 "benchmark.splits={test: 1.0}"]
    return suite, overrides


def test_a_run_names_every_task_whose_image_is_missing_in_one_message(docker_suite):
    from milo_ray.run import prepare_run

    suite, overrides = docker_suite
    _, cfg = compose(suite, overrides)
    with pytest.raises(UserError) as err:
        prepare_run(cfg)
    msg = str(err.value)
    assert "2 of 3 tasks cannot run here" in msg and "run.skip_unrunnable_tasks=true" in msg
    assert "registry.example/gone-a:1 is not on the Docker host" in msg
    assert "registry.example/gone-b:1 is not on the Docker host" in msg and "present:1" not in msg


def test_skip_unrunnable_tasks_drops_the_missing_image_tasks(docker_suite):
    from milo_ray.run import prepare_run

    suite, overrides = docker_suite
    _, cfg = compose(suite, [*overrides, "run.skip_unrunnable_tasks=true"])
    prepared = prepare_run(cfg)
    assert sorted(prepared.skipped) == ["gone-a", "gone-b"] and list(prepared.tasks) == ["present"]


@pytest.mark.slow  # a command-line run (~10 s of imports)
def test_the_refused_run_writes_nothing(docker_suite, tmp_path):
    suite, overrides = docker_suite
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "milo_ray.run", *overrides, "benchmark=harbor",
                           f"benchmark.path={suite}", f"run.dir={run_dir}", "run.progress=false"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "gone-a" in proc.stderr and "gone-b" in proc.stderr
    assert not run_dir.exists()
