"""One Ray head with a dashboard for the sweep tests (started the way the launcher starts
its own), and a helper that runs a sweep through the entry point in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Tiny offline runs: the seed harness `minimal` evaluated once on the 20 validation tasks
# of surrogate_tb21, each rollout sleeping 0.2 s (so concurrency shows in the timestamps).
EVAL_TINY = ["method=eval", "method.k=1", "method.split=val", "method.names=[minimal]", "run.progress=false",
             "run.report=false", "executor._target_=sweep_fakes.SlowSurrogateExecutor", "+executor.sleep_s=0.2"]


def sweep_env() -> dict[str, str]:
    path = [str(REPO), str(HERE), *[p for p in [os.environ.get("PYTHONPATH")] if p]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def run_sweep(args: list[str], *, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m milo_ray.run -m hydra/launcher=ray_jobs ARGS`` in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "milo_ray.run", "-m", "hydra/launcher=ray_jobs", *args], cwd=cwd,
                          env=sweep_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def sweep_ray(tmp_path_factory):
    """A private Ray head with a dashboard on free ports (the launcher's own start_head),
    whose processes see the test fakes; yields its dashboard URL."""
    from milo_ray.sweep.local_ray import start_head

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = sweep_env()["PYTHONPATH"]  # the head's processes inherit it
    head = start_head(num_cpus=2, log_path=tmp_path_factory.mktemp("sweep-ray") / "head.log")
    try:
        yield head.dashboard_url
    finally:
        head.stop()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_hidden_worker(gcs_address: str, hidden: Path, *, num_cpus: int, resources: dict,
                        log_path: Path) -> subprocess.Popen:
    """A worker node (``ray start --block``) in a mount namespace of its own in which
    ``hidden`` is an empty tmpfs: what a driver there writes under ``hidden`` exists on that
    node's "disk" only, as on a cluster without a shared disk. Ends with its process group."""
    import json
    import shlex

    # A worker-port range of its own (other Ray instances run on this machine), and agent
    # ports outside it.
    low = 47000 + 40 * (os.getpid() % 50)
    agent = [p for p in _free_ports(12) if not low <= p <= low + 40][:6]
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={gcs_address}", f"--num-cpus={num_cpus}",
           f"--resources={json.dumps(resources)}", "--object-store-memory=100000000", "--block",
           "--disable-usage-stats", f"--node-manager-port={agent[0]}", f"--object-manager-port={agent[1]}",
           f"--metrics-export-port={agent[2]}", f"--dashboard-agent-listen-port={agent[3]}",
           f"--dashboard-agent-grpc-port={agent[4]}", f"--runtime-env-agent-port={agent[5]}",
           f"--min-worker-port={low}", f"--max-worker-port={low + 40}"]
    script = f"mount -t tmpfs none {shlex.quote(str(hidden))} && exec {shlex.join(cmd)}"
    with open(log_path, "ab") as out:
        return subprocess.Popen(["unshare", "-m", "sh", "-c", script], env=sweep_env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def stop_process_group(proc: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
