"""The provider key crosses from the driver to the rollout worker as an actor-call
argument, never through runtime_env: after a real rollout through the scheduler, no file
under Ray's session directory (its logs, runtime_env_agent.log included) holds it."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.core.rollouts import RolloutRequest
from milo_ray.harness.model import Harness
from milo_ray.store import MemoryRunStore
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

from hostile import make_secret_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

KEY_ENV = "MILO_SECURITY_RAY_KEY"

CALL_ONCE = Harness.from_source('''
from langchain.agents import create_agent
def build_agent(model, backend):
    return create_agent(model, tools=[])
''', name="call-once")


def test_the_key_reaches_the_worker_and_no_ray_file(tmp_path, ray_local, monkeypatch):
    import ray

    from milo_ray.execution.scheduler import RolloutScheduler

    key = "sk-ray-canary-" + uuid.uuid4().hex
    monkeypatch.setenv(KEY_ENV, key)
    make_secret_task(tmp_path / "tasks")
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    tasks = {t.task_id: t for t in suite.tasks("test")}

    def policy(body):
        return reply("done", prompt_tokens=7, completion_tokens=2)

    with ScriptedOpenAIServer(policy) as srv:
        executor = {"_target_": "milo_ray.execution.agent_executor.AgentExecutor",
                    "model": {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": KEY_ENV,
                              "max_retries": 0},
                    "sandbox": {"_target_": "milo_ray.execution.sandbox.bwrap.BwrapSandboxFactory"}}
        sched = RolloutScheduler(executor, tasks, MemoryRunStore(run_id="keys"), "openai/scripted", "keys",
                                 progress=False, worker_env={KEY_ENV: key})
        try:
            sched.add_harness(CALL_ONCE)
            [res] = sched.run([RolloutRequest(CALL_ONCE.harness_id, "secret", 0, seed=1)])
        finally:
            sched.close()
    assert res.error_kind is None, res.error
    assert res.input_tokens == 7  # the worker called the provider with the key it was handed
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    holding = []
    for path in session.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if key.encode() in path.read_bytes():
                    holding.append(str(path.relative_to(session)))
            except OSError:
                continue
    assert holding == []
