"""Builders of the small Harbor suites the task-check tests share: tasks asking for 42 in
/app/answer.txt, and a Unix-socket reward server for a flaky verifier (its docstring says
how). The fixtures are in this directory's conftest."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path


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


