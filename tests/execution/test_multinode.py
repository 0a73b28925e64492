"""Rollouts on a local multi-node cluster (one for the whole module): a head with no
slots and two worker nodes of 4 ``sandbox_slot`` each (tests/execution/slot_cluster.py).

Drivers run as subprocesses that join the cluster, as on a real one. Every measurement
comes from the stored results (node label, start and finish times) or from what Ray
reports; no wall-clock thresholds.
"""

from __future__ import annotations

import json

import pytest

from slot_cluster import SlotCluster, node_prefix, peak_per_node, run_driver, start_driver

SLOTS = 4


@pytest.fixture(scope="module")
def cluster():
    c = SlotCluster(workers=2, slots=SLOTS, dashboard_port=33265)
    yield c
    c.shutdown()


def _summary(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _nodes(rows: list[dict]) -> set[str]:
    return {r["node"].split(":")[-1] for r in rows}


def test_two_drivers_on_one_cluster_never_exceed_a_nodes_slots_together(cluster):
    # Each run wants 3 workers of 2 slots: together 12 of the cluster's 8 slots, so
    # both run at once (neither can take every slot) and they compete for slots.
    args = ["--n", "24", "--seconds", "1.0", "--slots-per-worker", "2", "--max-workers", "3"]
    procs = [start_driver("sleep", cluster.address, *args, "--barrier", "--run-id", f"run{i}", "--seed", str(i))
             for i in (1, 2)]
    for p in procs:
        assert json.loads(p.stdout.readline()) == {"ready": True}, p.stderr.read()[-3000:]
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
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


def test_a_node_added_mid_run_gets_rollouts_and_idle_workers_give_their_slots_back(cluster):
    proc = start_driver("sleep", cluster.address, "--n", "64", "--seconds", "1.0", "--slots-per-worker", "2",
                        "--idle", "1", "--announce", "8", "--wait-release", "--run-id", "joiner")
    try:
        first = json.loads(proc.stdout.readline())
        assert first["running"] == 2 * SLOTS
        # Rollouts are waiting: the pending workers' slots are the demand Ray reports to
        # the autoscaler (what makes it add a node).
        assert first["demand"] >= 2
        joined = cluster.add_worker()
        stdout, stderr = proc.communicate(input="\n", timeout=240)  # go on
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    rows = out["rows"]
    assert len(rows) == 64 and all(r["error_kind"] is None for r in rows)
    assert node_prefix(joined) in _nodes(rows), _nodes(rows)
    assert max(peak_per_node(rows).values()) <= SLOTS
    # Once the queue drained, every worker was released and every slot is free again.
    assert out["released_after"] is not None
    assert out["events"]["rollout_worker_released"] >= 3
    cluster.workers.append(joined)
    cluster.restore(2)


def test_a_cluster_where_no_node_declares_the_slot_resource_is_refused_with_the_fix(cluster):
    out = _summary(run_driver("undeclared", cluster.address))
    assert out["error"].startswith("NoSlotsError: none of the 3 nodes"), out
    assert "execution.slot_resource" in out["error"] and "ray start --resources=" in out["error"]
