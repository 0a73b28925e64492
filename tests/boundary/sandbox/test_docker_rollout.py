"""One bundled Harbor task end to end under ``sandbox=docker``: the task's image is built
from its own Dockerfile (on the pull-free local base image), the rollout runs in a
container -- the oracle's solution, or a real harness whose process runs inside the
container and reaches the scripted model only through the gateway -- and the task's
verifier grades the workspace in a fresh container."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.core.tasks import format_of
from milo_ray.execution.agent_executor import AgentExecutor
from milo_ray.boundary.sandbox.docker import DockerSandbox
from milo_ray.harness.seeds import load_seeds
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply, tool_call

# Containers and cold harness processes: the slow suite (pytest -m slow; .ci/run runs it).
pytestmark = pytest.mark.slow

TASK = "csv-to-json"
KEY_ENV = "MILO_TEST_SOLVER_KEY"
KEY = "sk-docker-canary-key"
HOST_CANARY = "MILO_DOCKER_HOST_CANARY"
SOLVE = (Path(__file__).parents[3] / "milo_ray" / "data" / "harbor_tasks" / TASK / "solution" / "solve.sh").read_text()
BASH_TOKENS, DONE_TOKENS = (300, 40), (500, 8)

# Runs in the harness process when harness.py is imported (appended to it): what it can see of the host,
# printed to its stderr (the rollout's ``harness_stderr``).
PROBE = '''
import json as _j, os as _o, sys as _s
def _shadow():
    try:
        open("/etc/shadow").read(1)
        return "readable"
    except OSError as e:
        return type(e).__name__
print("PROBE " + _j.dumps({"uid": _o.getuid(), "shadow": _shadow(), "env": dict(_o.environ),
                           "exe": _s.executable}), file=_s.stderr)
'''


def _bundled_task():
    return HarborBenchmark(splits={"test": 1.0}).task(TASK)


def _policy(body):
    """Runs the task's reference solution through the harness's bash tool, then stops."""
    if not any(m.get("role") == "tool" for m in body["messages"]):
        return tool_call("bash", {"command": SOLVE}, prompt_tokens=BASH_TOKENS[0], completion_tokens=BASH_TOKENS[1])
    return reply("Both files are written.", prompt_tokens=DONE_TOKENS[0], completion_tokens=DONE_TOKENS[1])


def _probe(result) -> dict:
    lines = [ln for ln in result.trace["trajectory"].get("harness_stderr", "").splitlines() if ln.startswith("PROBE ")]
    assert lines, result.trace["trajectory"].get("harness_stderr")
    return json.loads(lines[-1][len("PROBE "):])


def _model(url: str) -> dict:
    return {"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 30}


def test_oracle_solves_the_bundled_task_in_a_container_built_from_its_dockerfile(make_docker_factory):
    task = _bundled_task()
    factory = make_docker_factory(command_timeout_s=60)
    assert factory.unsupported(format_of(task).sandbox_spec(task)) is None
    harness = load_seeds(["minimal"])[0]
    solved = asyncio.run(AgentExecutor(sandbox=factory, agent="oracle").aexecute(harness, task, 0, 0))
    assert solved.error_kind is None, solved.error
    assert solved.score == 1.0
    assert solved.trace["ctrf"]["results"]["summary"]["failed"] == 0


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_real_harness_runs_inside_the_container_as_under_bwrap(make_docker_factory, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(HOST_CANARY, "host-only-value")
    task = _bundled_task()
    minimal = load_seeds(["minimal"])[0]
    harness = minimal.with_source(minimal.files["harness.py"] + PROBE)
    results = {}
    for name, sandbox in (("bwrap", {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}),
                          ("docker", make_docker_factory(command_timeout_s=60))):
        with ScriptedOpenAIServer(_policy) as srv:
            executor = AgentExecutor(model=_model(srv.url), sandbox=sandbox)
            assert executor.unsupported_tasks([task]) == []
            results[name] = asyncio.run(executor.aexecute(harness, task, 0, 0))
            assert len(srv.requests) == 2, (name, results[name].error)
    res = results["docker"]
    assert res.error_kind is None, (res.error, res.trace["trajectory"].get("harness_stderr"))
    assert res.score == results["bwrap"].score == 1.0
    # Metered by the gateway: exactly what the scripted server billed.
    assert (res.input_tokens, res.output_tokens) == (BASH_TOKENS[0] + DONE_TOKENS[0], BASH_TOKENS[1] + DONE_TOKENS[1])
    assert len(res.trace["trajectory"]["calls"]) == 2
    seen = _probe(res)
    assert seen["uid"] != 0
    assert seen["shadow"] == "PermissionError"  # the host's /etc is mounted; its root-only files stay closed
    assert HOST_CANARY not in seen["env"] and KEY not in json.dumps(seen["env"])
    assert seen["env"].get("HOME") == "/tmp"  # the container's environment, not the worker's
    assert KEY not in json.dumps(res.trace)


# Its import starts a detached process (its own session, as a double fork would) that
# outlives nothing; its agent never finishes, so the task's time cap ends the rollout.
_LINGERING = '''
import subprocess

def build_agent(model, backend):
    subprocess.Popen(["sleep", "4242"], start_new_session=True)

    class Hang:
        async def astream(self, *args, **kwargs):
            import asyncio
            await asyncio.sleep(3600)
            yield {}

    return Hang()
'''


def test_the_time_cap_kills_every_process_of_the_harness_in_the_container(make_docker_factory, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    task = dataclasses.replace(_bundled_task(), time_cap_s=2.0)
    harness = load_seeds(["minimal"])[0].with_source(_LINGERING)
    left: list[str] = []
    fresh = DockerSandbox.fresh_for_grading

    def look_then_grade(self, **carried):
        # After the harness process's end, before the container is replaced: what runs.
        listing = self.execute("for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline; echo; done")
        left.extend(line for line in listing.output.splitlines() if "4242" in line or "harness_process" in line)
        return fresh(self, **carried)

    monkeypatch.setattr(DockerSandbox, "fresh_for_grading", look_then_grade)
    with ScriptedOpenAIServer([reply("unused")]) as srv:
        executor = AgentExecutor(model=_model(srv.url), sandbox=make_docker_factory(command_timeout_s=60))
        res = asyncio.run(executor.aexecute(harness, task, 0, 0))
    assert res.timed_out and res.trace["trajectory"]["final"]["status"] == "timeout", res.error
    assert res.score < 1.0  # graded as the workspace stands: nothing was converted
    assert left == [], left


def test_an_image_that_cannot_run_the_interpreter_is_refused_naming_bwrap(docker_factory, docker_task, monkeypatch,
                                                                         tmp_path):
    # The probe at open runs this worker's interpreter inside; one the image cannot run
    # (here: absent, as a too-new glibc build fails to load) is refused before any job.
    import sys

    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python3")
    code = tmp_path / "code"
    code.mkdir()
    with pytest.raises(RuntimeError, match="cannot run the harness process.*sandbox=bwrap"):
        docker_factory.open(docker_task, tmp_path / "scratch", readonly_binds={str(code): "/run/milo/lib"})
    # Nothing of the refused container is left.
    import subprocess

    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=milo-ray.task={docker_task.task_id}"],
                          capture_output=True, text=True).stdout.split()
    assert left == []


# Appended to a harness: at import, writes 20 MiB into each writable place of its container
# and prints what it managed (bytes, errno) to its stderr.
_FILL = '''
import json as _fj, os as _fo, sys as _fs

def _fill(path):
    written = 0
    try:
        with open(path, "wb") as f:
            for _ in range(20):
                f.write(b"x" * (1 << 20))
                f.flush()
                written += 1 << 20
    except OSError as e:
        return [written, e.errno]
    return [written, None]

print("FILLED " + _fj.dumps({d: _fill(_fo.path.join(d, "fill")) for d in (_fo.getcwd(), "/tmp", "/logs", "/tests",
                                                                          "/solution")}), file=_fs.stderr)
'''


def test_a_harness_filling_its_containers_disk_is_stopped_at_the_cap_and_its_rollout_scored(make_docker_factory,
                                                                                           monkeypatch, tmp_path):
    import errno
    import os

    monkeypatch.setenv(KEY_ENV, KEY)
    cap_mb = 16
    task = _bundled_task()
    task = dataclasses.replace(task, metadata={**task.metadata, "storage_mb": cap_mb})
    minimal = load_seeds(["minimal"])[0]
    harness = minimal.with_source(minimal.files["harness.py"] + _FILL)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with ScriptedOpenAIServer([reply("done", prompt_tokens=3, completion_tokens=1)]) as srv:
        executor = AgentExecutor(model=_model(srv.url), sandbox=make_docker_factory(command_timeout_s=60),
                                 scratch_dir=str(scratch), keep_scratch=True)
        res = asyncio.run(executor.aexecute(harness, task, 0, 0))
    # A score (the workspace graded as it stands: the task is not solved), not a crash.
    assert res.error_kind is None and res.score < 1.0, (res.error, res.trace["trajectory"].get("harness_stderr"))
    lines = [ln for ln in res.trace["trajectory"].get("harness_stderr", "").splitlines() if ln.startswith("FILLED ")]
    assert lines, res.trace["trajectory"].get("harness_stderr")
    filled = json.loads(lines[-1][len("FILLED "):])
    assert set(filled) == {"/app", "/tmp", "/logs", "/tests", "/solution"}
    assert all(err == errno.ENOSPC for _, err in filled.values()), filled
    assert sum(n for n, _ in filled.values()) <= cap_mb << 20, filled
    images = list(scratch.rglob("volume.img"))
    assert images and all(os.stat(p).st_blocks * 512 <= cap_mb << 20 for p in images)
