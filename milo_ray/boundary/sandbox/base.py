"""What every sandbox shares: the environment a task asks for (:class:`SandboxSpec`), the
factory protocol the ``sandbox`` config group builds (:class:`SandboxFactory`), and the
sandbox object itself (:class:`Sandbox`, a ``deepagents`` ``BaseSandbox``).

A sandbox is opened per rollout and closed after grading. Paths inside it are the task's:
the workspace at ``spec.workdir`` (Harbor's WORKDIR, default ``/app``), ``/logs`` (the
agent's and the verifier's output; ``/logs/verifier/reward.txt`` etc.), and ``/tests`` and
``/solution``, which the executor uploads only when it needs them (after the agent
finished, for the tests). Everything the executor does inside goes through ``execute``,
``upload_files`` and ``download_files``, so bwrap and Docker are interchangeable.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from deepagents.backends.sandbox import BaseSandbox

# Directories every sandbox provides, writable, besides the workdir.
LOGS_DIR = "/logs"
TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"


def resolve_timeout(timeout: int | float | None, default_s: float | None) -> float | None:
    """The timeout of one ``execute(command, timeout=...)`` in seconds. None and 0 both
    mean the factory's default: deepagents lets a backend read 0 as "no timeout", but an
    agent's command must never be unbounded here, whatever the agent asks for."""
    if timeout is not None and timeout < 0:
        raise ValueError(f"execute timeout must be >= 0 seconds (0 or None: the sandbox default), got {timeout}")
    return float(timeout) if timeout else default_s


@dataclass(frozen=True)
class SandboxSpec:
    """The environment one task asks for (built by the task's format from its files).

    ``copy_in``: (host path, sandbox path) pairs copied into the sandbox when it opens --
    the Dockerfile's COPY lines, for sandboxes that do not build the image (bwrap).
    ``build_context``: host directory holding the task's Dockerfile (Docker builds it);
    ``docker_image``: a prebuilt image to use instead. ``needs_docker``: why the host
    cannot stand in for the task's image (e.g. the Dockerfile has RUN steps), or None.
    ``env``: environment variables the task sets for its commands.
    ``host_readonly``: absolute host paths the task's commands need to see read-only, on
    top of what the sandbox shows anyway (e.g. the interpreter whose packages a task's
    programs import); bwrap binds them, Docker mounts them, the local sandbox sees the host.
    """

    task_id: str
    workdir: str = "/app"
    allow_internet: bool = False
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    copy_in: tuple[tuple[str, str], ...] = ()
    build_context: str | None = None
    docker_image: str | None = None
    needs_docker: str | None = None
    host_readonly: tuple[str, ...] = ()


class Sandbox(BaseSandbox):
    """A deepagents sandbox backend with a lifetime: commands run with the workdir as
    current directory, a per-command timeout and an output cap; :meth:`interrupt` kills
    every process running inside (the files stay, so the workspace can be graded);
    :meth:`close` kills everything and frees the sandbox. Usable as a context manager."""

    @abstractmethod
    def interrupt(self) -> None:
        """Kill every process currently running in the sandbox; keep its files."""

    @abstractmethod
    def close(self) -> None:
        """Kill everything and release the sandbox (idempotent)."""

    def oom_kills(self) -> int | None:
        """How many of the sandbox's processes the kernel's OOM killer has killed so far,
        as the sandbox's own memory cgroup counts them; None when this sandbox has no such
        counter (then nothing may be reported as "out of memory" on its word)."""
        return None

    def shell_path(self, path: str) -> str:
        """``path`` (a task path such as the workdir) as a command's shell sees it: the
        same path in a sandbox with its own view of the task's paths (bwrap, Docker)."""
        return path

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@runtime_checkable
class SandboxFactory(Protocol):
    """Built from the ``sandbox`` config group inside each rollout worker; opens one
    sandbox per rollout. ``scratch`` is a fresh host directory owned by the rollout (the
    sandbox may keep its workspace, logs and temp files there; it is deleted afterwards)."""

    name: str

    def unsupported(self, spec: SandboxSpec) -> str | None:
        """Why this sandbox cannot run a task with ``spec`` (names the task and the fix,
        e.g. ``sandbox=docker``), or None. Checked for every task before a run starts."""
        ...

    def open(self, spec: SandboxSpec, scratch: Path) -> Sandbox: ...
