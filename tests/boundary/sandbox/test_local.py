"""The unconfined local sandbox: it warns on every open, runs in its workspace with a
clean environment, maps task paths for transfers and file tools, and still enforces the
per-command timeout, output cap and interrupt."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.local import UNCONFINED_WARNING, LocalSandboxFactory

FACTORY = LocalSandboxFactory(command_timeout_s=20, output_cap_bytes=65536)


@pytest.fixture
def sandbox(tmp_path):
    with FACTORY.open(SandboxSpec(task_id="t", env={"TASK_VAR": "v"}), tmp_path) as sb:
        yield sb


def test_every_open_warns_that_commands_run_unconfined(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="milo_ray.boundary.sandbox.local"):
        FACTORY.open(SandboxSpec(task_id="a"), tmp_path / "1").close()
        FACTORY.open(SandboxSpec(task_id="b"), tmp_path / "2").close()
    assert sum(UNCONFINED_WARNING in r.getMessage() for r in caplog.records) == 2


def test_commands_run_in_the_workspace_with_a_clean_environment(sandbox, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SECRET_KEY", "sk-do-not-leak")
    r = sandbox.execute("pwd; env; echo made > here.txt")
    assert r.output.splitlines()[0] == str(tmp_path / "workspace")
    assert "sk-do-not-leak" not in r.output and "TASK_VAR=v" in r.output
    assert f"HOME={tmp_path / 'home'}" in r.output
    assert (tmp_path / "workspace" / "here.txt").read_text() == "made\n"


def test_task_paths_are_mapped_for_transfers_and_file_tools(sandbox, tmp_path):
    up = sandbox.upload_files([("/app/src/m.py", b"x = 1\n"), ("/logs/v/r.txt", b"1"), ("/etc/evil", b"x")])
    assert [u.error for u in up] == [None, None, "permission_denied"]
    assert (tmp_path / "workspace" / "src" / "m.py").read_bytes() == b"x = 1\n"
    assert (tmp_path / "logs" / "v" / "r.txt").read_bytes() == b"1"
    assert sandbox.download_files(["/app/src/m.py"])[0].content == b"x = 1\n"
    assert sandbox.download_files(["/app/nope"])[0].error == "file_not_found"
    assert sandbox.edit("/app/src/m.py", "x = 1", "x = 2").path == "/app/src/m.py"
    assert "x = 2" in sandbox.read("/app/src/m.py").file_data["content"]
    assert [e["path"] for e in sandbox.ls("/app/src").entries] == ["/app/src/m.py"]
    assert [m["path"] for m in sandbox.grep("x = 2", "/app").matches] == ["/app/src/m.py"]
    assert [m["path"] for m in sandbox.glob("**/*.py", "/app").matches] == ["/app/src/m.py"]
    assert sandbox.read("/etc/passwd").error is not None  # outside the task's directories
    big = "y" * 300_000  # large enough for deepagents' staged (upload + /tmp) edit path
    assert sandbox.write("/app/big.txt", big + "\nend\n").error is None
    assert sandbox.edit("/app/big.txt", big, "small").error is None
    assert sandbox.download_files(["/app/big.txt"])[0].content == b"small\nend\n"
    assert [e["path"] for e in asyncio.run(sandbox.als("/app/src")).entries] == ["/app/src/m.py"]


def test_timeout_and_output_cap_are_enforced(sandbox):
    start = time.monotonic()
    r = sandbox.execute("sleep 30", timeout=1)
    assert r.exit_code == 124 and time.monotonic() - start < 5
    r = sandbox.execute("yes | head -c 50M")
    assert r.truncated and len(r.output.encode()) < 65536 + 200


def test_interrupt_kills_a_running_command_and_keeps_files(sandbox):
    result = {}
    t = threading.Thread(target=lambda: result.update(r=sandbox.execute("echo kept > f; sleep 60")))
    t.start()
    deadline = time.monotonic() + 10
    while not sandbox.download_files(["/app/f"])[0].content and time.monotonic() < deadline:
        time.sleep(0.05)
    sandbox.interrupt()
    t.join(10)
    assert not t.is_alive() and result["r"].exit_code != 0
    assert sandbox.execute("cat f").output == "kept\n"


def test_tasks_needing_an_image_are_refused():
    assert "sandbox=docker" in FACTORY.unsupported(SandboxSpec(task_id="t", needs_docker="RUN pip install x"))
    assert FACTORY.unsupported(SandboxSpec(task_id="t")) is None


def test_config_builds_the_factory_with_every_knob():
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).parents[3] / "conf" / "sandbox" / "local.yaml")
    factory = instantiate(conf)
    assert isinstance(factory, LocalSandboxFactory) and factory.name == "local"
    for key, value in OmegaConf.to_container(conf).items():
        if key != "_target_":
            assert getattr(factory, key) == value, key
