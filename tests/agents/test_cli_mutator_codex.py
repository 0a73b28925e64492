"""The Codex mutator runs inside bwrap by default, pointed at the mutation's model gateway:
its command line defines a Responses-API provider whose base URL is the sandbox's relay and
whose key variable holds a per-call token (never the provider key); the gateway serves its
``/v1/responses`` calls, streamed and not, meters them into the mutation's usage (whatever
Codex prints) and refuses the token once the call ends. On the host (``trusted_host``) Codex
keeps its own sandbox and gets no gateway arguments.

A Codex-like script checks the command line and the boundary everywhere bwrap is; the real
Codex CLI (``npm install -g @openai/codex``), when it is on PATH, runs the same mutation
against a scripted model."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from milo_ray.llm.client import use_secrets
from milo_ray.agents.mutators.cli import CliMutator
from milo_ray.boundary.gateway.mutation import MutationGateway
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply, tool_call

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli_mutator import CHANGED, request  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
CANARY_KEY = "sk-openai-canary-codex-9a8b7c6d5e4f"
PRICES = {"usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0}

# A Codex-like CLI: reads its provider from the `-c` arguments as Codex does, makes one plain
# and one streamed Responses call with the token from the provider's key variable, looks for
# the key wherever it could read, writes the child, and prints Codex's events with a usage
# that lies.
FAKE_CODEX = f"""#!{sys.executable}
import json, os, re, sys, urllib.request
args = sys.argv[1:]
conf = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-c")
provider = json.loads(conf["model_provider"])
def setting(name):
    return json.loads(conf[f"model_providers.{{provider}}.{{name}}"])
base, token = setting("base_url"), os.environ[setting("env_key")]
prompt = next(a for a in args if "Write the complete child harness" in a)
out = re.search(r"Write the complete child harness to `([^`]+)`", prompt).group(1)
parent = re.search(r"The parent harness: `([^`]+)`", prompt).group(1)
def ask(text, stream):
    body = {{"model": "gpt-codex-whatever", "stream": stream, "store": False,
            "input": [{{"type": "message", "role": "user", "content": [{{"type": "input_text", "text": text}}]}}]}}
    req = urllib.request.Request(base + "/responses", method="POST", data=json.dumps(body).encode(),
                                 headers={{"Authorization": "Bearer " + token, "Content-Type": "application/json"}})
    return urllib.request.urlopen(req, timeout=60).read().decode()
first = json.loads(ask("plain", False))
streamed = [json.loads(l[5:]) for l in ask("stream", True).splitlines() if l.startswith("data:")]
found = [k for k, v in os.environ.items() if {CANARY_KEY!r} in v]
for pid in os.listdir("/proc"):
    try:
        if {CANARY_KEY!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read():
            found.append(pid)
    except OSError:
        pass
open(out, "w").write(open(parent).read() + {CHANGED!r})
seen = {{"plain": first["output"][0]["content"][0]["text"], "found": found, "args": [a for a in args if a != prompt],
        "streamed": "".join(e.get("delta", "") for e in streamed if e["type"] == "response.output_text.delta"),
        "last": streamed[-1]["type"], "wire_api": setting("wire_api"), "websockets": conf.get(
            f"model_providers.{{provider}}.supports_websockets")}}
print(json.dumps({{"type": "thread.started", "thread_id": "t"}}))
print(json.dumps({{"type": "item.completed", "item": {{"id": "i", "type": "agent_message", "text": json.dumps(seen)}}}}))
print(json.dumps({{"type": "turn.completed", "usage": {{"input_tokens": 999999, "output_tokens": 999999}}}}))
"""


@pytest.fixture
def upstream(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.delenv("UPSTREAM_KEY", raising=False)
    # The canary is also the host's own OpenAI key: a sandboxed Codex must not see it.
    monkeypatch.setenv("OPENAI_API_KEY", CANARY_KEY)

    def gateway(srv: ScriptedOpenAIServer) -> MutationGateway:
        return MutationGateway({"model": "openai/scripted", "api_base": srv.url, "api_key_env": "UPSTREAM_KEY",
                                "max_retries": 0, **PRICES})

    return gateway


def _tracking(gw: MutationGateway) -> list[str]:
    issued: list[str] = []
    issue = gw.issue_token
    gw.issue_token = lambda **kw: issued.append(issue(**kw)) or issued[-1]  # type: ignore[method-assign]
    return issued


def _billed(srv: ScriptedOpenAIServer) -> tuple[int, int]:
    return sum(r.prompt_tokens for r in srv.answered), sum(r.completion_tokens for r in srv.answered)


def test_codex_runs_sandboxed_against_the_gateway_keyless_and_is_charged_what_the_gateway_metered(
        tmp_path, monkeypatch, upstream):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").write_text(FAKE_CODEX)
    (bin_dir / "codex").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def answer(body: dict):
        if "stream" in json.dumps(body["messages"]):
            return reply("streamed hello", prompt_tokens=13, completion_tokens=4)
        return reply("plain hello", prompt_tokens=19, completion_tokens=6)

    with ScriptedOpenAIServer(answer) as srv:
        gw = upstream(srv)
        try:
            issued = _tracking(gw)
            req = request(tmp_path)
            with use_secrets({"UPSTREAM_KEY": CANARY_KEY}):
                out = CliMutator(preset="codex", gateway=gw).mutate(req)
            assert out.child is not None, out.error
            assert out.child.source == req.parent.source + CHANGED
            seen = json.loads(out.report)
            assert (seen["plain"], seen["streamed"], seen["last"]) == ("plain hello", "streamed hello",
                                                                       "response.completed")
            # Codex's own provider, on the Responses API over plain HTTP, its sandbox left to bwrap.
            assert seen["wire_api"] == "responses" and seen["websockets"] == "false"
            assert "--dangerously-bypass-approvals-and-sandbox" in seen["args"] and "--sandbox" not in seen["args"]
            # The key reached no process of the sandbox.
            assert seen["found"] == []
            assert CANARY_KEY not in (req.workdir.parent / "round-1.cli-stdout.txt").read_text()
            # Charged what the upstream billed, not the 999999 Codex printed.
            assert _billed(srv) == (32, 10)
            assert (out.usage.input_tokens, out.usage.output_tokens) == (32, 10)
            assert out.usage.cost_usd == pytest.approx((32 * 1.0 + 10 * 2.0) / 1e6)
            (token,) = issued
            assert gw.metered(token)["calls"] == 2 and gw._gateway.grants.find(token).ended
        finally:
            gw.close()


def test_on_the_host_codex_keeps_its_own_sandbox_and_gets_no_gateway_arguments():
    host = CliMutator(preset="codex", trusted_host=True, pass_env=["OPENAI_API_KEY"])
    assert host.argv[host.argv.index("--sandbox") + 1] == "workspace-write"
    assert not any(a.startswith("model_provider") for a in host.argv) and host.gateway_vars is None
    sandboxed = CliMutator(preset="codex")
    assert "--sandbox" not in sandboxed.argv and sandboxed.gateway_vars["api"] == "openai"
    with pytest.raises(ValueError, match="trusted_host"):
        CliMutator(preset="codex", pass_env=["OPENAI_API_KEY"])


REAL_CODEX = shutil.which("codex")


@pytest.mark.skipif(REAL_CODEX is None, reason="the Codex CLI is not installed (npm install -g @openai/codex)")
def test_the_real_codex_cli_writes_a_child_in_the_sandbox_through_the_gateway(tmp_path, upstream):
    """Codex itself: it streams its Responses calls through the relay, runs the model's
    command inside bwrap, and the mutation is charged what the gateway metered."""
    appended = base64.b64encode(CHANGED.encode()).decode()

    def answer(body: dict):
        said = json.dumps(body["messages"])
        if '"role": "tool"' in said:
            return reply("child written", prompt_tokens=43, completion_tokens=3)
        out = re.search(r"Write the complete child harness to `([^`]+)`", said).group(1)
        parent = re.search(r"The parent harness: `([^`]+)`", said).group(1)
        cmd = f"cp {parent} {out} && echo {appended} | base64 -d >> {out} && env"
        return tool_call("exec_command", {"cmd": cmd}, prompt_tokens=31, completion_tokens=6)

    with ScriptedOpenAIServer(answer) as srv:
        gw = upstream(srv)
        try:
            req = request(tmp_path)
            with use_secrets({"UPSTREAM_KEY": CANARY_KEY}):
                out = CliMutator(preset="codex", gateway=gw, time_cap_s=300).mutate(req)
            transcript = (req.workdir.parent / "round-1.cli-stdout.txt").read_text()
            assert out.child is not None, f"{out.error}\n{transcript[-3000:]}"
            assert out.child.source == req.parent.source + CHANGED
            assert out.report == "child written"
            assert _billed(srv) == (31 + 43, 6 + 3)
            assert (out.usage.input_tokens, out.usage.output_tokens) == _billed(srv)
            # The command's `env` output is in the transcript: the token is there, the key is not.
            assert "OPENAI_API_KEY=" in transcript and CANARY_KEY not in transcript
        finally:
            gw.close()
