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

# Task fixtures carry their own verifier tests (tests/fixtures/harbor_tasks/*/tests/),
# which run inside a task's sandbox, never in this suite.
collect_ignore_glob = ["fixtures/*"]


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


@pytest.fixture
def key_env(monkeypatch):
    """The scripted model's key, set for the test (the name of its variable is returned)."""
    from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV

    monkeypatch.setenv(SCRIPTED_KEY_ENV, "local-secret")
    return SCRIPTED_KEY_ENV


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


# --- CI's rotation of the slow suite (scripts/ci_rotation.py) ---------------------------

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ci_rotation():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("ci_rotation", os.path.join(_ROOT, "scripts", "ci_rotation.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ci_rotation", module)
    spec.loader.exec_module(module)
    return module


def pytest_addoption(parser):
    parser.addoption(
        "--rotation", action="store_true",
        help="of the slow-marked tests, run only the files of this commit's part (of 3); every file runs "
             "in any 3 consecutive commits (scripts/ci_rotation.py)")
    parser.addoption("--rotation-part", type=int, default=None,
                     help="with --rotation: this part instead of the commit's (0, 1 or 2)")


def pytest_configure(config):
    # `pytest -n 2` distributes by xdist group (the groups are set below) unless told another
    # --dist. Set here rather than in pyproject's addopts, which an interpreter without
    # pytest-xdist (the Harbor environment's) would refuse. Both sides need it: the
    # controller schedules by group, each worker names its tests' groups in their ids.
    if any(a.startswith("--dist") for a in config.invocation_params.args):
        return
    if hasattr(config, "workerinput"):
        config.option.loadgroup = True
    elif getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`-n 2 --dist loadgroup`) a fixture wider than a test is set up
    # once per worker that runs one of its tests. So the tests that read the shared runs go
    # to one worker (the session produces those runs once: about a minute of CPU), and so do
    # the tests of a module that has a module- or class-wide fixture (often a whole run) and
    # the tests that build Docker images.
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if config.getoption("--rotation"):
        _rotate_slow_tests(config, items)


def _xdist_group(item) -> str | None:
    names = getattr(item, "fixturenames", ())
    if "docker_base_image" in names:
        # One daemon, one build cache: a test removing its image (and the untagged parents
        # it alone used) while another worker builds on those parents fails that build.
        return "docker"
    if "shared_runs" in names:
        return "shared_runs"
    info = getattr(item, "_fixtureinfo", None)  # pytest's per-item fixture closure
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        if any(d.scope in ("module", "class") for d in defs):
            return item.nodeid.split("::", 1)[0]
    return None


def _rotate_slow_tests(config, items):
    from pathlib import Path

    rotation = _ci_rotation()
    part = config.getoption("--rotation-part")
    rot = rotation.rotation_of(Path(_ROOT)) if part is None else rotation.Rotation.chosen(part)
    keep, drop, files = [], [], {True: set(), False: set()}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("slow") is None:
            keep.append(item)
            continue
        chosen = rot.runs_slow_file(path)
        (keep if chosen else drop).append(item)
        files[chosen].add(path)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    config._ci_rotation_summary = (
        f"rotation: {rot.why}; slow test files run {len(files[True])}, "
        f"left to the other parts {len(files[False] - files[True])}: "
        + (" ".join(sorted(files[True])) or "none"))


def pytest_terminal_summary(terminalreporter, config):
    summary = getattr(config, "_ci_rotation_summary", None)
    if summary:
        terminalreporter.write_line(summary)
