"""Where a sweep's drivers are placed: the node whose disk holds the run directories."""

from __future__ import annotations

import pytest

from milo_ray.config.errors import UserError
from milo_ray.sweep.placement import NODE_ID_LABEL, Node, describe_node, driver_selector, durable_node, \
    run_dir_is_durable

HEAD = Node("head-id", "10.0.0.1", is_head=True, alive=True, resources={"CPU": 2.0, "driver_slot": 8.0})
WORKER = Node("worker-id", "10.0.0.2", is_head=False, alive=True, resources={"CPU": 16.0, "sandbox_slot": 16.0})
GONE = Node("gone-id", "10.0.0.3", is_head=False, alive=False, resources={"CPU": 16.0})


def _local(ip: str) -> bool:
    return ip == "10.0.0.2"  # this machine is the worker's


def test_drivers_of_a_cluster_sweep_are_pinned_to_the_head():
    selector, node = driver_selector([WORKER, HEAD], driver_node="auto", run_dir="/home/u/runs/sweep", local=False,
                                     entrypoint_resources={"driver_slot": 1.0})
    assert selector == {NODE_ID_LABEL: "head-id"} and node is HEAD


def test_drivers_on_a_local_ray_are_pinned_to_this_machines_node():
    assert durable_node([HEAD, WORKER], local=True, is_local=_local) is WORKER
    # Several nodes on this machine (one disk): the head among them.
    assert durable_node([WORKER, HEAD], local=True, is_local=lambda ip: True) is HEAD


def test_a_dead_node_is_never_chosen():
    with pytest.raises(UserError, match="hydra.launcher.driver_node"):
        durable_node([GONE], local=True, is_local=lambda ip: True)
    with pytest.raises(UserError, match="no alive head"):
        durable_node([GONE, WORKER], local=False)


def test_a_resource_the_drivers_node_lacks_is_refused_naming_the_key():
    with pytest.raises(UserError, match=r"hydra.launcher.entrypoint_resources.gpu_box=1: the drivers run on node "
                                        r"head-id \(10.0.0.1, head\).*declares 0 gpu_box"):
        driver_selector([HEAD, WORKER], driver_node="auto", run_dir="/runs/s", local=False,
                        entrypoint_resources={"gpu_box": 1.0})


@pytest.mark.parametrize("driver_node, run_dir", [("any", "/runs/s"), ("auto", "s3://bucket/runs/s")])
def test_drivers_whose_runs_every_node_reaches_are_not_pinned(driver_node, run_dir):
    # Not even asked for the cluster's nodes: nothing to pin to.
    assert driver_selector([], driver_node=driver_node, run_dir=run_dir, local=False,
                           entrypoint_resources={"gpu_box": 1.0}) == (None, None)


@pytest.mark.parametrize("path, durable", [("s3://bucket/runs", True), ("gs://b/r", True), ("/home/u/runs", False),
                                           ("runs/sweep", False), ("file:///home/u/runs", False)])
def test_only_object_store_uris_are_durable_run_dirs(path, durable):
    assert run_dir_is_durable(path) is durable


def test_a_driver_node_is_described_by_address_and_role():
    assert describe_node("gone-id", [HEAD, GONE]) == "node gone-id (10.0.0.3, worker, no longer alive)"
    assert describe_node("other", [HEAD]) == "node other (unknown to the cluster now)"
    assert describe_node(None, [HEAD]) is None
