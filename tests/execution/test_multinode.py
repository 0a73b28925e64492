"""Rollouts on a local multi-node cluster (one for the whole module): a head with no
slots and two worker nodes of 4 ``sandbox_slot`` each (tests/execution/slot_cluster.py).

Drivers run as subprocesses that join the cluster, as on a real one. Every measurement
comes from the stored results (node label, start and finish times) or from what Ray
reports; no wall-clock thresholds.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shared_runs import SSR_TINY
from slot_cluster import SlotCluster, node_prefix, peak_per_node, run_cli, run_driver, start_cli, start_driver

from milo_ray.testing.processes import last_json, next_json

# A cluster, containers or whole command-line runs: the slow suite (pytest -m slow; .ci/run runs it).
pytestmark = pytest.mark.slow

SLOTS = 4


@pytest.fixture(scope="module")
def cluster():
    c = SlotCluster(workers=2, slots=SLOTS, dashboard_port=33265)
    yield c
    c.shutdown()


def _summary(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout)


def _nodes(rows: list[dict]) -> set[str]:
    return {r["node"].split(":")[-1] for r in rows}


def test_two_drivers_on_one_cluster_never_exceed_a_nodes_slots_together(cluster):
    # Each run wants 3 workers of 2 slots: together 12 of the cluster's 8 slots, so
    # both run at once (neither can take every slot) and they compete for slots.
    args = ["--n", "24", "--seconds", "1.0", "--slots-per-worker", "2", "--max-workers", "3"]
    procs = [start_driver("sleep", cluster.address, *args, "--barrier", "--run-id", f"run{i}", "--seed", str(i))
             for i in (1, 2)]
    for p in procs:
        assert next_json(p.stdout) == {"ready": True}, p.stderr.read()[-3000:]
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(last_json(stdout))
    rows = [r for out in outs for r in out["rows"]]
    assert len(rows) == 48 and all(r["error_kind"] is None for r in rows)
    workers = {node_prefix(n) for n in cluster.workers}
    assert _nodes(rows) == workers  # both workers used, the slot-less head never
    # The two runs ran at the same time (so they competed for the same slots) ...
    first, second = ([r for r in out["rows"]] for out in outs)
    assert min(r["finished_at"] for r in first) > min(r["started_at"] for r in second)
    assert min(r["finished_at"] for r in second) > min(r["started_at"] for r in first)
    # ... and together never ran more rollouts on a node than it has slots.
    peaks = peak_per_node(rows)
    assert max(peaks.values()) <= SLOTS, peaks


def _change_cluster_mid_run(cluster: SlotCluster, change, *driver_args: str) -> dict:
    """Start a sleeping-rollout driver, wait until every slot runs a rollout, call
    ``change(first_report)`` (which changes the cluster), let the driver go on and return
    its summary."""
    proc = start_driver("sleep", cluster.address, *driver_args)
    try:
        first = next_json(proc.stdout)
        assert first["running"] == 2 * SLOTS, first
        change(first)
        stdout, stderr = proc.communicate(input="\n", timeout=240)  # go on
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    return last_json(stdout)


def test_a_node_added_mid_run_gets_rollouts_and_idle_workers_give_their_slots_back(cluster):
    # 64 rollouts of 2 s on 8 slots keep rollouts waiting for about 16 s: several rounds of
    # the monitor that reports the demand.
    joined = []

    def add_a_node(first: dict) -> None:
        # Rollouts are waiting: the pending workers' slots are the demand Ray reports to
        # the autoscaler (what makes it add a node).
        assert first["demand"] >= 2
        joined.append(cluster.add_worker())

    out = _change_cluster_mid_run(cluster, add_a_node, "--n", "64", "--seconds", "2.0", "--slots-per-worker", "2",
                                  "--idle", "1", "--announce", "8", "--wait-release", "--run-id", "joiner")
    joined = joined[0]
    rows = out["rows"]
    assert len(rows) == 64 and all(r["error_kind"] is None for r in rows)
    assert node_prefix(joined) in _nodes(rows), _nodes(rows)
    assert max(peak_per_node(rows).values()) <= SLOTS
    # Once the queue drained, every worker was released and every slot is free again.
    assert out["released_after"] is not None
    assert out["events"]["rollout_worker_released"] >= 3
    cluster.workers.append(joined)
    cluster.restore(2)


def test_rollouts_lost_with_a_node_are_retried_on_the_nodes_that_remain(cluster):
    doomed = cluster.workers[-1]
    # 48 rollouts of 2 s: 12 s on both workers, 24 s on one, so the queue outlasts a worker
    # actor that starts late on a loaded machine (every slot must be busy before the loss).
    out = _change_cluster_mid_run(cluster, lambda first: cluster.remove_worker(doomed), "--n", "48", "--seconds", "2.0",
                                  "--announce", str(2 * SLOTS), "--run-id", "doomed")
    rows = out["rows"]
    assert len(rows) == 48 and all(r["error_kind"] is None for r in rows)
    retried = [r for r in rows if r["attempts"] > 1]
    # Every rollout in flight on the lost node was recorded as lost and ran again elsewhere.
    assert out["events"]["rollout_worker_lost"] >= 1
    assert len(retried) >= 1 and out["events"]["rollout_retry"] == sum(r["attempts"] - 1 for r in rows)
    assert all(node_prefix(doomed) not in r["node"] for r in retried)
    cluster.restore(2)


def test_a_cluster_where_no_node_declares_the_slot_resource_is_refused_with_the_fix(cluster):
    out = _summary(run_driver("undeclared", cluster.address))
    assert out["error"].startswith("NoSlotsError: none of the 3 nodes"), out
    assert "execution.slot_resource" in out["error"] and "ray start --resources=" in out["error"]


# --- MILO and SSR from the command line -----------------------------------------------

MILO = ["method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1", "method.k_test=1",
        "method.max_rounds=1", "method.round_sync=true"]
# Rollouts take wall-clock time (the surrogate's scores), so a node can be lost while
# rollouts are in flight on it.
SLOW = ["executor._target_=slow_surrogate.SlowSurrogate", "+executor.delay_s=0.5"]
METHODS = {"milo": MILO, "ssr": SSR_TINY}


def _rollouts(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "rollouts").to_pylist()


def _events(run_dir: Path) -> Counter:
    return Counter(pq.read_table(run_dir / "events").column("kind").to_pylist())


def _mutation_nodes(cluster) -> set[str]:
    """Nodes MILO's mutation tasks ran on, as Ray's task records say."""
    from ray.util.state import list_tasks

    tasks = list_tasks(address=cluster.dashboard_url, filters=[("func_or_class_name", "=", "_streaming_body")],
                       detail=True, limit=1000, raise_on_missing_output=False)
    return {t.node_id[:8] for t in tasks if t.node_id}


@pytest.mark.slow  # four command-line runs on the cluster
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_run_from_the_command_line_uses_both_workers_and_losing_one_keeps_its_cache_keys(cluster, tmp_path, method):
    overrides = [*METHODS[method], *SLOW, "run.seed=5"]
    workers = {node_prefix(n) for n in cluster.workers}
    calm = tmp_path / "calm"
    proc = run_cli(cluster.address, calm, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rollouts(calm)
    assert _nodes(rows) == workers  # rollouts on both workers, none on the slot-less head
    assert max(peak_per_node(rows).values()) <= SLOTS
    if method == "milo":
        # Mutations are Ray tasks that reserve CPUs; the head declares none, so they run on the workers.
        ran_on = _mutation_nodes(cluster)
        assert ran_on and ran_on <= workers, (ran_on, workers)

    doomed = cluster.workers[-1]
    stormy = tmp_path / "stormy"
    live = start_cli(cluster.address, stormy, *overrides)
    try:
        # Lose the node once rollouts are being stored (each stored trace is a blob).
        while live.poll() is None and len(list((stormy / "blobs").glob("*/*"))) < 6:
            time.sleep(0.05)
        cluster.remove_worker(doomed)
        stdout, stderr = live.communicate(timeout=600)
    finally:
        if live.poll() is None:
            live.kill()
    assert live.returncode == 0, stderr[-3000:]
    lost = _rollouts(stormy)
    assert _events(stormy)["rollout_worker_lost"] >= 1  # the removal hit rollouts in flight
    assert {r["cache_key"] for r in lost} == {r["cache_key"] for r in rows}
    assert all(r["error_kind"] != "infra" for r in lost)
    assert node_prefix(doomed) in _nodes(lost)  # it ran rollouts before it went
    cluster.restore(2)
