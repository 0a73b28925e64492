"""One bundled Harbor task end to end under ``sandbox=docker``: the task's image is built
from its own Dockerfile (on the pull-free local base image), the rollout runs in a
container, and the task's verifier grades it there."""

from __future__ import annotations

import asyncio

import pytest

from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.benchmarks.task_format import format_of
from milo_ray.execution.agent_executor import AgentExecutor
from milo_ray.harness.seeds import load_seeds
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

TASK = "csv-to-json"


def _bundled_task():
    bench = HarborBenchmark(splits={"test": 1.0})
    return bench.task(TASK)


def test_bundled_task_in_a_container_built_from_its_dockerfile(make_docker_factory, monkeypatch):
    task = _bundled_task()
    factory = make_docker_factory(command_timeout_s=60)
    assert factory.unsupported(format_of(task).sandbox_spec(task)) is None
    harness = load_seeds(["minimal"])[0]
    oracle = AgentExecutor(sandbox=factory, agent="oracle")
    solved = asyncio.run(oracle.aexecute(harness, task, 0, 0))
    assert solved.error_kind is None, solved.error
    assert solved.score == 1.0
    assert solved.trace["ctrf"]["results"]["summary"]["failed"] == 0

    # The harness process runs only in bwrap: a harness under sandbox=docker is refused
    # before the run (unsupported_tasks), never run in the worker.
    monkeypatch.setenv("MILO_TEST_SOLVER_KEY", "local")
    with ScriptedOpenAIServer([reply("Nothing to do.", prompt_tokens=40, completion_tokens=4)]) as srv:
        model = {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": "MILO_TEST_SOLVER_KEY"}
        executor = AgentExecutor(model=model, sandbox=factory)
        assert "cannot host the harness process" in executor.unsupported_tasks([task])[0]
        with pytest.raises(ValueError, match="cannot host the harness process"):
            asyncio.run(executor.aexecute(harness, task, 0, 0))
    assert srv.requests == []
