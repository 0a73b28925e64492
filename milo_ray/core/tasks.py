"""The task value type -- what a benchmark hands a method and an executor runs -- and the
:class:`TaskFormat` protocol by which a real task is set up and graded.

A :class:`Task` is small, frozen and picklable: it crosses Ray process boundaries with
every rollout. Tasks are not stored; a run rebuilds them from its benchmark config.

A benchmark of real tasks (Harbor directories, SWE-style JSONL, einstein-agent) builds
tasks that carry their format as an object (``Task.format``); the rollout executor asks
it, in the worker process, for the sandbox the task needs, the verifier's
:class:`Verdict` and the reference solution. The format objects live with their
benchmarks; this module only states the contract, so an executor never imports a
benchmark to run one of its tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from milo_ray.boundary.sandbox.base import Sandbox, SandboxSpec


@dataclass(frozen=True)
class Task:
    """One benchmark task.

    ``metadata`` holds benchmark-specific, JSON-serializable facts (for the surrogate:
    latent difficulty, failure-mode propensities, hidden-test count); executors read
    it, methods must not rely on it.

    ``time_cap_s`` bounds the agent's work; ``grading_cap_s`` is the wall time a real
    rollout needs on top of it to set up its sandbox and run the task's verifier (0 for
    simulated tasks). The worker cancels a rollout past ``time_cap_s * grace + grading_cap_s``.

    ``format`` is the :class:`TaskFormat` that sets up and
    grades a real task (Harbor, SWE, einstein-agent); None for tasks whose executor
    grades them itself (the surrogate, the instance-level optimizer track). It travels
    with the task when the task is pickled to a worker (by its class, which is importable
    wherever milo_ray is), so a worker never resolves a format by name.
    """

    task_id: str
    split: str
    instruction: str
    time_cap_s: float
    token_cap: int
    metadata: dict[str, Any] = field(default_factory=dict)
    grading_cap_s: float = 0.0
    format: TaskFormat | None = field(default=None, compare=False, repr=False)


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
    # The grader's calls and budget (a format with ``uses_grader``), kept in the trace.
    grader: dict[str, Any] | None = None


class GraderRefused(RuntimeError):
    """The grader made no call: the rollout's grading budget (calls or tokens) is spent.
    A format counts what it could not grade the way it counts a failed verdict."""


class Grader(Protocol):
    """The metered ``grader`` role as a verifier sees it: one model call per :meth:`ask`,
    made by the host (never from a sandbox), counted against this rollout's grading
    budget and recorded as role ``grader`` (never against the solver's token cap).
    Only a format that sets ``uses_grader = True`` is handed one."""

    def ask(self, system: str, user: str, *, purpose: str) -> str:
        """The model's answer to one (system, user) exchange. ``purpose`` names the call in
        the record (e.g. ``leaf:2.1``). Raises :class:`GraderRefused` once the budget is
        spent, ``RuntimeError`` when the call failed after its retries."""
        ...


class TaskEpisode(Protocol):
    """One rollout's live task world, for a format whose task is an environment the agent
    acts in rather than a workspace it leaves behind (an ARE scenario): started on the host
    before the agent acts, serving the task's own tools on a Unix socket that only the
    rollout's sandbox is shown (the harness gets them as ``backend.task_tools``), and
    judged once the agent's processes are dead."""

    def wait_ready(self) -> None:
        """Block until the tools are served (the world bounds this wait itself);
        ``RuntimeError`` saying why the world could not start (an infrastructure failure
        of the rollout)."""
        ...

    def finish(self) -> Verdict:
        """The agent is done: the world's judgment as a verdict (its grader calls, when it
        made any, in ``grader``). Never raises for the agent's actions."""
        ...

    def close(self) -> None:
        """End the world's process, whatever state it is in."""
        ...


class TaskFormat(Protocol):
    """One kind of real task. ``name`` is what the task's ``metadata["format"]`` says.

    A format whose verifier needs a model sets ``uses_grader = True``; its ``verify`` is
    then called as ``verify(task, sandbox, grader=...)`` with a :class:`Grader`. Formats
    that need no model keep the two-argument ``verify`` and get nothing new.

    A format whose task forbids some of what an agent could do (PaperBench's blacklisted
    resources) provides ``screen(task, steps) -> str | None``: given the agent's
    trajectory steps once its run is over, the reason the attempt is void (it then scores
    0 with that reason, whatever the verifier said), or None.

    A format whose task is a live world sets ``episodic = True`` and provides
    ``start_episode(task, socket, *, oracle, grader) -> TaskEpisode``: the world serves its
    tools at ``socket`` (or, with ``oracle``, acts out its reference solution itself), and
    its verdict is the episode's (``verify`` and ``solve`` are not called)."""

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
    """The format ``task`` carries; ``ValueError`` names the task when it carries none
    (a simulated or instance-level task given to an executor of real tasks)."""
    if task.format is None:
        raise ValueError(f"task {task.task_id!r} (metadata['format']={task.metadata.get('format')!r}) carries no "
                         "task format: it is not a real task (Harbor, SWE, einstein_agent); run it with the "
                         "executor its benchmark names")
    return task.format
