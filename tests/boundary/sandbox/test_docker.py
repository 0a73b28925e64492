"""The Docker sandbox against a real dockerd (skipped without one, failed under CI=true)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox import docker_image, docker_sandbox as docker_sandbox_module
from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.docker import DockerSandboxFactory
from milo_ray.boundary.sandbox.docker_image import override_from


def _containers(task_id: str) -> list[str]:
    done = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=milo-ray.task={task_id}"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def _processes(sandbox) -> list[str]:
    """Command lines of every process in the container but ps itself."""
    out = sandbox.execute("ps -eo args=").output.splitlines()
    return [line.strip() for line in out if line.strip() and not line.strip().startswith("ps ")]


# -- without a daemon ---------------------------------------------------------------------

def test_from_override_replaces_external_images_and_keeps_stages() -> None:
    text = ("FROM --platform=linux/amd64 python:3.12 AS build\nRUN make\n"
            "from build AS test\nFROM ubuntu:24.04\nCOPY --from=build /x /x\n")
    assert override_from(text, "base:local") == (
        "FROM --platform=linux/amd64 base:local AS build\nRUN make\n"
        "from build AS test\nFROM base:local\nCOPY --from=build /x /x\n")


def test_warm_harness_processes_under_docker_are_refused_naming_the_field(monkeypatch) -> None:
    from milo_ray.execution.agent_executor import AgentExecutor

    monkeypatch.setenv("MILO_TEST_SOLVER_KEY", "k")
    model = {"solver": "openai/scripted", "api_base": "http://127.0.0.1:9", "api_key_env": "MILO_TEST_SOLVER_KEY"}
    with pytest.raises(ValueError, match="executor.warm_processes=1: .*sandbox=docker"):
        AgentExecutor(model=model, sandbox=DockerSandboxFactory(), warm_processes=1)
    assert AgentExecutor(model=model, sandbox=DockerSandboxFactory()).sandbox.hosts_harness


def test_unsupported_names_what_is_missing(tmp_path: Path) -> None:
    factory = DockerSandboxFactory(docker=("false",))
    assert "sandbox=bwrap" in factory.unsupported(SandboxSpec(task_id="t"))
    assert "no Dockerfile" in factory.unsupported(SandboxSpec(task_id="t", build_context=str(tmp_path)))
    reason = factory.unsupported(SandboxSpec(task_id="t", docker_image="img"))
    assert "no Docker daemon answers" in reason and "milo_ray.testing.dockerd" in reason


def test_bad_factory_options_name_the_field() -> None:
    with pytest.raises(ValueError, match="command_timeout_s"):
        DockerSandboxFactory(command_timeout_s=0)
    with pytest.raises(ValueError, match="host_mounts"):
        DockerSandboxFactory(host_mounts=["usr"])


# -- against dockerd ----------------------------------------------------------------------

def test_task_files_env_and_sandbox_dirs_are_in_place(docker_sandbox, docker_task) -> None:
    hello = (Path(docker_task.build_context) / "hello.txt").read_text()
    result = docker_sandbox.execute("pwd; cat /app/hello.txt; echo \"$TASK_GREETING\"; "
                                    "touch /logs/a /tests/a /solution/a && echo dirs-ok")
    assert result.exit_code == 0
    assert result.output == f"/app\n{hello}hi there\ndirs-ok\n"


def test_deepagents_file_tools_work_inside(docker_sandbox) -> None:
    assert docker_sandbox.write("/app/src/main.py", "print('one')\n").error is None
    assert docker_sandbox.edit("/app/src/main.py", "one", "two").error is None
    assert docker_sandbox.read("/app/src/main.py").file_data["content"] == "print('two')"
    assert {e["path"] for e in docker_sandbox.ls("/app").entries} == {"/app/hello.txt", "/app/src"}
    assert docker_sandbox.execute("python3 src/main.py").output == "two\n"


def test_no_network_unless_the_task_allows_it(docker_factory, docker_task, tmp_path) -> None:
    probe = ("python3 -c \"import os,socket; print(sorted(os.listdir('/sys/class/net')));"
             "s=socket.socket(); s.settimeout(3)\ntry: s.connect(('1.1.1.1', 53))\n"
             "except OSError as e: print(e.errno)\"")
    out = docker_factory.open(docker_task, tmp_path / "a")
    with out:
        assert out.execute(probe).output.split("\n")[:2] == ["['lo']", "101"]  # ENETUNREACH
    allowed = docker_factory.open(dataclasses.replace(docker_task, allow_internet=True), tmp_path / "b")
    with allowed:
        # Its own namespace with user-mode egress (egress.py), never Docker's bridge.
        assert "tap0" in allowed.execute(probe).output.split("\n")[0]


def test_an_internet_container_reaches_no_host_port_metadata_or_private_range(docker_factory, docker_task,
                                                                            tmp_path) -> None:
    # Its own namespace with the bwrap sandbox's egress filter (egress.py), never Docker's
    # bridge: neither the bridge's gateway (the host, 172.17.0.1) nor the host's own
    # address, where a listener on every address waits.
    import socket

    from milo_ray.boundary.sandbox.egress import host_networks

    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    own = [n.split("/")[0] for n in host_networks() if n.endswith("/32") and not n.startswith("127.")]
    targets = [(a, port) for a in own] + [("169.254.169.254", 80), ("10.1.2.3", 80), ("192.168.1.1", 80)]
    probe = ("python3 -c \"import socket\nfor a in %r:\n    try: socket.create_connection(a, 8).close(); print('connected')\n"
             "    except socket.timeout: print('timeout')\n    except OSError as e: print(type(e).__name__)\"" % (targets,))
    try:
        with docker_factory.open(dataclasses.replace(docker_task, allow_internet=True), tmp_path / "net") as sandbox:
            out = sandbox.execute(probe).output.split()
    finally:
        srv.close()
    assert out == ["ConnectionRefusedError"] * len(targets), out


def test_resource_limits_come_from_the_spec(docker_factory, docker_task, tmp_path) -> None:
    spec = dataclasses.replace(docker_task, cpus=0.5, memory_mb=256)
    with docker_factory.open(spec, tmp_path / "s") as sandbox:
        done = subprocess.run(["docker", "inspect", "--format", "{{json .HostConfig}}", sandbox.id],
                              capture_output=True, text=True, check=True)
    host = json.loads(done.stdout)
    assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (500_000_000, 256 << 20, 4096)


def test_command_past_its_timeout_is_killed_with_its_children(docker_sandbox) -> None:
    start = time.monotonic()
    result = docker_sandbox.execute("sleep 41 & echo started; sleep 42", timeout=2)
    assert time.monotonic() - start < 10
    assert result.exit_code == 124 and "timed out after 2 s" in result.output
    assert result.output.startswith("started\n")
    assert not [p for p in _processes(docker_sandbox) if p.startswith("sleep 4")]
    assert docker_sandbox.execute("echo alive").output == "alive\n"


def test_output_past_the_cap_is_truncated(make_docker_factory, docker_task, tmp_path) -> None:
    factory = make_docker_factory(output_cap_bytes=1000)
    with factory.open(docker_task, tmp_path / "s") as sandbox:
        result = sandbox.execute("head -c 200000 /dev/zero | tr '\\0' a; echo done")
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("a" * 1000) and len(result.output) < 1200


def test_interrupt_kills_running_commands_and_keeps_files(docker_sandbox) -> None:
    docker_sandbox.execute("nohup sleep 301 >/dev/null 2>&1 &")
    running = {}
    worker = threading.Thread(target=lambda: running.update(r=docker_sandbox.execute("sleep 302", timeout=60)))
    worker.start()
    deadline = time.monotonic() + 10
    while "sleep 302" not in _processes(docker_sandbox) and time.monotonic() < deadline:
        time.sleep(0.1)
    docker_sandbox.interrupt()
    worker.join(timeout=20)
    assert not worker.is_alive() and running["r"].exit_code not in (0, 124)
    assert not [p for p in _processes(docker_sandbox) if p.startswith("sleep 30")]
    assert docker_sandbox.execute("cat /app/hello.txt").output.startswith("hello ")


def test_upload_download_round_trip_and_errors(docker_sandbox) -> None:
    blob = bytes(range(256)) * 100
    up = docker_sandbox.upload_files([("/app/deep/new/blob.bin", blob), ("relative.txt", b"x"), ("/app", b"x")])
    assert [r.error for r in up] == [None, "invalid_path", "is_directory"]
    down = docker_sandbox.download_files(["/app/deep/new/blob.bin", "/app/missing.txt", "/app/deep", "x"])
    assert down[0].content == blob and down[0].error is None
    assert [r.error for r in down[1:]] == ["file_not_found", "is_directory", "invalid_path"]


def test_image_is_built_once_per_task_content(docker_factory, docker_task, tmp_path, monkeypatch) -> None:
    builds = []
    real = docker_image.run_capped

    def counting(argv, **kw):
        if "build" in argv:
            builds.append(argv)
        return real(argv, **kw)

    monkeypatch.setattr(docker_image, "run_capped", counting)
    with ThreadPoolExecutor(2) as pool:
        pair = list(pool.map(lambda i: docker_factory.open(docker_task, tmp_path / f"s{i}"), range(2)))
    pair.append(docker_factory.open(docker_task, tmp_path / "s2"))
    try:
        assert len({s.id for s in pair}) == 3
        assert all(s.execute("cat hello.txt").output.startswith("hello ") for s in pair)
    finally:
        for s in pair:
            s.close()
    assert len(builds) == 1


def test_container_is_removed_on_close_and_when_dropped(docker_factory, docker_task, tmp_path) -> None:
    sandbox = docker_factory.open(docker_task, tmp_path / "a")
    assert len(_containers(docker_task.task_id)) == 1
    sandbox.close()
    sandbox.close()
    assert _containers(docker_task.task_id) == []
    with pytest.raises(RuntimeError, match="closed"):
        sandbox.execute("true")
    # A rollout that crashed before close(): the finalizer removes the container.
    docker_factory.open(docker_task, tmp_path / "b")
    gc.collect()
    assert _containers(docker_task.task_id) == []


def test_interrupt_restarts_the_container_when_the_sweep_cannot_run(docker_sandbox, monkeypatch) -> None:
    docker_sandbox.execute("nohup sleep 303 >/dev/null 2>&1 &")
    monkeypatch.setattr(docker_sandbox_module, "SWEEP", "exit 1")  # as when no pid is left to fork it
    docker_sandbox.interrupt()
    assert not [p for p in _processes(docker_sandbox) if p.startswith("sleep 303")]
    assert docker_sandbox.execute("cat /app/hello.txt").output.startswith("hello ")
    monkeypatch.undo()
    docker_sandbox.interrupt()  # the main process found again after the restart survives it
    assert docker_sandbox.execute("echo alive").output == "alive\n"


def test_config_group_builds_the_factory() -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).parents[3] / "conf" / "sandbox" / "docker.yaml")
    factory = instantiate(conf)
    assert isinstance(factory, DockerSandboxFactory) and factory.name == "docker"
    assert (factory.docker, factory.host_mounts, factory.base_image_override) == (("docker",), (), None)


def test_commands_run_hardened(docker_sandbox) -> None:
    """Every process of the container is one non-root uid (the container's lease) with no
    capabilities and no privilege gain; the root is read-only, the workdir and /tmp
    writable."""
    r = docker_sandbox.execute("id -u; grep -E 'Cap(Eff|Prm)|NoNewPrivs' /proc/self/status; "
                               "touch /usr/x 2>&1; touch /opt-x 2>&1; touch ./mine /tmp/t && echo writable")
    lines = r.output.splitlines()
    uid = docker_sandbox.owner[0] if docker_sandbox.owner else os.getuid()
    assert lines[0] == str(uid) and uid != 0
    assert {line.split()[1] for line in lines[1:3]} == {"0000000000000000"} and lines[3].split()[1] == "1"
    assert r.output.count("Read-only file system") + r.output.count("Permission denied") >= 2
    assert lines[-1] == "writable"
    # docker-init and the main process too: nothing in the container holds another uid.
    owners = docker_sandbox.execute("for d in /proc/[0-9]*; do stat -c %u $d; done").output.split()
    assert set(owners) == {str(uid)}, owners


def test_commands_run_under_the_daemons_seccomp_filter(docker_sandbox) -> None:
    """Docker's default seccomp profile stays on (never --privileged or seccomp=unconfined):
    it is what refuses the keyring calls to containers that all run as one uid."""
    r = docker_sandbox.execute("grep -E '^Seccomp:' /proc/self/status")
    assert r.output.split() == ["Seccomp:", "2"], r.output  # 2: a filter is applied


def test_grading_container_carries_over_only_the_workspace(docker_sandbox, docker_task) -> None:
    """What the agent left anywhere but its workspace -- a planted test in /tests, a file
    in /tmp and /logs, a running process -- is not in the container the verifier gets,
    which runs as a uid of its own."""
    agent = docker_sandbox
    agent.execute("echo work > /app/result; echo pwned > /tests/conftest.py; echo x > /tmp/left; "
                  "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt; rm /app/hello.txt; "
                  "nohup sleep 404 >/dev/null 2>&1 &")
    agent_dirs = set(agent.dirs.mounts.values())
    fresh = agent.fresh_for_grading()
    try:
        assert len(_containers(docker_task.task_id)) == 1  # the agent's container is gone
        r = fresh.execute("cat /app/result; ls -A /tests /logs /tmp; ls /app; id -u")
        uid = fresh.owner[0] if fresh.owner else os.getuid()
        assert r.output.split() == ["work", "/logs:", "/tests:", "/tmp:", "result", str(uid)], r.output
        # The deleted task file stays deleted: the workspace is not refilled from the image.
        assert not [p for p in _processes(fresh) if "sleep 404" in p]
        assert not any(d.exists() for d in agent_dirs), agent_dirs  # moved (the workspace) or deleted
        with pytest.raises(RuntimeError, match="closed"):
            agent.execute("true")
    finally:
        fresh.close()
    assert _containers(docker_task.task_id) == []
