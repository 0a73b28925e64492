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
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from milo_ray.execution.sandbox.bwrap import DEFAULT_HOST_READONLY

ANSWER = "42"
EXPECTED = {"ok-task": "ok", "trivial-task": "trivial", "broken-solution": "broken", "flaky-verifier": "flaky",
            "network-verifier": "needs-network", "run-step": "needs-docker", "no-verifier": "unrunnable"}

_CHECK_ANSWER = (f'[ "$(cat /app/answer.txt 2>/dev/null | tr -d "[:space:]")" = "{ANSWER}" ]')


def make_task(root: Path, name: str, *, test_sh: str | None = None, solve_sh: str | None = None,
              dockerfile: str = "FROM python:3.11-slim\nWORKDIR /app\nCOPY notes.txt /app/notes.txt\n",
              toml_extra: str = "") -> Path:
    """A Harbor task asking for 42 in /app/answer.txt; reward 1 when it is there."""
    d = root / name
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "instruction.md").write_text(f"Write {ANSWER} into /app/answer.txt.\n")
    (d / "task.toml").write_text('version = "1.0"\n\n[agent]\ntimeout_sec = 60\n\n[verifier]\ntimeout_sec = 30\n\n'
                                 f"[environment]\nallow_internet = false\n{toml_extra}")
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "environment" / "notes.txt").write_text("the answer goes to /app/answer.txt\n")
    (d / "tests" / "test.sh").write_text(test_sh or (
        f"#!/bin/bash\nmkdir -p /logs/verifier\nif {_CHECK_ANSWER}; then echo 1; else echo 0; fi"
        " > /logs/verifier/reward.txt\n"))
    (d / "solution" / "solve.sh").write_text(solve_sh or f"#!/bin/bash\necho {ANSWER} > /app/answer.txt\n")
    return d


class RewardServer:
    """Gives 1, 0, 1, 0, ... to successive connections on a Unix socket in a directory the
    sandbox can traverse (its processes run as nobody)."""

    def __init__(self) -> None:
        import socket

        self.dir = Path(tempfile.mkdtemp(prefix="milo-taskcheck-", dir="/var/tmp"))
        self.dir.chmod(0o755)
        self.socket_path = self.dir / "reward.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.socket_path))
        self.socket_path.chmod(0o777)
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        n = 0
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.sendall(b"1\n" if n % 2 == 0 else b"0\n")
            n += 1

    def client(self) -> str:
        """A shell command printing the next reward."""
        return ("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
                f"s.connect('{self.socket_path}'); print(s.recv(8).decode().strip())\"")

    def close(self) -> None:
        self._sock.close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Suite:
    path: Path
    overrides: list[str]


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
    make_task(root, "network-verifier", test_sh=(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/pytest/', timeout=5)\" "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"))
    make_task(root, "run-step", dockerfile="FROM python:3.11-slim\nWORKDIR /app\nRUN pip install pytest\n")
    (make_task(root, "no-verifier") / "tests" / "test.sh").unlink()
    readonly = [p for p in DEFAULT_HOST_READONLY if os.path.exists(p)] + [str(rewards.dir)]
    yield Suite(root, [f"sandbox.host_readonly=[{','.join(readonly)}]", "execution.num_cpus=2"])
    rewards.close()


@pytest.fixture
def fake_docker(tmp_path) -> Path:
    """A docker CLI whose daemon answers and holds only the image ``present:1``."""
    script = tmp_path / "fake-docker"
    script.write_text('#!/bin/sh\ncase "$1" in\n  info) echo 2 ;;\n'
                      '  image) for last; do :; done; [ "$last" = present:1 ] ;;\n'
                      '  *) echo "fake docker cannot $1" >&2; exit 1 ;;\nesac\n')
    script.chmod(0o755)
    return script
