"""A CLI mutator runs inside bwrap by default: its provider base URL points at the model
gateway (through the sandbox's only way out, a relay), it presents a per-call token the
gateway revokes afterwards, and it finds no key, no host home and no other network. Only an
explicit ``trusted_host: true`` runs it on the host, with a warning on every call."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from milo_ray.agents.mutators.cli import CliMutator
from milo_ray.testing.fake_gateway import FakeGateway
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli_mutator import CHANGED, request  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
CANARY_KEY = "sk-ant-canary-cli-0123456789abcdef"
CANARY_FILE = "cli-home-canary-5e4d3c2b1a"

# A Claude-Code-like CLI: asks its model once through ANTHROPIC_BASE_URL with the token it
# was given, writes the child, and reports what it could reach besides.
FAKE = f"""#!{sys.executable}
import json, os, re, socket, sys, urllib.request
prompt = next(a for a in sys.argv[1:] if "Write the complete child harness" in a)
out = re.search(r"Write the complete child harness to `([^`]+)`", prompt).group(1)
parent = re.search(r"The parent harness: `([^`]+)`", prompt).group(1)
base, token = os.environ[os.environ.get("FAKE_URL_VAR", "ANTHROPIC_BASE_URL")], os.environ.get("ANTHROPIC_AUTH_TOKEN", "")
req = urllib.request.Request(base + "/chat/completions", method="POST",
                             data=json.dumps({{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}).encode(),
                             headers={{"Authorization": "Bearer " + token, "Content-Type": "application/json"}})
answer = json.load(urllib.request.urlopen(req, timeout=20))["choices"][0]["message"]["content"]
seen = {{"env": sorted(k for k, v in os.environ.items() if "canary" in v), "home": None, "direct": None,
        "cwd": os.getcwd(), "base": base}}
try:
    seen["home"] = open({{home!r}}).read()
except OSError as e:
    seen["home"] = type(e).__name__
try:
    socket.create_connection(("127.0.0.1", {{port}}), timeout=2).sendall(b"escaped")
    seen["direct"] = "connected"
except OSError as e:
    seen["direct"] = type(e).__name__
seen["ifaces"] = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
open(out, "w").write(open(parent).read() + {CHANGED!r})
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False, "result": answer + " " + json.dumps(seen),
                  "usage": {{"input_tokens": 10, "output_tokens": 2}}}}))
"""


@pytest.fixture
def setting(tmp_path, monkeypatch):
    home = tmp_path / "host-home"
    home.mkdir()
    (home / ".canary").write_text(CANARY_FILE)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY_KEY)
    bystander = socket.socket()
    bystander.bind(("127.0.0.1", 0))
    bystander.listen(4)
    bystander.settimeout(0.1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "claude"
    cli.write_text(FAKE.replace("{home!r}", repr(str(home / ".canary"))).replace("{port}", str(bystander.getsockname()[1])))
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with ScriptedOpenAIServer([reply("model says hello")]) as srv, FakeGateway(srv.url) as gw:
        yield gw, srv, bystander, tmp_path
    bystander.close()


def _seen(report: str) -> dict:
    return json.loads(report.split("model says hello ", 1)[1])


def test_the_claude_preset_runs_in_bwrap_reaching_only_the_gateway_with_a_revoked_per_call_token(setting):
    gw, srv, bystander, tmp = setting
    agent = CliMutator(preset="claude", gateway=gw)
    req = request(tmp)
    out = agent.mutate(req)
    assert out.child is not None, out.error
    assert out.child.source == req.parent.source + CHANGED
    seen = _seen(out.report)
    # The model call went through the gateway with the token it issued for this call, now revoked.
    assert len(gw.calls) == 1 and len(srv.answered) == 1 and not gw.refused
    (token, path), = gw.calls
    assert path == "/anthropic/v1/chat/completions" and gw.issued[token] == ("mutator", "cli:claude")
    assert token in gw.revoked
    assert seen["base"].startswith("http://127.0.0.1:") and seen["cwd"] == "/workspace"
    # No key, no host home, no other network.
    assert seen["env"] == [] and seen["home"] in ("FileNotFoundError", "PermissionError")
    assert seen["direct"] != "connected"
    assert set(seen["ifaces"]) <= {"lo"}, seen["ifaces"]  # no network at all, not even public egress
    with pytest.raises(OSError):
        bystander.accept()
    transcript = (req.workdir.parent / "round-1.cli-stdout.txt").read_text()
    assert CANARY_KEY not in transcript and CANARY_FILE not in transcript


def test_a_revoked_token_is_refused_by_the_gateway(setting):
    gw, srv, _, tmp = setting
    agent = CliMutator(preset="claude", gateway=gw)
    assert agent.mutate(request(tmp)).child is not None
    (token, _), = gw.calls
    import urllib.error
    import urllib.request

    stale = urllib.request.Request(gw.base_url("anthropic") + "/chat/completions", method="POST", data=b"{}",
                                   headers={"Authorization": f"Bearer {token}"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(stale, timeout=10)
    assert err.value.code == 401 and len(srv.answered) == 1


def test_without_a_gateway_a_sandboxed_cli_is_refused_naming_trusted_host(setting):
    _, _, _, tmp = setting
    out = CliMutator(preset="claude").mutate(request(tmp))
    assert out.child is None and "gateway" in out.error and "trusted_host" in out.error


def test_a_sandboxed_cli_may_not_be_handed_a_key_and_a_custom_command_must_name_its_variables():
    with pytest.raises(ValueError, match="trusted_host"):
        CliMutator(preset="claude", pass_env=["ANTHROPIC_API_KEY"])
    with pytest.raises(ValueError, match="base_url_env"):
        CliMutator(command=["aider", "{prompt}"])
    CliMutator(command=["aider", "{prompt}"], base_url_env="OPENAI_API_BASE", token_env="OPENAI_API_KEY")
    CliMutator(preset="claude", pass_env=["ANTHROPIC_API_KEY"], trusted_host=True)


def test_a_custom_command_gets_the_gateway_through_the_variables_it_names(setting):
    gw, srv, _, tmp = setting
    agent = CliMutator(command=["claude", "-p", "{prompt}"], usage_format="claude_json", gateway=gw,
                       base_url_env="FAKE_BASE", token_env="ANTHROPIC_AUTH_TOKEN", env={"FAKE_URL_VAR": "FAKE_BASE"})
    out = agent.mutate(request(tmp))
    assert out.child is not None, out.error
    assert [p for _, p in gw.calls] == ["/openai/v1/chat/completions"]


def test_trusted_host_runs_on_the_host_and_warns_on_every_call(setting, caplog):
    gw, _, _, tmp = setting
    # On the host the CLI sees the real environment it is given: here the gateway URL by hand.
    agent = CliMutator(preset="claude", trusted_host=True, env={"ANTHROPIC_BASE_URL": gw.base_url("anthropic")})
    with caplog.at_level(logging.WARNING, logger="milo_ray.agents.mutators.cli"):
        for i in range(2):
            agent.mutate(request(tmp / f"call-{i}"))
    warnings = [r for r in caplog.records if "trusted_host=true" in r.getMessage()]
    assert len(warnings) == 2
