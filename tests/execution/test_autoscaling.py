"""The autoscaler sees the rollouts' demand: on a cluster started by Ray's fake
multi-node provider with a head of no slots and **no worker node**, a run's pending
workers make the autoscaler launch a slotted node and the rollouts run there; once the
workers are released, the autoscaler's own report shows the slots unused and no demand
left, which is what its idle timeout removes a node on.

The removal itself cannot be watched with the installed Ray: its v1 fake provider never
matches the nodes it launched to their addresses (they stay "uninitialized", so never
idle), and autoscaler v2 needs a defaults file the Ray wheel does not ship
(fake_multi_node/example.yaml).

The cluster is started like `ray up` does on the head (`ray start --head
--autoscaling-config=...`), with its own temp dir so every process of it (the fake
nodes too) can be found and stopped by id afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from slot_cluster import driver_env, run_driver

from milo_ray.testing.processes import last_json

PORT = 33379
SLOTS = 4


def _config(gcs_address: str) -> dict:
    worker = {"resources": {"CPU": 1, "sandbox_slot": SLOTS}, "node_config": {}, "min_workers": 0, "max_workers": 2}
    head = {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0}
    return {
        "cluster_name": "slots-fake", "max_workers": 2, "upscaling_speed": 1.0, "idle_timeout_minutes": 0.1,
        "docker": {}, "auth": {"ssh_user": "ubuntu"},
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address, "disable_launch_config_check": True,
                     "disable_node_updaters": True},
        "available_node_types": {"ray.head.default": head, "slotted": worker},
        "head_node_type": "ray.head.default",
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False, "rsync_exclude": [],
        "rsync_filter": [], "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


def _own_processes(tmp: str) -> list[int]:
    """Processes of this cluster: every Ray process names its session dir under ``tmp``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if tmp in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.fixture()
def autoscaling_head(tmp_path):
    from ray._private.services import get_node_ip_address

    tmp = f"/tmp/ray-slots-as-{os.getpid()}"
    address = f"{get_node_ip_address()}:{PORT}"
    config = tmp_path / "autoscaling.json"
    config.write_text(json.dumps(_config(address)))
    # `ray start` turns on token auth (the token in ~/.ray/auth_token); the driver joins with it.
    env = {**driver_env(), "RAY_TMPDIR": tmp, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    subprocess.run(["ray", "start", "--head", f"--port={PORT}", "--num-cpus=0", "--include-dashboard=false",
                    f"--autoscaling-config={config}", f"--temp-dir={tmp}"],
                   check=True, env=env, capture_output=True, timeout=120)
    try:
        yield address, env
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _own_processes(tmp):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(2)


@pytest.mark.slow  # the fake provider starts a real node: about half a minute
def test_pending_workers_scale_the_cluster_up_from_no_worker_node_and_leave_it_idle(autoscaling_head):
    address, env = autoscaling_head
    proc = run_driver("sleep", address, "--n", "24", "--seconds", "1.0", "--slots-per-worker", "2", "--idle", "1",
                      "--wait-release", "--wait-idle-report", "--run-id", "autoscaled", timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["slotted_at_start"] == 0  # nothing could run a rollout when the run began
    rows = out["rows"]
    assert len(rows) == 24 and all(r["error_kind"] is None for r in rows)
    # The autoscaler launched slotted nodes for the demand and the rollouts ran there.
    assert out["slotted_seen"] >= 1 and len({r["node"] for r in rows}) >= 1
    assert out["released_after"] is not None
    # What the autoscaler reads after the release: no slot in use, no slot asked for.
    assert out["idle_reported_after"] is not None
