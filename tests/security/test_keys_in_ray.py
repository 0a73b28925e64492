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


def test_ray_starts_and_joins_without_any_credential_variable(monkeypatch):
    """Ray copies the driver's environment into every process it starts: while ray.init
    runs, no credential variable is there (by its name, or registered whatever its name);
    afterwards the driver has them all back."""
    import ray

    from milo_ray import redaction
    from milo_ray.execution import cluster

    seen = []
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append((dict(os.environ), kw)))
    monkeypatch.setattr(cluster, "_info", lambda **kw: None)
    keys = {"OPENAI_API_KEY": "sk-a" * 8, "AWS_SECRET_ACCESS_KEY": "aws" * 10, "AWS_SESSION_TOKEN": "t" * 20,
            "HF_TOKEN": "hf_" + "x" * 20, "MILO_ODD_NAME": "registered-" + "y" * 20}
    kept = {"TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_TOKEN_PATH": "/x", "MILO_PLAIN": "1"}
    for k, v in {**keys, **kept}.items():
        monkeypatch.setenv(k, v)
    before = dict(redaction._secrets)  # what this test process had registered: put back after
    redaction.register({"MILO_ODD_NAME": keys["MILO_ODD_NAME"]})
    try:
        cluster.start_local(num_cpus=1)
        cluster.join("ray://example:10001")
    finally:
        redaction.clear()
        redaction.register(before)
    for env, kwargs in seen:
        assert not set(keys) & set(env)
        assert all(env[k] == v for k, v in kept.items())
        assert "runtime_env" not in kwargs
    assert len(seen) == 2 and all(os.environ[k] == v for k, v in keys.items())
    with pytest.raises(ValueError, match="runtime_env"):
        cluster._init(address="auto", runtime_env={"env_vars": {"A": "b"}})


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


# A local run's driver, with a provider key in its environment: it starts its own Ray (as
# `python -m milo_ray.run` does), runs one sandboxed rollout whose harness looks for the key
# and calls the model through the gateway, then reads the environment of every process Ray
# started (its descendants: GCS, raylet, dashboard agent, runtime-env agent, workers, the
# sandboxed harness processes) while they are still up. Prints one JSON report.
_DRIVER = r'''
import json, os, sys
from pathlib import Path

sys.path.insert(0, sys.argv[2])
from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.core.rollouts import RolloutRequest
from milo_ray.execution.cluster import start_local
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.harness.model import Harness
from milo_ray.store import MemoryRunStore
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply
from hostile import make_secret_task

key = os.environ["OPENAI_API_KEY"]
LOOK = Harness.from_source("""
import glob, os
from langchain.agents import create_agent

def _seen():
    needle = %r
    hits = [k for k, v in os.environ.items() if needle in v]
    for path in glob.glob("/proc/*/environ"):
        try:
            if needle.encode() in open(path, "rb").read():
                hits.append(path)
        except OSError:
            pass
    return hits

def build_agent(model, backend):
    return create_agent(model, tools=[], system_prompt="sandbox saw the key at: %%s" %% _seen())
""" % key, name="look-and-call")


def descendants(root):
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


tmp = Path(sys.argv[1])
start_local(num_cpus=2, slots=2, configure_logging=False)
make_secret_task(tmp / "tasks")
suite = HarborBenchmark(path=str(tmp / "tasks"), splits={"test": 1.0})
tasks = {t.task_id: t for t in suite.tasks("test")}
with ScriptedOpenAIServer(lambda body: reply("done", prompt_tokens=7, completion_tokens=2)) as srv:
    executor = {"_target_": "milo_ray.execution.agent_executor.AgentExecutor",
                "model": {"solver": "openai/scripted", "api_base": srv.url, "max_retries": 0},
                "sandbox": {"_target_": "milo_ray.execution.sandbox.bwrap.BwrapSandboxFactory"}}
    sched = RolloutScheduler(executor, tasks, MemoryRunStore(run_id="keys"), "openai/scripted", "keys",
                             progress=False, worker_env={"OPENAI_API_KEY": key})
    sched.add_harness(LOOK)
    [res] = sched.run([RolloutRequest(LOOK.harness_id, "secret", 0, seed=1)])
    # Ray may reparent what it starts: a process is Ray's when it descends from the driver
    # or carries the driver's own marker variable.
    mark = ("MILO_RUN_MARK=" + os.environ["MILO_RUN_MARK"]).encode()
    pids = set(descendants(os.getpid()))
    for path in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in path.read_bytes():
                pids.add(int(path.parent.name))
        except OSError:
            pass
    pids.discard(os.getpid())
    procs = []
    for pid in sorted(pids):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        procs.append({"pid": pid, "cmd": cmd[:300], "has_key": key.encode() in env})
    sched.close()
print("REPORT " + json.dumps({
    "error": res.error, "input_tokens": res.input_tokens, "procs": procs,
    "driver_has_key": key.encode() in Path("/proc/self/environ").read_bytes(),
    "auth": srv.authorizations, "prompts": [json.dumps(r["messages"]) for r in srv.requests]}))
'''


@pytest.mark.slow  # a driver of its own with its own Ray and a sandboxed rollout: ~30 s
def test_no_ray_process_of_a_local_run_holds_the_drivers_key(tmp_path):
    import json
    import subprocess
    import sys

    key = "sk-proc-canary-" + uuid.uuid4().hex
    env = {**os.environ, "OPENAI_API_KEY": key, "AWS_SECRET_ACCESS_KEY": key + "-aws",
           "MILO_RUN_MARK": uuid.uuid4().hex,
           "RAY_TMPDIR": os.environ.get("RAY_TMPDIR", "/tmp/rt-keys")}
    env.pop("RAY_ADDRESS", None)
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(tmp_path), here], env=env, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["driver_has_key"]  # the key was in the driver's environment
    cmds = " | ".join(p["cmd"] for p in report["procs"])
    for part in ("gcs_server", "raylet", "dashboard.py", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
                 "ray::_RolloutWorkerShell"):
        assert part in cmds, f"no {part} process among Ray's: {cmds[:2000]}"
    assert [p["cmd"] for p in report["procs"] if p["has_key"]] == []
    # ... and the key still reached the provider, through the gateway only.
    assert report["error"] is None and report["input_tokens"] == 7
    assert report["auth"] == [f"Bearer {key}"]
    assert "sandbox saw the key at: []" in report["prompts"][0]
