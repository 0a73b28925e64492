"""The task check under a real Docker daemon: a task built on the pull-free base image
is ok, a task whose prebuilt image is not on the host is unrunnable without running.
Skips without a daemon that can be started, except under CI=true (CI starts one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from milo_ray.tasks.check import run_check
from milo_ray.testing.dockerd import local_host_mounts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_suite import make_task  # noqa: E402

pytestmark = pytest.mark.slow  # image builds and containers


def test_under_docker_a_buildable_task_is_ok_and_a_missing_image_is_unrunnable(tmp_path, docker_base_image, ray_local):
    suite = tmp_path / "suite"
    make_task(suite, "builds")
    make_task(suite, "gone", toml_extra='docker_image = "registry.example/milo-ray-gone:1"\n')
    (suite / "gone" / "environment" / "Dockerfile").unlink()
    result = run_check(suite, ["sandbox=docker", f"sandbox.base_image_override={docker_base_image}",
                               f"sandbox.host_mounts=[{','.join(local_host_mounts())}]", "execution.num_cpus=2"])
    by = {v.task_id: v for v in result.verdicts}
    assert by["builds"].verdict == "ok", by["builds"].reason
    assert by["builds"].oracle_scores == (1.0,) and by["builds"].noop_score == 0.0
    assert by["gone"].verdict == "unrunnable" and "registry.example/milo-ray-gone:1 is not on" in by["gone"].reason
    assert by["gone"].oracle_scores == ()
