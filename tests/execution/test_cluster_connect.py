"""Connecting the driver: a private local instance starts quietly and with token auth."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import os
from milo_ray.config.schemas import ExecutionConfig
from milo_ray.execution.cluster import connect
info = connect(ExecutionConfig(num_cpus=1, join_running=False))
print(info.started_here, info.slots, os.environ.get("RAY_AUTH_MODE"))
"""


def test_private_local_instance_keeps_token_auth_without_the_start_up_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "8.0", "token"]
    assert "Token authentication" not in proc.stderr, proc.stderr


SCHEDULER_FIRST = """
import ray
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.tasks import Task
from milo_ray.harness.model import Harness
from milo_ray.store import MemoryRunStore
h = Harness.from_source("def build_agent(model, backend):\\n    return 'a'\\n")
s = RolloutScheduler({"_target_": "milo_ray.execution.fake.SleepExecutor"}, [Task("t", "search", "x", 30.0, 1000, {})],
                     MemoryRunStore(run_id="r"), model_id="m", run_id="r", slots_per_node=3, progress=False)
s.add_harness(h)
(r,) = s.run([RolloutRequest(h.harness_id, "t", 0, seed=1)])
print(r.score, [w.slots for w in s._workers.values()], ray.cluster_resources().get("sandbox_slot"))
"""


def test_a_scheduler_used_before_ray_started_starts_it_with_its_own_slots_per_node(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", SCHEDULER_FIRST], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The instance it starts declares the scheduler's slots_per_node as its sandbox slots,
    # and the scheduler's worker holds them.
    assert proc.stdout.split() == ["1.0", "[3]", "3.0"]


def test_an_address_file_left_by_a_dead_ray_start_head_is_not_joined(tmp_path, monkeypatch, caplog):
    """A killed `ray start` head leaves `ray_current_cluster` behind: a run must start
    its own instance instead of waiting forever on a GCS that is gone."""
    import socket

    from milo_ray.execution.cluster import _running_local_address

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    address_file = tmp_path / "ray" / "ray_current_cluster"
    address_file.parent.mkdir()
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        address_file.write_text(f"127.0.0.1:{live.getsockname()[1]}\n")
        assert _running_local_address() == f"127.0.0.1:{live.getsockname()[1]}"
        dead_port = live.getsockname()[1]
    address_file.write_text(f"127.0.0.1:{dead_port}\n")
    with caplog.at_level("WARNING"):
        assert _running_local_address() is None
    assert "does not answer" in caplog.text and str(address_file) in caplog.text


def _flaky_client_init(monkeypatch, failures: int) -> list[str]:
    """ray.init that fails like a Ray Client server dying at start ``failures`` times."""
    import ray

    from milo_ray.execution import cluster

    tries: list[str] = []

    def init(address=None, **_):
        tries.append(address)
        if len(tries) <= failures:
            raise ConnectionAbortedError("Initialization failure from server:\nRuntimeError: Starting Ray client "
                                         "server failed. See ray_client_server_23000.err for detailed logs.")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(cluster, "_info", lambda started_here: started_here)
    return tries


def test_a_ray_client_server_that_dies_at_start_is_asked_for_again(monkeypatch, caplog):
    from milo_ray.execution.cluster import join

    tries = _flaky_client_init(monkeypatch, failures=2)
    assert join("ray://10.0.0.1:10001", configure_logging=False) is False
    assert tries == ["ray://10.0.0.1:10001"] * 3
    assert "Ray Client server did not start (attempt 2 of 3)" in caplog.text


def test_a_client_server_that_never_starts_fails_the_join_and_other_addresses_are_not_retried(monkeypatch):
    import pytest

    from milo_ray.execution.cluster import join

    tries = _flaky_client_init(monkeypatch, failures=5)
    with pytest.raises(ConnectionAbortedError):
        join("ray://10.0.0.1:10001", configure_logging=False)
    assert len(tries) == 3
    tries.clear()
    with pytest.raises(ConnectionAbortedError):
        join("10.0.0.1:6379", configure_logging=False)
    assert len(tries) == 1
