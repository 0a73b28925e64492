"""Test-wide setup: offline environment and one shared local Ray instance."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

import pytest

# The store contract suite and the kernel references live in the package
# (milo_ray.testing); rewrite their asserts for readable failures.  This must run
# before any test module imports them, hence the root conftest.
pytest.register_assert_rewrite("milo_ray.testing")


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance shared by the whole session (starting Ray costs seconds)."""
    import ray

    from milo_ray.execution.cluster import start_local

    if not ray.is_initialized():
        # Ray workers build agents from ``_target_`` specs, some of them test fakes
        # (tests/milo/milo_fakes.py, tests/ssr/...): workers inherit this path.
        here = os.path.dirname(os.path.abspath(__file__))
        extra = [os.path.join(here, d) for d in ("milo", "ssr")]
        os.environ["PYTHONPATH"] = os.pathsep.join(extra + [p for p in [os.environ.get("PYTHONPATH")] if p])
        start_local(num_cpus=2, slots=8, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """The directory of the tiny finished runs several test files read (tests/shared_runs.py),
    produced once per session. Tests copy a run before changing it."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from shared_runs import produce

    return produce(tmp_path_factory.mktemp("shared-runs"))


@pytest.fixture(scope="session")
def docker_base_image() -> str:
    """The pull-free base image, with a Docker daemon answering (started if need be). Without
    one the test skips, saying why -- except under ``CI=true``, where CI starts dockerd, so a
    missing daemon is a failure."""
    from milo_ray.testing.dockerd import ensure_dockerd, local_base_image

    reason = ensure_dockerd()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs the Docker tests, but no Docker daemon answers: {reason}")
        pytest.skip(f"no Docker daemon: {reason}")
    return local_base_image()
