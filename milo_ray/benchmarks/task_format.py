"""How a real task is set up and graded, whatever loaded it.

A benchmark of real tasks (Harbor directories, SWE-style JSONL) builds :class:`Task`
objects whose ``metadata["format"]`` names a :class:`TaskFormat`; the rollout executor
looks the format up with :func:`format_of` (in the worker process) and asks it for the
sandbox the task needs, the instruction, the verifier's verdict and the reference
solution. ``metadata`` holds plain values, and a task's files as a
:class:`~milo_ray.execution.shipping.ShippedTree` (``metadata["files"]``): content put into
the object store once and unpacked once per node, so a node that does not share the
driver's disk runs the task all the same. A format resolves the paths it needs against
the unpacked tree before it builds the :class:`SandboxSpec`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from milo_ray.execution.sandbox.base import Sandbox, SandboxSpec
from milo_ray.execution.types import Task

# Wall time a real rollout needs besides the agent's and the verifier's own caps: opening
# the sandbox (copying the workspace; under Docker, starting a container and, the first
# time a task runs on a node, building its image) and closing it. A task's
# ``grading_cap_s`` is its verifier timeout plus this.
SETUP_ALLOWANCE_S = 300.0

# metadata["format"] -> "module:attribute" of its TaskFormat (imported lazily).
FORMATS: dict[str, str] = {
    "harbor": "milo_ray.benchmarks.harbor:HARBOR",
    "swe": "milo_ray.benchmarks.swe:SWE",
    "einstein_agent": "milo_ray.benchmarks.einstein.agent_tasks:EINSTEIN_AGENT",
}


@dataclass
class Verdict:
    """What the task's verifier said. ``score`` in [0, 1]; ``error`` is set (and the
    rollout recorded with ``error_kind="task"``) when the verifier could not produce a
    reward -- e.g. a test script that needs the network -- in which case ``score`` is 0.
    ``reward``: the verifier's reward values (reward.json's dict, or {"reward": x});
    ``ctrf``: the verifier's CTRF report when it wrote one; ``output``: its (capped) output;
    ``details``: what else the format's grading found, kept in the rollout's trace (an
    einstein program's final point and score trajectory)."""

    score: float
    error: str | None = None
    reward: dict[str, float] = field(default_factory=dict)
    ctrf: dict[str, Any] | None = None
    output: str = ""
    seconds: float = 0.0
    details: dict[str, Any] | None = None


class TaskFormat(Protocol):
    name: str

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        """The environment the task asks for (workdir, network, limits, files, image)."""
        ...

    def verify(self, task: Task, sandbox: Sandbox) -> Verdict:
        """Run the task's tests in ``sandbox`` after the agent finished (uploading them
        first: the agent never sees them) and read the reward. Never raises for a
        failing or broken verifier: that is a Verdict with ``error``."""
        ...

    def solve(self, task: Task, sandbox: Sandbox) -> str | None:
        """Run the task's reference solution in ``sandbox`` (oracle mode); returns why it
        could not run (no solution, non-zero exit), or None."""
        ...


def format_of(task: Task) -> TaskFormat:
    """The format named by ``task.metadata["format"]``; ``ValueError`` names the task."""
    name = task.metadata.get("format")
    if name not in FORMATS:
        raise ValueError(f"task {task.task_id!r}: metadata['format']={name!r} is not one of {sorted(FORMATS)}")
    module, attr = FORMATS[name].split(":")
    return getattr(importlib.import_module(module), attr)
