"""A task that allows the internet gets a private network namespace with user-mode egress
to public addresses only (milo_ray/boundary/sandbox/egress.py): never the host's
namespace, its loopback, its ports or its sockets; no link-local (metadata) or private
range. Probed from real bwrap sandboxes, and from a hostile harness run by the executor."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path

import pytest

from hostile import report_in_trace

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.boundary.sandbox.egress import BLOCKED_V4, filter_rules, host_networks, missing_tools

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.skipif(missing_tools() is not None, reason=f"no private network here: {missing_tools()}")]

FACTORY = BwrapSandboxFactory(command_timeout_s=60)
INTERNET = SandboxSpec(task_id="net", allow_internet=True)
# One address in each range the sandbox must never reach (metadata first).
FORBIDDEN = {"metadata": "169.254.169.254", "10/8": "10.1.2.3", "172.16/12": "172.16.5.5",
             "192.168/16": "192.168.1.1", "100.64/10": "100.64.0.1"}
REGISTRY = ("pypi.org", 443)

_PROBE = r'''
import json, socket, sys
out = {}
for name, host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=8).close()
        out[name] = "connected"
    except socket.timeout:
        out[name] = "timeout"
    except OSError as e:
        out[name] = type(e).__name__
out["tcp"] = [open(p).read() for p in ("/proc/net/tcp", "/proc/net/tcp6")]
print(json.dumps(out))
'''


def _host_address() -> str:
    """An address of one of the host's own interfaces other than loopback."""
    for net in host_networks():
        ip = ipaddress.ip_network(net)
        if ip.prefixlen == 32 and not ip.network_address.is_loopback:
            return str(ip.network_address)
    pytest.skip("the host has no non-loopback IPv4 address")


@pytest.fixture(scope="module")
def listener():
    """A host service on every address (loopback included): what Ray's ports look like."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def _registry_reachable_from_host() -> bool:
    try:
        socket.create_connection(REGISTRY, timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def probed(listener, tmp_path_factory):
    targets = [("host_loopback", "127.0.0.1", listener), ("host_address", _host_address(), listener),
               *((name, addr, 80) for name, addr in FORBIDDEN.items()), ("registry", *REGISTRY)]
    with FACTORY.open(INTERNET, tmp_path_factory.mktemp("net")) as sb:
        sb.upload_files([("/tmp/probe.py", _PROBE.encode())])
        run = sb.execute(f"python3 /tmp/probe.py '{json.dumps(targets)}'")
    assert run.exit_code == 0, run.output
    return json.loads(run.output.strip().splitlines()[-1])


def test_an_internet_task_cannot_reach_a_listener_on_the_hosts_loopback(probed):
    assert probed["host_loopback"] == "ConnectionRefusedError"


def test_an_internet_task_cannot_reach_a_host_port_on_the_hosts_own_address(probed):
    assert probed["host_address"] == "ConnectionRefusedError"


def test_proc_net_tcp_shows_only_the_sandboxs_own_sockets(probed, listener):
    # The host listens on `listener` (and Ray on its own ports): none of it is seen. What
    # is there are the probe's own connections, from the namespace's own address.
    rows = [line.split() for table in probed["tcp"] for line in table.splitlines()[1:] if line.strip()]
    own = {"0100007F", "6402000A"}  # 127.0.0.1 and 10.0.2.100 (slirp4netns's guest), little-endian hex
    assert all(row[1].split(":")[0] in own for row in rows), rows
    assert not [row for row in rows if row[3] == "0A"], "a listening socket is visible"  # 0A: LISTEN
    assert f":{listener:04X}" not in "".join(probed["tcp"])


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_metadata_and_private_ranges_are_refused_not_left_to_hang(probed, name):
    # Refused by the filter in the sandbox's namespace (an error at once, not a timeout).
    assert probed[name] in ("ConnectionRefusedError", "OSError"), probed[name]


def test_egress_reaches_a_public_registry(probed):
    if not _registry_reachable_from_host():
        pytest.skip(f"this machine has no route to {REGISTRY[0]}:{REGISTRY[1]}, so egress cannot be shown")
    assert probed["registry"] == "connected"


def test_the_egress_filter_refuses_every_private_range_and_the_hosts_own_networks():
    v4, v6 = filter_rules([*BLOCKED_V4, "192.0.2.2/32", "192.0.2.0/24"], ["10.255.255.53"])
    for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
                "192.0.2.2/32", "192.0.2.0/24"):
        assert f"-A OUTPUT -d {net} -p tcp -j REJECT" in v4, net
    # The resolver is the only private destination, and only on port 53.
    assert "-A OUTPUT -d 10.255.255.53/32 -p udp --dport 53 -j ACCEPT" in v4
    # IPv6 (fc00::/7, fe80::/10 and the rest) has no egress but the namespace's loopback.
    assert v6.index("-o lo -j ACCEPT") < v6.index("-A OUTPUT -j REJECT")


def test_the_network_ends_with_the_sandbox(tmp_path):
    sb = FACTORY.open(INTERNET, tmp_path)
    network = sb._network
    processes = [network._holder, network._slirp]
    assert all(p.poll() is None for p in processes)
    sb.close()
    assert all(p.poll() is not None for p in processes)


# -- a hostile harness, run by the executor --------------------------------------------

KEY_ENV = "MILO_NETWORK_SOLVER_KEY"

NET_HARNESS = '''
import json, socket
from langchain_core.messages import AIMessage, HumanMessage


def _connect(host, port):
    try:
        socket.create_connection((host, port), timeout=8).close()
        return "connected"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return type(e).__name__


class _Agent:
    def __init__(self, report):
        self.report = report

    async def astream(self, inputs, config=None, stream_mode=None):
        yield {{"messages": [HumanMessage(content=inputs["messages"][0]["content"]),
                            AIMessage(content="NETPROBE" + json.dumps(self.report))]}}


def build_agent(model, backend):
    r = {{name: _connect(host, port) for name, (host, port) in {targets!r}.items()}}
    r["tcp"] = open("/proc/net/tcp").read()
    r["invoke"] = model.invoke("hello").content  # the gateway still answers
    return _Agent(r)
'''


@pytest.mark.slow  # a cold harness process
def test_a_hostile_harness_on_an_internet_task_is_contained_and_scored(tmp_path, listener):
    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.harness.model import Harness
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

    from hostile import make_secret_task

    task_dir = make_secret_task(tmp_path / "tasks")
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("allow_internet = false", "allow_internet = true"))
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    assert suite.task("secret").metadata["allow_internet"] is True
    targets = {"host_loopback": ("127.0.0.1", listener), "host_address": (_host_address(), listener),
               "metadata": ("169.254.169.254", 80)}
    harness = Harness.from_source(NET_HARNESS.format(targets=targets), name="net-probe")
    os.environ[KEY_ENV] = "sk-" + uuid.uuid4().hex
    try:
        with ScriptedOpenAIServer(lambda body: reply("hi", prompt_tokens=3, completion_tokens=1)) as srv:
            model = {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": KEY_ENV,
                     "request_timeout_s": 30, "max_retries": 0}
            ex = AgentExecutor(model=model, sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                               scratch_dir=str(tmp_path))
            result = asyncio.run(ex.aexecute(harness, suite.task("secret"), 0, 0))
    finally:
        os.environ.pop(KEY_ENV, None)
    report = json.loads(report_in_trace(result.trace, "NETPROBE"))
    assert report["host_loopback"] == report["host_address"] == "ConnectionRefusedError"
    assert report["metadata"] in ("ConnectionRefusedError", "OSError")
    assert f":{listener:04X}" not in report["tcp"]
    assert report["invoke"] == "hi"
    assert result.score == 0.0 and result.error_kind is None  # a score, not a crash

