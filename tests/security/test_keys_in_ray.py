"""The provider key crosses from the driver to the rollout worker as an actor-call
argument, never through runtime_env: after a real rollout through the scheduler, no file
under Ray's session directory (its logs, runtime_env_agent.log included) holds it."""

from __future__ import annotations

import json
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
                    "sandbox": {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}}
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
                "sandbox": {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}}
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


# --- a bedrock/ model's AWS credentials -----------------------------------------------------
# A stand-in for the Bedrock runtime (litellm's Converse route): it answers every call and
# keeps each request's path and headers (the SigV4 Authorization header names the access
# key id that signed it: "AWS4-HMAC-SHA256 Credential=<key id>/<date>/<region>/bedrock/...").
_FAKE_BEDROCK = r'''
import json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeBedrock:
    def __init__(self):
        self.requests = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                             "body": body.decode(errors="replace")})
                out = json.dumps({"output": {"message": {"role": "assistant", "content": [{"text": "done"}]}},
                                  "stopReason": "end_turn",
                                  "usage": {"inputTokens": 7, "outputTokens": 2, "totalTokens": 9}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
'''
BEDROCK_MODEL = "bedrock/anthropic.claude-3-haiku-20240307-v1:0"


def _aws_canaries() -> dict[str, str]:
    tag = uuid.uuid4().hex.upper()
    return {"AWS_ACCESS_KEY_ID": "AKIA" + tag[:16], "AWS_SECRET_ACCESS_KEY": "aws-secret-canary-" + tag,
            "AWS_SESSION_TOKEN": "aws-token-canary-" + tag, "AWS_REGION": "eu-west-3"}


def test_the_driver_hands_over_only_the_aws_credential_variables_it_has(monkeypatch):
    """For a bedrock/ model the rollout workers are given the AWS credentials the driver
    has (no more: not AWS_PROFILE, not a variable it lacks), and what the gateway is then
    set with becomes litellm's per-call AWS arguments; a non-bedrock model gets none."""
    from milo_ray.llm.client import gateway_credentials
    from milo_ray.config.schemas import model_config
    from milo_ray.config.targets import worker_env
    from milo_ray.boundary.gateway.upstream import request_kwargs

    aws = _aws_canaries()
    for name in ("AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(name, aws[name])
    monkeypatch.setenv("AWS_PROFILE", "team")
    model = model_config({"solver": BEDROCK_MODEL})
    env = worker_env(model)
    assert env == {n: aws[n] for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    kwargs = request_kwargs(model, gateway_credentials(model, None, env), {"messages": [{"role": "user",
                                                                                          "content": "x"}]})
    assert {k: kwargs.get(k) for k in ("aws_access_key_id", "aws_secret_access_key", "aws_region_name")} == {
        "aws_access_key_id": aws["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": aws["AWS_SECRET_ACCESS_KEY"],
        "aws_region_name": "eu-west-3"}
    assert "aws_session_token" not in kwargs and "api_key" not in kwargs
    assert worker_env(model_config({"solver": "openai/x", "api_key_env": "AWS_SECRET_ACCESS_KEY"})) == {
        "AWS_SECRET_ACCESS_KEY": aws["AWS_SECRET_ACCESS_KEY"]}


def test_a_bedrock_models_aws_secrets_are_redacted_and_its_region_is_not(monkeypatch):
    """The run registers the AWS credential values it hands over with the redaction
    registry (no stored text holds them); the region is a setting, not a secret."""
    from types import SimpleNamespace

    from milo_ray import redaction
    from milo_ray.config.schemas import model_config
    from milo_ray.run import _register_secrets

    aws = _aws_canaries()
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    before = dict(redaction._secrets)
    try:
        _register_secrets(SimpleNamespace(model=model_config({"solver": BEDROCK_MODEL}), agents={}))
        text = redaction.redact(" ".join(aws.values()))
    finally:
        redaction.clear()
        redaction.register(before)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        assert aws[name] not in text and redaction.marker(name) in text
    assert "eu-west-3" in text


@pytest.mark.slow  # imports litellm (seconds) and makes a real litellm Bedrock call to a local server
def test_the_gateways_bedrock_call_is_signed_with_the_handed_over_access_key(monkeypatch):
    """litellm's own Bedrock request path, pointed at a local stand-in: the call the gateway
    forwards is SigV4-signed with the access key id and session token it was handed,
    while this process's environment holds no AWS credential."""
    import asyncio

    from milo_ray.llm.client import gateway_credentials
    from milo_ray.config.schemas import model_config
    from milo_ray.boundary.gateway import upstream

    scope: dict = {}
    exec(_FAKE_BEDROCK, scope)
    aws = _aws_canaries()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with scope["FakeBedrock"]() as fake:
        model = model_config({"solver": BEDROCK_MODEL, "api_base": fake.url, "max_retries": 0})
        answer = asyncio.run(upstream.complete(model, gateway_credentials(model, None, aws),
                                               {"messages": [{"role": "user", "content": "hi"}]}, None))
    assert answer.input_tokens == 7 and answer.output_tokens == 2
    [req] = fake.requests
    assert f"Credential={aws['AWS_ACCESS_KEY_ID']}/" in req["headers"]["authorization"]
    assert "/eu-west-3/bedrock/" in req["headers"]["authorization"]
    assert req["headers"]["x-amz-security-token"] == aws["AWS_SESSION_TOKEN"]
    assert aws["AWS_SECRET_ACCESS_KEY"] not in json.dumps(req)  # signs with it, never sends it


# A local run's driver with a bedrock/ model whose AWS credentials are in its environment:
# the workers' credentials are collected as the run collects them (config.targets.worker_env),
# one sandboxed rollout calls the model through the gateway, which calls the stand-in
# Bedrock runtime through litellm; then every Ray process's environment is read while up.
_BEDROCK_DRIVER = _FAKE_BEDROCK + r'''
import os, sys
from pathlib import Path

sys.path.insert(0, sys.argv[2])
from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.config.schemas import model_config
from milo_ray.config.targets import worker_env
from milo_ray.core.rollouts import RolloutRequest
from milo_ray.execution.cluster import start_local
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.harness.model import Harness
from milo_ray.store import MemoryRunStore
from hostile import make_secret_task

canaries = [os.environ[n] for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
CALL = Harness.from_source("""
from langchain.agents import create_agent
def build_agent(model, backend):
    return create_agent(model, tools=[])
""", name="call-once")
tmp = Path(sys.argv[1])
start_local(num_cpus=2, slots=2, configure_logging=False)
make_secret_task(tmp / "tasks")
tasks = {t.task_id: t for t in HarborBenchmark(path=str(tmp / "tasks"), splits={"test": 1.0}).tasks("test")}
with FakeBedrock() as fake:
    model = {"solver": sys.argv[3], "api_base": fake.url, "max_retries": 0}
    executor = {"_target_": "milo_ray.execution.agent_executor.AgentExecutor", "model": model,
                "sandbox": {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}}
    sched = RolloutScheduler(executor, tasks, MemoryRunStore(run_id="aws"), sys.argv[3], "aws", progress=False,
                             worker_env=worker_env(model_config(model)))
    sched.add_harness(CALL)
    [res] = sched.run([RolloutRequest(CALL.harness_id, "secret", 0, seed=1)])
    mark = ("MILO_RUN_MARK=" + os.environ["MILO_RUN_MARK"]).encode()
    procs = []
    for path in Path("/proc").glob("[0-9]*/environ"):
        try:
            env = path.read_bytes()
            cmd = (path.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(path.parent.name) != os.getpid() and ("ray" in cmd or mark in env):
            procs.append({"cmd": cmd[:300], "held": [c[:8] for c in canaries if c.encode() in env]})
    sched.close()
print("REPORT " + json.dumps({"error": res.error, "input_tokens": res.input_tokens, "procs": procs,
                              "driver_has_key": canaries[0].encode() in Path("/proc/self/environ").read_bytes(),
                              "requests": [{"path": r["path"], "headers": r["headers"]} for r in fake.requests]}))
'''


@pytest.mark.slow  # a driver of its own with its own Ray and a sandboxed rollout: ~30 s
def test_a_bedrock_run_signs_with_the_drivers_aws_keys_and_no_ray_process_holds_them(tmp_path):
    import subprocess
    import sys

    aws = _aws_canaries()
    env = {**os.environ, **aws, "MILO_RUN_MARK": uuid.uuid4().hex,
           "RAY_TMPDIR": os.environ.get("RAY_TMPDIR", "/tmp/rt-keys")}
    for name in ("RAY_ADDRESS", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        env.pop(name, None)
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", _BEDROCK_DRIVER, str(tmp_path), here, BEDROCK_MODEL], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["driver_has_key"]
    cmds = " | ".join(p["cmd"] for p in report["procs"])
    for part in ("gcs_server", "raylet", "ray::_RolloutWorkerShell"):
        assert part in cmds, f"no {part} process among Ray's: {cmds[:2000]}"
    assert [p for p in report["procs"] if p["held"]] == []
    # ... and the call reached Bedrock signed with the driver's credentials, via the gateway.
    assert report["error"] is None and report["input_tokens"] == 7
    [req] = report["requests"]
    assert req["path"].endswith("/converse")
    assert f"Credential={aws['AWS_ACCESS_KEY_ID']}/" in req["headers"]["authorization"]
    assert req["headers"]["x-amz-security-token"] == aws["AWS_SESSION_TOKEN"]


@pytest.mark.slow  # builds a litellm chat model: imports litellm (seconds)
def test_a_search_agents_inprocess_bedrock_model_carries_the_handed_over_aws_credentials(monkeypatch):
    """A role's chat model built where the driver's secrets were handed over (use_secrets,
    not the environment) passes the AWS credentials to litellm on each call."""
    from milo_ray.llm.client import build_chat_model, use_secrets

    aws = _aws_canaries()
    for name in aws:
        monkeypatch.delenv(name, raising=False)
    with use_secrets(aws):
        chat = build_chat_model({"solver": BEDROCK_MODEL}, rate_limiter=None)
    assert {k: chat.model_kwargs.get(k) for k in ("aws_access_key_id", "aws_session_token", "aws_region_name")} == {
        "aws_access_key_id": aws["AWS_ACCESS_KEY_ID"], "aws_session_token": aws["AWS_SESSION_TOKEN"],
        "aws_region_name": "eu-west-3"}
