"""A small local multi-node Ray cluster for the multi-node tests and the cluster
benchmark: a head that declares no sandbox slots and no CPUs (it runs drivers only,
Ray's recommended head setup), and worker nodes that each declare ``sandbox_slot``.

The test process owns the nodes (``ray.cluster_utils.Cluster``) but never connects to
them: drivers run as subprocesses that join ``address``, as `python -m milo_ray.run
execution.address=...` does on a real cluster. Workers that Ray starts on the nodes
inherit this process's environment, so the test executors in this directory are on
their path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
_OBJECT_STORE = 80 * 2**20  # bytes per node: the tests ship a few small objects


def driver_env() -> dict[str, str]:
    """The environment of a driver subprocess (and of the nodes' workers)."""
    path = [str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "HF_HUB_OFFLINE": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True", "RAY_DEDUP_LOGS": "0"}


class SlotCluster:
    """``workers`` nodes of ``slots`` sandbox slots and ``cpus`` CPUs each, plus the head."""

    def __init__(self, workers: int = 2, slots: int = 4, cpus: int = 1, *, dashboard_port: int | None = None) -> None:
        from ray.cluster_utils import Cluster

        os.environ.update({k: v for k, v in driver_env().items() if k in ("PYTHONPATH", "RAY_DEDUP_LOGS")})
        head = {"num_cpus": 0, "object_store_memory": _OBJECT_STORE, "include_dashboard": dashboard_port is not None}
        if dashboard_port is not None:
            head["dashboard_port"] = dashboard_port
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.head_id = self.cluster.head_node.node_id
        self.slots, self.cpus = slots, cpus
        self.workers = [self.add_worker() for _ in range(workers)]
        self.cluster.wait_for_nodes()
        self.dashboard_url = f"http://127.0.0.1:{dashboard_port}" if dashboard_port is not None else None

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_worker(self, slots: int | None = None) -> object:
        node = self.cluster.add_node(num_cpus=self.cpus, resources={"sandbox_slot": slots or self.slots},
                                     object_store_memory=_OBJECT_STORE)
        return node

    def remove_worker(self, node: object) -> None:
        self.cluster.remove_node(node)
        if node in self.workers:
            self.workers.remove(node)

    def restore(self, n: int) -> None:
        """Back to ``n`` worker nodes (after a test removed or added some)."""
        while len(self.workers) > n:
            self.remove_worker(self.workers[-1])
        while len(self.workers) < n:
            self.workers.append(self.add_worker())
        self.cluster.wait_for_nodes()
        self.wait_for_free_slots(n * self.slots)

    def wait_for_free_slots(self, expected: float, timeout: float = 60) -> None:
        """Wait until the cluster holds ``expected`` sandbox slots and all are free: the
        actors of a driver that just exited give theirs back asynchronously, and the next
        test must start on a settled cluster."""
        state = self.cluster.global_state
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if state.cluster_resources().get("sandbox_slot") == expected == state.available_resources().get("sandbox_slot"):
                return
            time.sleep(0.2)
        raise TimeoutError(f"the cluster did not settle at {expected} free sandbox slots: "
                           f"{state.available_resources()} of {state.cluster_resources()}")

    def shutdown(self) -> None:
        self.cluster.shutdown()


def node_prefix(node: object) -> str:
    """The part of a node's id that results carry in their ``node`` label (``ip:prefix``)."""
    return node.node_id[:8]


def run_driver(mode: str, address: str, *args: str, timeout: float = 240,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``multinode_driver.py MODE ADDRESS ARGS...`` to completion."""
    cmd = [sys.executable, str(HERE / "multinode_driver.py"), mode, address, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env or driver_env(), timeout=timeout,
                          cwd=str(ROOT))


def start_driver(mode: str, address: str, *args: str) -> subprocess.Popen:
    """Start ``multinode_driver.py`` without waiting (it prints progress lines on stdout)."""
    cmd = [sys.executable, str(HERE / "multinode_driver.py"), mode, address, *args]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=driver_env(),
                            cwd=str(ROOT))


def run_cli(address: str, run_dir: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m milo_ray.run`` joined to the cluster."""
    cmd = [sys.executable, "-m", "milo_ray.run", f"execution.address={address}", f"run.dir={run_dir}",
           "run.progress=false", "run.report=false", *overrides]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(cmd, capture_output=True, text=True, env=driver_env(), timeout=timeout, cwd=str(run_dir.parent))


def start_cli(address: str, run_dir: Path, *overrides: str) -> subprocess.Popen:
    """:func:`run_cli` without waiting."""
    cmd = [sys.executable, "-m", "milo_ray.run", f"execution.address={address}", f"run.dir={run_dir}",
           "run.progress=false", "run.report=false", *overrides]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=driver_env(),
                            cwd=str(run_dir.parent))


def peak_per_node(rows: list[dict]) -> dict[str, int]:
    """The most rollouts that ran at once on each node, from their stored intervals."""
    edges: dict[str, list[tuple[float, int]]] = {}
    for r in rows:
        # An end sorts before a start at the same instant: back-to-back is not overlap.
        edges.setdefault(r["node"], []).extend([(r["started_at"], 1), (r["finished_at"], -1)])
    peaks = {}
    for node, points in edges.items():
        level = peak = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):
            level += step
            peak = max(peak, level)
        peaks[node] = peak
    return peaks
