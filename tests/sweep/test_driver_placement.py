"""A sweep on a two-node Ray: no run is lost to a worker's disk.

The cluster: the launcher's own head (2 CPUs) and one worker node (2 CPUs, 4 sandbox slots, one
``driver_slot``) in a mount namespace of its own in which the directory the sweeps write
their runs under is an empty tmpfs, so a run its driver writes there exists on that
node's "disk" only, as on an autoscaled cluster. Each sweep runs through the entry point
in a subprocess, against the head's dashboard (``hydra.launcher.address``)."""

from __future__ import annotations

import time

import pandas as pd
import pytest

# Bound at collection: by fixture time another directory's conftest may own the name.
from conftest import EVAL_TINY, run_sweep, start_hidden_worker, stop_process_group, sweep_env
from milo_ray.sweep.jobs import RUN_MISSING

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """(dashboard URL, hidden directory, head node id, worker node id)."""
    import os

    from ray._private.utils import read_ray_address
    from ray.util.state import list_nodes

    from milo_ray.sweep.local_ray import start_head

    logs = tmp_path_factory.mktemp("two-nodes")
    hidden = tmp_path_factory.mktemp("hidden")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = sweep_env()["PYTHONPATH"]  # the head's processes inherit it
    head = start_head(num_cpus=2, log_path=logs / "head.log")
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not read_ray_address() and time.monotonic() < deadline:  # `ray start` records it after the
            time.sleep(0.5)  # dashboard answers
        worker = start_hidden_worker(read_ray_address(), hidden, num_cpus=2, resources={"driver_slot": 1, "sandbox_slot": 4},
                                     log_path=logs / "worker.log")
        deadline = time.monotonic() + 180
        while True:
            nodes = [n for n in list_nodes(address=head.dashboard_url) if n.state == "ALIVE"]
            if len(nodes) == 2:
                break
            assert worker.poll() is None and time.monotonic() < deadline, (logs / "worker.log").read_text()[-3000:]
            time.sleep(1)
        head_id = next(n.node_id for n in nodes if n.is_head_node)
        worker_id = next(n.node_id for n in nodes if not n.is_head_node)
        yield head.dashboard_url, hidden, head_id, worker_id
    finally:
        if worker is not None:
            stop_process_group(worker)
        head.stop()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def test_drivers_run_on_the_node_that_holds_the_run_directories(two_nodes, tmp_path):
    url, hidden, head_id, worker_id = two_nodes
    sweep = hidden / "pinned"
    # Each driver reserves 2 CPUs: the head holds one at a time, so Ray alone would put
    # the second on the worker (and its run on the worker's disk).
    proc = run_sweep([*EVAL_TINY, "run.seed=0,1", f"run.dir={sweep}", f"hydra.launcher.address={url}",
                      "hydra.launcher.entrypoint_num_cpus=2", "hydra.launcher.max_concurrent=2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"drivers on node {head_id}" in proc.stderr
    summary = pd.read_parquet(sweep / "summary.parquet")
    assert list(summary["status"]) == ["SUCCEEDED", "SUCCEEDED"]
    assert list(summary["run_status"]) == ["finished", "finished"] and summary["pr_at_k"].notna().all()
    assert all(n.startswith(f"node {head_id} (") for n in summary["driver_node"])


def test_the_readme_pin_is_refused_when_the_drivers_node_lacks_it(two_nodes, tmp_path):
    url, hidden, head_id, _ = two_nodes
    sweep = hidden / "refused"
    # The README's override, as typed on a command line; here only the worker declares it.
    proc = run_sweep([*EVAL_TINY, f"run.dir={sweep}", f"hydra.launcher.address={url}",
                      "hydra.launcher.entrypoint_resources={driver_slot:1}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "hydra.launcher.entrypoint_resources.driver_slot=1" in errors[0], proc.stderr[-3000:]
    assert f"node {head_id}" in errors[0] and "declares 0 driver_slot" in errors[0]


def test_a_run_written_on_a_workers_disk_is_reported_missing_not_succeeded(two_nodes, tmp_path):
    url, hidden, _, worker_id = two_nodes
    sweep = hidden / "lost"
    # driver_node=any and the README's pin to a resource only the worker declares: the
    # driver runs there, succeeds, and leaves its run on the worker's disk.
    proc = run_sweep([*EVAL_TINY, f"run.dir={sweep}", f"hydra.launcher.address={url}",
                      "hydra.launcher.entrypoint_resources={driver_slot:1}", "hydra.launcher.driver_node=any"],
                     cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"job 0 {RUN_MISSING}" in proc.stderr and f"node {worker_id} (" in proc.stderr
    assert "1 of 1 job(s) failed" in proc.stderr
    row = pd.read_parquet(sweep / "summary.parquet").iloc[0]
    assert row["status"] == RUN_MISSING and pd.isna(row["run_status"]) and pd.isna(row["pr_at_k"])
    assert row["driver_node"].startswith(f"node {worker_id} (") and "worker" in row["driver_node"]
    assert "does not exist" in row["run_problem"] and worker_id in row["error"]
    md = (sweep / "summary.md").read_text()
    assert f"{RUN_MISSING}: Ray says the job succeeded, but its run cannot be read" in md
    assert f"### job 0: {RUN_MISSING}" in md and f"node {worker_id}" in md
