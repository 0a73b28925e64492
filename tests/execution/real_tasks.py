"""Tiny Harbor tasks and scripted model policies for the real-executor tests.

A task here is the smallest real Harbor task: an instruction, a task.toml, an
environment whose Dockerfile only sets WORKDIR and COPYs a file, a verifier script that
writes /logs/verifier/reward.txt, and a reference solution. The model policies answer
from the conversation (not from arrival order), so concurrent rollouts against one
scripted server each get a coherent dialogue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from milo_ray.testing.openai_server import Reply, error, reply, tool_call

ANSWER = "42"
WRITE_TOKENS = (120, 30)   # usage of the tool-calling answer
DONE_TOKENS = (180, 8)     # usage of the closing answer


def make_task(root: Path, name: str, *, instruction: str | None = None, agent_timeout_s: float = 60,
              verifier_timeout_s: float = 30, answer: str = ANSWER, difficulty: str = "easy",
              test_sh: str | None = None) -> Path:
    """A Harbor task asking for ``answer`` in /app/answer.txt (reward 1 when it is there);
    ``test_sh`` replaces the shell verifier."""
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(instruction or f"Write the number {answer} into /app/answer.txt.\n")
    (d / "task.toml").write_text(
        f'version = "1.0"\n\n[metadata]\ndifficulty = "{difficulty}"\n\n'
        f"[agent]\ntimeout_sec = {agent_timeout_s}\n\n[verifier]\ntimeout_sec = {verifier_timeout_s}\n\n"
        "[environment]\ncpus = 1\nmemory_mb = 1024\nallow_internet = false\n")
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\nCOPY notes.txt /app/notes.txt\n")
    (d / "environment" / "notes.txt").write_text("the answer goes to /app/answer.txt\n")
    (d / "tests" / "test.sh").write_text(test_sh or (
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        f'if [ "$(cat /app/answer.txt 2>/dev/null | tr -d "[:space:]")" = "{answer}" ]; then\n'
        "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"))
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {answer} > /app/answer.txt\n")
    return d


def _tool_results(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages", []) if m.get("role") == "tool")


def _instruction(body: dict[str, Any]) -> str:
    return next((str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"), "")


def solving_policy(body: dict[str, Any]) -> Reply:
    """Writes the answer with the harness's write_file tool, then stops."""
    if _tool_results(body) == 0:
        return tool_call("write_file", {"file_path": "/app/answer.txt", "content": f"{ANSWER}\n"},
                         prompt_tokens=WRITE_TOKENS[0], completion_tokens=WRITE_TOKENS[1])
    return reply("The answer is written.", prompt_tokens=DONE_TOKENS[0], completion_tokens=DONE_TOKENS[1])


def quitting_policy(body: dict[str, Any]) -> Reply:
    """Stops at once without touching the workspace."""
    return reply("I cannot do this.", prompt_tokens=50, completion_tokens=6)


def slow_after_write_policy(delay_s: float):
    """Writes the answer, then takes ``delay_s`` for its next answer (past the agent cap)."""

    def policy(body: dict[str, Any]) -> Reply:
        r = solving_policy(body)
        if _tool_results(body) > 0:
            r.delay_s = delay_s
        return r

    return policy


def failing_for(marker: str, status: int = 500):
    """HTTP ``status`` for every request of a task whose instruction contains ``marker``;
    the solving policy for the others."""

    def policy(body: dict[str, Any]) -> Reply:
        return error(status) if marker in _instruction(body) else solving_policy(body)

    return policy


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
