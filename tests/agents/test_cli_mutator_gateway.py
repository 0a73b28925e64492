"""The CLI mutators' real gateway (milo_ray.boundary.gateway.mutation): started in the
process that runs the CLI with the key that process was handed, it serves the sandboxed
CLI's Anthropic Messages calls over the relay with a per-call token, meters them into the
mutation's usage, refuses the token once revoked, and never lets the key inside."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from milo_ray.llm.client import use_secrets
from milo_ray.agents.mutators.cli import CliMutator
from milo_ray.boundary.gateway.mutation import MutationGateway
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli_mutator import CHANGED, request  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
CANARY_KEY = "sk-upstream-canary-7f6e5d4c3b2a1908"

# A Claude-Code-like CLI: two Messages calls (one streamed) through ANTHROPIC_BASE_URL, a
# look for the key anywhere it could read, the child written, and a usage report that lies.
FAKE = f"""#!{sys.executable}
import json, os, re, sys, urllib.request
prompt = next(a for a in sys.argv[1:] if "Write the complete child harness" in a)
out = re.search(r"Write the complete child harness to `([^`]+)`", prompt).group(1)
parent = re.search(r"The parent harness: `([^`]+)`", prompt).group(1)
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_AUTH_TOKEN"]
def ask(stream):
    body = {{"model": "claude-whatever", "max_tokens": 100, "stream": stream,
            "messages": [{{"role": "user", "content": "hi"}}]}}
    req = urllib.request.Request(base + "/v1/messages", method="POST", data=json.dumps(body).encode(),
                                 headers={{"x-api-key": "", "Authorization": "Bearer " + token,
                                           "Content-Type": "application/json", "anthropic-version": "2023-06-01"}})
    return urllib.request.urlopen(req, timeout=60).read().decode()
first = json.loads(ask(False))
streamed = ask(True)
found = []
for pid in os.listdir("/proc"):
    try:
        if {CANARY_KEY!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read():
            found.append(pid)
    except OSError:
        pass
found += [k for k, v in os.environ.items() if {CANARY_KEY!r} in v]
open(out, "w").write(open(parent).read() + {CHANGED!r})
events = [json.loads(l[5:]) for l in streamed.splitlines() if l.startswith("data:")]
deltas = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
seen = {{"text": first["content"][0]["text"], "streamed": [e["type"] for e in events], "streamed_text": deltas,
        "found": found}}
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False, "result": json.dumps(seen),
                  "total_cost_usd": 0.0, "usage": {{"input_tokens": 999999, "output_tokens": 999999}}}}))
"""


@pytest.fixture
def setting(tmp_path, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.delenv("UPSTREAM_KEY", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "claude"
    cli.write_text(FAKE)
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    script = [reply("model says hello", prompt_tokens=11, completion_tokens=3),
              reply("streamed hello", prompt_tokens=7, completion_tokens=4)]
    with ScriptedOpenAIServer(script) as srv:
        gw = MutationGateway({"model": "openai/scripted", "api_base": srv.url, "api_key_env": "UPSTREAM_KEY",
                              "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, "max_retries": 0})
        yield gw, srv, tmp_path
        gw.close()


def _post(gw: MutationGateway, path: str, token: str) -> int:
    """POST to the gateway's own socket, as a client that kept a token would."""
    sock_path = unquote(urlsplit(gw.base_url("anthropic")).netloc)
    conn = http.client.HTTPConnection("gateway")
    conn.sock = socket.socket(socket.AF_UNIX)
    conn.sock.connect(sock_path)
    body = json.dumps({"max_tokens": 5, "messages": [{"role": "user", "content": "again"}]})
    conn.request("POST", path, body=body, headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read().decode()
    conn.close()
    return resp.status, payload


def test_claude_code_calls_messages_through_the_mutation_gateway_metered_and_keyless(setting):
    gw, srv, tmp = setting
    agent = CliMutator(preset="claude", gateway=gw)
    issued: list[str] = []
    issue = gw.issue_token
    gw.issue_token = lambda **kw: issued.append(issue(**kw)) or issued[-1]  # type: ignore[method-assign]
    req = request(tmp)
    with use_secrets({"UPSTREAM_KEY": CANARY_KEY}):
        out = agent.mutate(req)
    assert out.child is not None, out.error
    assert out.child.source == req.parent.source + CHANGED
    seen = json.loads(out.report)
    assert seen["text"] == "model says hello" and seen["streamed_text"] == "streamed hello"
    assert seen["streamed"][0] == "message_start" and seen["streamed"][-2:] == ["message_delta", "message_stop"]
    # The mutation's usage is what the upstream billed, not what the CLI printed.
    billed = [(r.prompt_tokens, r.completion_tokens) for r in srv.answered]
    assert billed == [(11, 3), (7, 4)]
    assert (out.usage.input_tokens, out.usage.output_tokens) == (18, 7)
    assert out.usage.cost_usd == pytest.approx((18 * 1.0 + 7 * 2.0) / 1e6)
    # The key never reached the sandbox: not in any process environment it could read.
    assert seen["found"] == []
    transcript = (req.workdir.parent / "round-1.cli-stdout.txt").read_text()
    assert CANARY_KEY not in transcript
    # The call's token is revoked: the gateway refuses it, and nothing more is billed.
    (token,) = issued
    status, payload = _post(gw, "/anthropic/v1/messages", token)
    assert status == 401 and "ended" in payload
    assert len(srv.answered) == 2
    # The token had a socket of its own, the relay's only target, removed with the call.
    own = gw._gateway.grants.find(token).socket_path
    assert own is not None and own != unquote(urlsplit(gw.base_url("anthropic")).netloc) and not os.path.exists(own)


def test_an_unknown_token_is_refused_on_every_route_and_costs_nothing(setting):
    gw, srv, _ = setting
    for path in ("/anthropic/v1/messages", "/openai/v1/responses", "/openai/v1/chat/completions"):
        status, _ = _post(gw, path, "not-a-token")
        assert status == 401, path
    assert not srv.answered


def test_a_started_gateway_ships_as_its_config_alone(setting):
    import pickle

    gw, _, _ = setting
    with use_secrets({"UPSTREAM_KEY": CANARY_KEY}):
        gw.issue_token(role="mutator", caller="test")  # started, holding the key
    assert gw._gateway._key == CANARY_KEY
    copy = pickle.loads(pickle.dumps(gw))
    assert copy.cfg == gw.cfg and copy._gateway is None
    assert CANARY_KEY not in pickle.dumps(gw).decode("latin-1")
