"""A local Ray cluster whose worker nodes cannot see the driver's files.

The head runs normally, with no CPUs and no sandbox slots, so every rollout and every
mutation runs on a worker. Each worker node runs ``ray start`` in a mount namespace of its
own (``unshare -m``) in which ``hidden`` -- where the tests keep their run directories and
task suites -- is an empty tmpfs: a worker that reads a driver path finds nothing there,
exactly as on a cluster without a shared disk. Each worker's cache of shipped files is
inside its own tmpfs, so it is node-local for real. Ray's temp dir stays visible to all
(the nodes of one machine share its sockets).

Token authentication is on, with a token file of the cluster's own
(``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``); :attr:`HiddenDiskCluster.env` is the
environment a driver needs to join.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from milo_ray.testing.processes import last_json

REPO = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (held open together: a port closed and asked for again
    may come back)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_AGENT_FLAGS = ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port")
_WORKER_PORTS = 40  # per node: its worker processes' range


def _node_ports(ports: list[int], worker_range: tuple[int, int]) -> list[str]:
    """Ports a node's agents would otherwise take from Ray's fixed defaults (several
    nodes on one machine, and other Ray instances on it, must not collide)."""
    return [f"{flag}={port}" for flag, port in zip(_AGENT_FLAGS, ports)] + [
        f"--min-worker-port={worker_range[0]}", f"--max-worker-port={worker_range[1]}"]


def _hidden(cmd: list[str], hidden: Path) -> list[str]:
    """``cmd`` in a mount namespace of its own in which ``hidden`` is an empty tmpfs."""
    script = f"mount -t tmpfs none {shlex.quote(str(hidden))} && exec {' '.join(shlex.quote(a) for a in cmd)}"
    return ["unshare", "-m", "sh", "-c", script]


@dataclass
class HiddenDiskCluster:
    """``hidden``: the directory no node sees (the head neither, with ``hide_head``: then
    only driver processes can read a file under it). ``ray_tmp``: Ray's temp dir (short:
    socket paths are limited)."""

    hidden: Path
    ray_tmp: Path
    workers: int = 2
    slots: int = 2
    worker_cpus: int = 2
    hide_head: bool = True
    worker_port_base: int = 35000
    head_port: int = 0
    client_port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.head_port}"

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    def cache_of(self, i: int) -> Path:
        """Worker ``i``'s cache of shipped files (inside its own tmpfs)."""
        return self.hidden / f"node-cache-{i}"

    def start(self) -> "HiddenDiskCluster":
        self.hidden.mkdir(parents=True, exist_ok=True)
        self.ray_tmp.mkdir(parents=True, exist_ok=True)
        token = self.ray_tmp / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update({"RAY_TMPDIR": str(self.ray_tmp), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                         "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
                         # A loaded machine starts a node's Python agents slowly; the raylet
                         # must wait for them rather than abort.
                         "RAY_agent_register_timeout_ms": "180000"})
        ports = free_ports(2 + len(_AGENT_FLAGS) * (1 + self.workers))
        self.head_port, self.client_port = ports[:2]
        per_node = [ports[2 + k * len(_AGENT_FLAGS):2 + (k + 1) * len(_AGENT_FLAGS)] for k in range(1 + self.workers)]
        ranges = [(self.worker_port_base + k * _WORKER_PORTS, self.worker_port_base + (k + 1) * _WORKER_PORTS - 1)
                  for k in range(1 + self.workers)]
        common = ["--object-store-memory=200000000", "--block"]
        head = ["ray", "start", "--head", f"--port={self.head_port}", f"--ray-client-server-port={self.client_port}",
                "--num-cpus=0", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self.ray_tmp}",
                *_node_ports(per_node[0], ranges[0]), *common]
        # Each node lives as long as its `ray start --block`, in a session of its own.
        self._spawn(_hidden(head, self.hidden) if self.hide_head else head, "head", self.env)
        self.wait_for(1)
        for i in range(self.workers):
            start = ["ray", "start", f"--address={self.address}", f"--num-cpus={self.worker_cpus}",
                     f"--resources={json.dumps({'sandbox_slot': self.slots})}",
                     *_node_ports(per_node[1 + i], ranges[1 + i]), *common]
            # One at a time: nodes of one machine name their sockets and logs in the
            # shared session directory by picking the next free index, which races.
            # A node whose agents start too slowly on a loaded machine aborts: start
            # it again.
            for attempt in range(3):
                self._spawn(_hidden(start, self.hidden), f"worker-{i}",
                            {**self.env, "MILO_RAY_SHIP_CACHE": str(self.cache_of(i))})
                if self._joined(2 + i):
                    break
                self._end(self._procs.pop())
            else:
                self._fail(f"worker node {i} did not start in 3 attempts")
        return self

    def _spawn(self, cmd: list[str], name: str, env: dict[str, str]) -> None:
        log = open(self.ray_tmp / f"{name}.log", "wb")
        # cwd: Ray's temp dir, so nothing of the caller's directory shadows a module of a
        # node's Python processes.
        self._procs.append(subprocess.Popen(cmd, env=env, cwd=self.ray_tmp, start_new_session=True, stdout=log,
                                            stderr=subprocess.STDOUT))

    def view(self, i: int, path: Path) -> Path:
        """``path`` as node ``i``'s processes see it (0: the head, 1..: the workers),
        read through /proc from outside its mount namespace."""
        return Path(f"/proc/{self._procs[i].pid}/root") / Path(path).relative_to("/")

    def query(self, code: str, timeout_s: float = 120.0) -> object:
        """Run ``code`` (defining ``out``) in a driver process joined to the cluster."""
        prog = f"import json, ray\nray.init(address={self.address!r}, log_to_driver=False)\n{code}\nprint(json.dumps(out))"
        proc = subprocess.run([sys.executable, "-c", prog], env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        return last_json(proc.stdout)

    def nodes(self, timeout_s: float = 120.0) -> list[dict]:
        return self.query(timeout_s=timeout_s, code="out = [{'id': n['NodeID'], 'alive': n['Alive'], 'resources': n['Resources']} "
                          "for n in ray.nodes() if n['Alive']]")

    def worker_ids(self) -> set[str]:
        return {n["id"] for n in self.nodes() if n["resources"].get("sandbox_slot", 0) > 0}

    def _joined(self, count: int, timeout_s: float = 180.0) -> bool:
        """Whether the cluster reached ``count`` nodes while every node process lives."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self._procs):
                return False
            try:
                if len(self.nodes(timeout_s=30)) >= count:
                    return True
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            time.sleep(1.0)
        return False

    def wait_for(self, count: int) -> None:
        if not self._joined(count):
            self._fail(f"the cluster did not reach {count} nodes")

    def _fail(self, why: str) -> None:
        logs = "".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}" for f in sorted(self.ray_tmp.glob("*.log")))
        self.stop()
        raise RuntimeError(f"{why} (is `unshare -m` allowed here?):\n{logs}")

    @staticmethod
    def _end(p: subprocess.Popen) -> None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """End every node this object started: each ``ray start --block`` runs in a
        session of its own, so its process group is exactly that node's processes."""
        while self._procs:  # workers first, the head last
            self._end(self._procs.pop())
