"""One small suite with a task of every verdict a bwrap check can give, built once per
session (tests/tasks/), and a fake docker CLI for the image checks.

The flaky task's verifier asks a thread of this process for its reward over a Unix
socket; the thread answers 1, 0, 1, ... to successive connections, so the task's two
oracle runs get different rewards whatever order they run in: flaky, deterministically.
The socket's directory is shown to the sandbox read-only (``sandbox.host_readonly``); a
socket can still be connected to there.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox.bwrap import DEFAULT_HOST_READONLY

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_suite import _CHECK_ANSWER, RewardServer, Suite, make_task  # noqa: E402


@pytest.fixture(scope="session")
def verdict_suite(tmp_path_factory):
    """The suite (``EXPECTED`` maps each task to its verdict) and the overrides a bwrap check needs."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    root = tmp_path_factory.mktemp("verdict-suite")
    rewards = RewardServer()
    make_task(root, "ok-task")
    make_task(root, "trivial-task", test_sh="#!/bin/bash\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n")
    # Half the tests already pass on the untouched workspace; the solution fails before
    # writing anything. Its score must be 0, not the untouched workspace's 0.5.
    make_task(root, "broken-solution", solve_sh="#!/bin/bash\necho 'patch does not apply' >&2\nexit 3\n",
              test_sh=f"#!/bin/bash\nmkdir -p /logs/verifier\nif {_CHECK_ANSWER}; then echo 1; else echo 0.5; fi"
                      " > /logs/verifier/reward.txt\n")
    make_task(root, "flaky-verifier", test_sh=(
        f"#!/bin/bash\nmkdir -p /logs/verifier\nif ! {_CHECK_ANSWER}; then echo 0 > /logs/verifier/reward.txt; "
        f"exit 0; fi\n{rewards.client()} > /logs/verifier/reward.txt\n"))
    # Its install step cannot download offline (curl says so), so its runner never arrives.
    make_task(root, "network-verifier", test_sh=(
        "#!/bin/bash\nmkdir -p /logs/verifier\ncurl -LsSf https://astral.sh/uv/install.sh | sh\n"
        "uvx pytest /tests && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"))
    make_task(root, "run-step", dockerfile="FROM python:3.11-slim\nWORKDIR /app\nRUN pip install pytest\n")
    (make_task(root, "no-verifier") / "tests" / "test.sh").unlink()
    readonly = [p for p in DEFAULT_HOST_READONLY if os.path.exists(p)] + [str(rewards.dir)]
    yield Suite(root, [f"sandbox.host_readonly=[{','.join(readonly)}]", "execution.num_cpus=2"])
    rewards.close()


@pytest.fixture
def fake_docker(tmp_path) -> Path:
    """A docker CLI whose daemon answers (2 CPUs, Docker's default seccomp profile) and
    holds only the image ``present:1``."""
    script = tmp_path / "fake-docker"
    script.write_text('#!/bin/sh\ncase "$1" in\n  info) echo \'2 ["name=seccomp,profile=default"]\' ;;\n'
                      '  image) for last; do :; done; [ "$last" = present:1 ] ;;\n'
                      '  *) echo "fake docker cannot $1" >&2; exit 1 ;;\nesac\n')
    script.chmod(0o755)
    return script
