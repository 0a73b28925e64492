"""The pool's slot plan (no Ray): how big a worker is and what it claims, per cluster."""

from __future__ import annotations

import pytest

from milo_ray.execution.dispatch import Dispatch
from milo_ray.execution.pool import NoSlotsError, plan_slots


def _node(node_id: str, slots: float | None = None, alive: bool = True) -> dict:
    resources = {"CPU": 1.0} if slots is None else {"CPU": 1.0, "sandbox_slot": slots}
    return {"NodeID": node_id, "Alive": alive, "Resources": resources}


def _plan(nodes, *, per_node=8, per_worker=None, autoscaling=False):
    return plan_slots(nodes, slot_resource="sandbox_slot", slots_per_node=per_node, slots_per_worker=per_worker,
                      autoscaling=autoscaling)


def test_workers_claim_their_slots_and_fit_the_smallest_slotted_node():
    head, a, b = _node("head"), _node("a", 6), _node("b", 4)
    plan = _plan([head, a, b], per_worker=5)
    assert (plan.worker_slots, plan.slot_resource, plan.pin_node) == (4, "sandbox_slot", None)
    assert _plan([head, a], per_worker=None, per_node=8).worker_slots == 6  # slots_per_node, capped by the node
    assert _plan([head, a, b, _node("dead", 1, alive=False)], per_worker=2).worker_slots == 2


def test_an_autoscaling_cluster_without_slotted_nodes_yet_gets_the_demand():
    plan = _plan([_node("head")], per_worker=4, autoscaling=True)
    assert (plan.worker_slots, plan.slot_resource, plan.pin_node) == (4, "sandbox_slot", None)


def test_a_one_node_instance_without_slots_runs_slots_per_node_on_a_pinned_worker():
    plan = _plan([_node("only")], per_node=3, per_worker=2)
    assert (plan.worker_slots, plan.slot_resource, plan.pin_node, plan.max_workers) == (3, None, "only", 1)


def test_a_cluster_of_nodes_without_slots_and_no_autoscaler_is_refused_with_the_fix():
    with pytest.raises(NoSlotsError, match=r"none of the 2 nodes .* 'sandbox_slot' \(execution.slot_resource\)"):
        _plan([_node("head"), _node("worker")])


def test_runnable_counts_the_queue_each_group_limit_still_lets_start():
    d: Dispatch[int] = Dispatch(limits={"capped": 2})
    for i in range(5):
        d.submit("capped", i)
        d.submit("free", i)
    assert d.runnable() == 2 + 5
    d.pick({"w0": 1})  # one item in flight (the round-robin serves "capped" first)
    assert d.runnable() == 1 + 5
