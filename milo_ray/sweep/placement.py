"""Where a sweep's job drivers run: on the node whose disk holds the run directories.

A job's driver writes its run directory (the Parquet store) on the disk of the node it
runs on. Ray Jobs keep a driver on the head only when the job reserves no resources;
the launcher's drivers reserve ``entrypoint_num_cpus`` (and any ``entrypoint_resources``),
so Ray may place one on any node with those free, a worker included. Its run directory
then exists only on that worker's disk, which the autoscaler deletes with the node, and
the summary, written where the sweep's directory is, finds nothing.

So by default (``hydra.launcher.driver_node=auto``) every driver, and the summary job on
a cluster, is pinned to one node with the Jobs API's ``entrypoint_label_selector`` on the
label ``ray.io/node-id``, which Ray gives every node (a hard constraint: if that node is
gone the job fails rather than writes its run elsewhere). The node is the one whose disk
the sweep's directory is on: for a Ray on this machine, this machine's node (the head
among them when several nodes share the machine); for a cluster (``address`` given), the
head, where ``cluster.yaml`` keeps the runs and the sweep launcher itself runs as a job.
A node id rather than a custom resource, because it needs nothing declared on the
cluster and cannot match a second node. ``entrypoint_resources`` still apply on top; a
resource that node does not declare would leave the jobs pending forever, so it is
refused before anything is submitted.

A run directory that every node reaches (an object-store URI, :func:`run_dir_is_durable`;
or ``driver_node=any`` for a shared filesystem) needs no pin. Whatever the placement, the
summary checks that each job's run can be read (:mod:`.summary`).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any, Iterable

from milo_ray.config.errors import UserError

NODE_ID_LABEL = "ray.io/node-id"  # ray._raylet.RAY_NODE_ID_KEY: every node carries it
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def run_dir_is_durable(path: str) -> bool:
    """Whether a run directory outlives the node its driver runs on: an object-store URI
    (``s3://``, ``gs://``, ...), not a local path (``file://`` is a local path too)."""
    text = str(path)
    return bool(_URI.match(text)) and not text.lower().startswith("file://")


@dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    is_head: bool
    alive: bool
    resources: dict[str, float]

    def describe(self) -> str:
        role = "head" if self.is_head else "worker"
        return f"node {self.node_id} ({self.ip}, {role}{'' if self.alive else ', no longer alive'})"


def cluster_nodes(dashboard_url: str) -> list[Node]:
    """Every node the cluster knows (dead ones too, while Ray remembers them)."""
    from ray.util.state import list_nodes

    return [Node(node_id=n.node_id, ip=n.node_ip, is_head=bool(n.is_head_node), alive=n.state == "ALIVE",
                 resources=dict(n.resources_total or {}))
            for n in list_nodes(address=dashboard_url, detail=True, limit=10_000)]


def is_this_machine(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine (one can bind to it)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def durable_node(nodes: Iterable[Node], *, local: bool, is_local=is_this_machine) -> Node:
    """The node whose disk holds the sweep's directory: this machine's (the head first) for
    a Ray on this machine, else the head."""
    alive = [n for n in nodes if n.alive]
    if local:
        here = sorted((n for n in alive if is_local(n.ip)), key=lambda n: not n.is_head)
        if here:
            return here[0]
        raise UserError("hydra.launcher.driver_node=auto: no node of the Ray the sweep joined runs on this machine "
                        f"(nodes at {', '.join(sorted({n.ip for n in alive})) or 'none'}), so no driver could write "
                        "its run where this launcher reads it; give hydra.launcher.address (drivers go to the head) "
                        "or set hydra.launcher.driver_node=any when every node reaches run.dir")
    heads = [n for n in alive if n.is_head]
    if not heads:
        raise UserError("hydra.launcher.driver_node=auto: the cluster lists no alive head node to run the drivers "
                        "on; set hydra.launcher.driver_node=any when every node reaches run.dir")
    return heads[0]


def driver_selector(nodes: Iterable[Node], *, driver_node: str, run_dir: str, local: bool,
                    entrypoint_resources: dict[str, float] | None) -> tuple[dict[str, str] | None, Node | None]:
    """The ``entrypoint_label_selector`` of every driver (None: Ray places them) and the
    node it pins them to. Raises ``UserError`` when that node lacks a resource the drivers
    reserve."""
    if driver_node == "any" or run_dir_is_durable(run_dir):
        return None, None
    node = durable_node(list(nodes), local=local)
    for name, amount in (entrypoint_resources or {}).items():
        have = node.resources.get(name, 0.0)
        if amount > have:
            raise UserError(
                f"hydra.launcher.entrypoint_resources.{name}={amount:g}: the drivers run on {node.describe()}, "
                f"where the run directories are, and it declares {have:g} {name}, so no job could start; "
                f"declare {name} on that node (ray start --resources), drop the key, or set "
                "hydra.launcher.driver_node=any if every node reaches run.dir")
    return {NODE_ID_LABEL: node.node_id}, node


def describe_node(node_id: str | None, nodes: Iterable[Node]) -> str | None:
    """``node <id> (<ip>, head|worker[, no longer alive])``, or the id alone if Ray has forgotten it."""
    if not node_id:
        return None
    for n in nodes:
        if n.node_id == node_id:
            return n.describe()
    return f"node {node_id} (unknown to the cluster now)"


def nodes_or_empty(dashboard_url: str) -> list[Any]:
    """:func:`cluster_nodes`, or [] when the state API does not answer (names are a convenience)."""
    try:
        return cluster_nodes(dashboard_url)
    except Exception:  # the summary stands with bare node ids
        return []
