"""Fixtures for sandbox tests that need a Docker daemon: factories on the pull-free base
image (the root conftest's ``docker_base_image``, which skips or fails without a daemon)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.docker import DockerSandboxFactory
from milo_ray.testing.dockerd import local_host_mounts


@pytest.fixture
def make_docker_factory(docker_base_image: str):
    """Factories building task Dockerfiles on the local base image (offline); keyword
    arguments override the test defaults."""

    def make(**options) -> DockerSandboxFactory:
        defaults = dict(command_timeout_s=20, output_cap_bytes=100_000, build_timeout_s=120,
                        base_image_override=docker_base_image, host_mounts=local_host_mounts())
        return DockerSandboxFactory(**{**defaults, **options})

    return make


@pytest.fixture
def docker_factory(make_docker_factory) -> DockerSandboxFactory:
    return make_docker_factory()


@pytest.fixture
def docker_task(docker_base_image: str, tmp_path: Path):
    """A task whose Dockerfile starts FROM an unpullable image and copies hello.txt into
    /app; the file's content is unique per test, so its image is built fresh (and removed
    afterwards, found by the task label the build puts on it)."""
    context = tmp_path / "task"
    context.mkdir()
    (context / "hello.txt").write_text(f"hello {uuid.uuid4().hex}\n")
    (context / "Dockerfile").write_text("FROM registry.example/unpullable:1.0\nWORKDIR /app\nCOPY hello.txt /app/\n")
    spec = SandboxSpec(task_id=f"docker-test-{uuid.uuid4().hex[:8]}", build_context=str(context),
                       env={"TASK_GREETING": "hi there"})
    yield spec
    images = subprocess.run(["docker", "images", "-q", "--filter", f"label=milo-ray.task={spec.task_id}"],
                            capture_output=True, text=True).stdout.split()
    if images:
        subprocess.run(["docker", "rmi", "-f", *images], capture_output=True)


@pytest.fixture
def docker_sandbox(docker_factory: DockerSandboxFactory, docker_task: SandboxSpec, tmp_path: Path):
    with docker_factory.open(docker_task, tmp_path / "scratch") as sandbox:
        yield sandbox
