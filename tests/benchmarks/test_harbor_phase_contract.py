"""Harbor's phase contract: the verifier's fresh sandbox sees the agent phase's /logs/agent
and /logs/artifacts, read-only, carried by the host without following a link; and the
verifier's deliberate probe of a blocked URL is never read as a failed download.

The task is tests/fixtures/harbor_tasks/publish-status (a network-policy task's shape:
the solution publishes its answer in /logs/artifacts, the verifier probes a blocked URL on
purpose and reads the artifact). The agent phase here is the task's solution or a planted
script (the oracle executor): it runs in the agent's sandbox as the agent would."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.tasks.executor import DO_NOTHING, ORACLE, CheckExecutor

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "harbor_tasks" / "publish-status"
BWRAP = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not installed")

# The agent phase of an attacker: links to a root-only host file, to a host file the
# sandbox cannot see (the host would read it if it followed the link), and /logs/agent
# swapped for a link to the root.
PLANT = """#!/bin/bash
echo blocked > /logs/artifacts/network-status.txt
ln -s /etc/shadow /logs/artifacts/y
ln -s {canary} /logs/artifacts/z
mkfifo /logs/artifacts/fifo
rm -rf /logs/agent && ln -s / /logs/agent
"""
# The verifier of the planted task: 1 only when nothing but the published file arrived.
REPORT = """#!/bin/bash
mkdir -p /logs/verifier
ls -la /logs/artifacts /logs/agent
cat /logs/artifacts/y /logs/artifacts/z 2>&1
if [ "$(cat /logs/artifacts/network-status.txt)" = blocked ] && [ ! -e /logs/artifacts/y ] && [ ! -L /logs/artifacts/y ] \\
   && [ ! -e /logs/artifacts/z ] && [ ! -e /logs/artifacts/fifo ] && [ -d /logs/agent ] && [ ! -L /logs/agent ] \\
   && [ -z "$(ls -A /logs/agent)" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def task_of(root: Path):
    return HarborBenchmark(path=str(root), splits={"test": 1.0}).tasks("test")[0]


def run(harness, task, sandbox=BWRAP, scratch_dir: str | None = None):
    executor = CheckExecutor(sandbox=sandbox, scratch_dir=scratch_dir)
    return asyncio.run(executor.aexecute(harness, task, 0, 0))


def planted_task(tmp_path: Path) -> tuple[object, Path]:
    canary = tmp_path / "host-canary.txt"
    canary.write_text("HOST-SECRET-CANARY\n")
    root = tmp_path / "suite" / "planted"
    shutil.copytree(FIXTURE, root)
    (root / "solution" / "solve.sh").write_text(PLANT.format(canary=canary))
    (root / "tests" / "test.sh").write_text(REPORT)
    return task_of(root), canary


def test_a_solution_that_publishes_to_logs_artifacts_scores_one():
    res = run(ORACLE, task_of(FIXTURE))
    assert res.score == 1.0 and res.error is None, res.trace["verifier"]["output"][-2000:]
    output = res.trace["verifier"]["output"]
    assert "PASS the published status is blocked" in output and "PASS /logs/artifacts is read-only" in output
    carried = res.trace["verifier"]["details"]["carried"]
    assert carried["dirs"] == ["/logs/agent", "/logs/artifacts"] and carried["files"] == 2
    assert carried["dropped"] == []


def test_the_verifiers_own_probe_of_a_blocked_url_is_not_blamed_on_the_network():
    res = run(DO_NOTHING, task_of(FIXTURE))
    output = res.trace["verifier"]["output"]
    # The probe failed as the task expects, loudly, and the answer is missing: a 0 for the
    # answer, not an environment that "needs the network".
    assert "curl: (6) Could not resolve host" in output and "Temporary failure in name resolution" in output
    assert "missing /logs/artifacts/network-status.txt" in output
    assert res.score == 0.0 and res.error is None and res.error_kind is None


def test_an_agent_phase_link_to_a_host_file_brings_nothing_into_the_verifier(tmp_path):
    task, canary = planted_task(tmp_path)
    res = run(ORACLE, task)
    output = res.trace["verifier"]["output"]
    assert "HOST-SECRET-CANARY" not in output and "root:" not in output
    assert res.score == 1.0, output[-2000:]
    dropped = res.trace["verifier"]["details"]["carried"]["dropped"]
    for entry in ("/logs/artifacts/y: a symlink", "/logs/artifacts/z: a symlink", "/logs/artifacts/fifo: a fifo"):
        assert entry in dropped, dropped
    assert any(d.startswith("/logs/agent:") and "symlink" in d for d in dropped), dropped
    assert canary.read_text() == "HOST-SECRET-CANARY\n"  # the host file itself is untouched


def test_the_agent_finds_the_carried_dirs_made_but_never_on_the_host_by_a_local_sandbox():
    from types import SimpleNamespace

    from milo_ray.benchmarks.harbor import HARBOR
    from milo_ray.execution.agent_executor import _make_carried_dirs

    ran: list[str] = []
    _make_carried_dirs(HARBOR, SimpleNamespace(execute=ran.append))  # the local sandbox: the host's paths
    assert ran == []
    _make_carried_dirs(HARBOR, SimpleNamespace(execute=ran.append, workspace_dir="/scratch/ws"))  # bwrap
    assert ran == ["mkdir -p /logs/agent /logs/artifacts"]


PLANTING_HARNESS = """
import os
from langchain.agents import create_agent

def build_agent(model, backend):
    with open("/logs/artifacts/network-status.txt", "w") as f:
        f.write("blocked\\n")
    os.symlink("/etc/shadow", "/logs/artifacts/y")
    os.symlink({canary!r}, "/logs/artifacts/z")
    os.mkfifo("/logs/artifacts/fifo")
    return create_agent(model, tools=[])
"""


@pytest.mark.slow  # a cold harness process
def test_a_harness_that_plants_links_in_logs_artifacts_gets_no_host_file_into_the_verifier(tmp_path, monkeypatch):
    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.harness.model import Harness
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

    task, canary = planted_task(tmp_path)
    harness = Harness.from_source(PLANTING_HARNESS.format(canary=str(canary)), name="planting")
    monkeypatch.setenv("MILO_PHASE_TEST_KEY", "local-test-key")
    with ScriptedOpenAIServer(lambda body: reply("done", prompt_tokens=5, completion_tokens=1)) as srv:
        model = {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": "MILO_PHASE_TEST_KEY",
                 "request_timeout_s": 30, "max_retries": 0}
        res = asyncio.run(AgentExecutor(model=model, sandbox=BWRAP).aexecute(harness, task, 0, 0))
    assert res.error_kind is None, res.error
    output = res.trace["verifier"]["output"]
    assert "HOST-SECRET-CANARY" not in output and res.score == 1.0, output[-2000:]
    dropped = res.trace["verifier"]["details"]["carried"]["dropped"]
    assert "/logs/artifacts/y: a symlink" in dropped and "/logs/artifacts/z: a symlink" in dropped, dropped


@pytest.mark.slow
def test_under_docker_the_artifact_reaches_the_verifier_and_a_planted_link_does_not(tmp_path, docker_base_image):
    from milo_ray.testing.dockerd import local_host_mounts

    docker = {"_target_": "milo_ray.boundary.sandbox.docker.DockerSandboxFactory",
              "base_image_override": docker_base_image, "host_mounts": list(local_host_mounts())}
    res = run(ORACLE, task_of(FIXTURE), docker)
    assert res.score == 1.0 and res.error is None, res.trace["verifier"]["output"][-2000:]
    assert res.trace["verifier"]["details"]["carried"]["files"] == 2
    nothing = run(DO_NOTHING, task_of(FIXTURE), docker)
    assert nothing.score == 0.0 and nothing.error is None

    task, _ = planted_task(tmp_path)
    res = run(ORACLE, task, docker)
    assert "HOST-SECRET-CANARY" not in res.trace["verifier"]["output"]
    assert res.score == 1.0, res.trace["verifier"]["output"][-2000:]
    dropped = res.trace["verifier"]["details"]["carried"]["dropped"]
    assert "/logs/artifacts/y: a symlink" in dropped and "/logs/artifacts/z: a symlink" in dropped, dropped
