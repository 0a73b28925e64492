"""The bottom layer's value types: identities stored runs depend on never change, and a
task carries its format as an object that any executor can use."""

from __future__ import annotations

import pickle

import pytest

from milo_ray.core.rollouts import RolloutRequest, cache_key
from milo_ray.core.seeds import derive_seed
from milo_ray.core.tasks import Task, Verdict, format_of
from milo_ray.execution.agent_executor import AgentExecutor

SANDBOX = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}


def test_cache_keys_and_seeds_keep_the_values_stored_runs_hold():
    # Values computed by the implementation stored runs were written with: a changed encoding
    # would make every stored rollout look unfinished and rerun it.
    assert cache_key("h0", "task-1", 2, "openai/gpt-x", 7) == "3fbaf1c0476c4300c5390287ee66b588"
    assert RolloutRequest("h0", "task-1", 2, 7).key("openai/gpt-x") == "3fbaf1c0476c4300c5390287ee66b588"
    assert derive_seed(7, "parent", 1, 3) == 299161834186259801


class NamedOnlyHereFormat:
    """A format no module table lists: a task carrying it must still run."""

    name = "named_only_here"

    def __init__(self) -> None:
        self.specs: list[str] = []

    def sandbox_spec(self, task: Task):
        from milo_ray.boundary.sandbox.base import SandboxSpec

        self.specs.append(task.task_id)
        return SandboxSpec(task_id=task.task_id, workdir="/app", allow_internet=True)

    def verify(self, task, sandbox) -> Verdict:
        return Verdict(score=1.0)

    def solve(self, task, sandbox):
        return None


def test_a_task_keeps_its_format_object_across_pickling():
    fmt = NamedOnlyHereFormat()
    task = Task("t1", "train", "do it", 10.0, 0, {"format": fmt.name}, format=fmt)
    back = pickle.loads(pickle.dumps(task))
    assert type(format_of(back)) is NamedOnlyHereFormat and back == task


def test_the_rollout_executor_asks_the_format_the_task_carries():
    fmt = NamedOnlyHereFormat()
    ex = AgentExecutor(model=None, sandbox=SANDBOX, agent="oracle")
    task = Task("t1", "train", "do it", 10.0, 0, {"format": fmt.name}, format=fmt)
    problems = ex.unsupported_tasks([task])
    assert fmt.specs == ["t1"]
    assert all("named_only_here" not in p for p in problems)


def test_a_task_without_a_format_is_named_when_a_real_executor_gets_it():
    task = Task("surrogate-3", "train", "", 1.0, 0, {"format": "harbor"})
    with pytest.raises(ValueError, match="surrogate-3"):
        format_of(task)
