"""One ARE scenario run for one rollout, seen from this project's side: the host process
(:mod:`.host`, under ARE's interpreter) started, its tool channel's socket path handed to
whoever drives the agent, the judge's LLM checks answered through the grader role, and
ARE's judgment read back as a score.

The interpreter is ``MILO_RAY_ARE_PYTHON`` or ``~/.cache/milo_ray/are-venv/bin/python``
(``scripts/are_env.sh`` builds it).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from milo_ray.boundary.sandbox.helper_jail import interpreter_dirs, jail_argv
from milo_ray.boundary.sandbox.runtime_code import runtime_code_dir
from milo_ray.core.tasks import Grader, GraderRefused

HOST = Path(__file__).with_name("host.py")
DEFAULT_PYTHON = Path("~/.cache/milo_ray/are-venv/bin/python").expanduser()


def are_python() -> Path:
    """The ARE interpreter, or ``FileNotFoundError`` saying how to make it."""
    py = Path(os.environ.get("MILO_RAY_ARE_PYTHON") or DEFAULT_PYTHON)
    if not py.is_file():
        raise FileNotFoundError(f"no ARE interpreter at {py}: run scripts/are_env.sh, or set MILO_RAY_ARE_PYTHON "
                                "to the interpreter of an environment with meta-agents-research-environments")
    return py


class Episode:
    """The host process of one scenario (module docstring). ``judge``: ``scripted`` (no
    LLM check) or ``grader`` (LLM checks through ``grader``); ``mode``: ``agent`` (an
    agent drives the tools at :attr:`socket` until :meth:`finish`) or ``oracle``."""

    def __init__(self, scenario: Path, socket: Path, *, judge: str = "scripted", mode: str = "agent",
                 grader: Grader | None = None, python: Path | None = None, log: Path | None = None) -> None:
        if judge == "grader" and grader is None:
            raise ValueError("judge=grader needs the grader role (executor.grader)")
        self.socket, self.grader = socket, grader
        # Refused: the grading budget was spent (counted like a failed check, as the other
        # formats do); failed: the grader's endpoint failed, which is no verdict on the
        # agent (its caller makes the rollout an infrastructure failure).
        self.grader_calls, self.grader_refused, self.grader_failed = 0, 0, 0
        self._ready = threading.Event()
        self._done = threading.Event()
        self.ready: dict[str, Any] | None = None
        self.verdict: dict[str, Any] | None = None
        python = Path(python or are_python())
        # The world runs jailed: its app tools take the model's arguments, and some of ARE's
        # apps read and write any host path they are handed (boundary/sandbox/helper_jail.py).
        code = runtime_code_dir()
        host = code / HOST.relative_to(HOST.parents[3])  # .../milo_ray/benchmarks/are/host.py
        argv = jail_argv([str(python), str(host), "--scenario", str(scenario), "--socket", str(socket),
                          "--judge", judge, "--mode", mode],
                         readonly=[*interpreter_dirs(python), str(code), str(Path(scenario).parent)],
                         writable=[str(Path(socket).parent)])
        self._stderr = open(log, "wb") if log else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                          env={**_host_env(), "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1"})
        except BaseException:
            if self._stderr is not subprocess.DEVNULL:
                self._stderr.close()
            raise
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _send(self, **msg: Any) -> None:
        try:
            self._proc.stdin.write((json.dumps(msg) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            t = msg.get("t")
            if t == "ready":
                self.ready = msg
                self._ready.set()
            elif t == "grader":
                self._answer(msg)
            elif t in ("verdict", "error"):
                self.verdict = msg
                self._ready.set()
                self._done.set()
        self._ready.set()
        self._done.set()

    def _answer(self, msg: dict[str, Any]) -> None:
        self.grader_calls += 1
        try:
            text = self.grader.ask(str(msg.get("system", "")), str(msg.get("user", "")),
                                   purpose=str(msg.get("purpose", "are")))
        except GraderRefused as exc:
            self.grader_refused += 1
            self._send(t="grader_answer", id=msg["id"], error=f"grading budget spent: {exc}")
            return
        except Exception as exc:
            self.grader_failed += 1
            self._send(t="grader_answer", id=msg["id"], error=f"{type(exc).__name__}: {exc}")
            return
        self._send(t="grader_answer", id=msg["id"], text=text)

    def wait_ready(self, timeout_s: float = 300.0) -> dict[str, Any]:
        """The host's ``ready`` (its tool count, turns, setup seconds); ``RuntimeError`` if it
        failed first."""
        self._ready.wait(timeout_s)
        if self.ready is None:
            raise RuntimeError(f"ARE host process: {(self.verdict or {}).get('error') or 'not ready in time'}")
        return self.ready

    def finish(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Tells the host the agent is done and returns its verdict message (``t`` is
        ``verdict`` or ``error``)."""
        self._send(t="finish")
        if not self._done.wait(timeout_s) or self.verdict is None:
            self.close()
            return {"t": "error", "error": f"the ARE host gave no verdict within {timeout_s:g} s"}
        return self.verdict

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._stderr is not subprocess.DEVNULL:
            self._stderr.close()


def _host_env() -> dict[str, str]:
    """The host process's environment: what an interpreter needs and nothing else, so no
    provider key or cloud credential of this process reaches ARE (its LLM checks go through
    the grader role, which holds the grader's key on this side)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
    return {k: os.environ[k] for k in keep if k in os.environ}


def score_of(verdict: dict[str, Any]) -> tuple[float, str | None]:
    """(score, error): 1 when ARE's judge says success, 0 otherwise; an ``error`` message
    (the scenario could not run) is the error."""
    if verdict.get("t") != "verdict":
        return 0.0, str(verdict.get("error") or "no verdict")
    return (1.0 if verdict.get("success") is True else 0.0), None
