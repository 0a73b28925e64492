"""The Ray on this machine that a sweep's jobs run on when no dashboard address is given.

Either one started with ``ray start`` (joined when ``execution.join_running``, as a run
joins it) or a head this launcher starts and stops: ``ray start --head --block`` in a
child process, every port chosen free (GCS, dashboard, client server, the dashboard
agent's HTTP and gRPC ports, metrics, runtime-env agent, node and object managers), so
it never collides with another Ray on the machine. ``--block`` ties the head's processes
to that child: terminating it stops exactly what was started. ``ray.init()`` would be
simpler but cannot move the dashboard agent's HTTP port (52365), through which every
job is started.

Token auth: a head started here has Ray's token auth on (as a new local ``ray.init()``
has), with the token Ray keeps in ``~/.ray/auth_token`` (created if missing) unless
``RAY_AUTH_MODE`` says otherwise; the jobs' drivers inherit the mode from the head and
read the same token file. Joining a running Ray or a cluster sends a token when one is
configured (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from milo_ray.execution.cluster import join, quiet_token_auth_notice

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 180.0  # a loaded 2-core machine takes tens of seconds to bring a head up
_STOP_TIMEOUT_S = 60.0


@dataclass
class LocalRay:
    """A Ray on this machine with a dashboard. ``stop()`` stops it only if it was started here."""

    dashboard_url: str  # http://127.0.0.1:PORT
    started_here: bool
    process: subprocess.Popen | None = None
    _address_file: Path | None = None
    _previous_address: str | None = None

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the head's --block handler stops its processes
            try:
                self.process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        _restore_address_file(self._address_file, self._previous_address)


def _free_ports(n: int) -> list[int]:
    """n distinct ports free right now (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _address_file() -> Path:
    from ray._private.utils import get_ray_address_file

    return Path(get_ray_address_file(None))


def _restore_address_file(path: Path | None, previous: str | None) -> None:
    # `ray start` records its address for later drivers to join; once the head is gone that
    # record would send them to a dead address, so put back what was there before.
    if path is None:
        return
    try:
        if previous is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(previous)
    except OSError as exc:  # pragma: no cover - a temp dir that vanished
        log.warning("could not restore %s: %s", path, exc)


def _enable_token_auth_for_new_head() -> None:
    from ray._private.authentication.authentication_token_setup import (enable_token_auth_by_default,
                                                                         ensure_token_if_auth_enabled)

    quiet_token_auth_notice()
    if enable_token_auth_by_default():  # respects RAY_AUTH_MODE when set
        ensure_token_if_auth_enabled(None, create_token_if_missing=True)


def use_configured_token() -> None:
    """Send a token to the dashboard when one is configured (a token-auth cluster needs it;
    one without auth ignores it)."""
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _dashboard_of(address: str) -> str:
    """The dashboard URL of a running Ray (joined briefly as a driver to ask)."""
    import ray

    use_configured_token()
    join(address)
    try:
        url = ray._private.worker.get_dashboard_url()
    finally:
        ray.shutdown()
    if not url:
        raise RuntimeError(f"the Ray at {address} runs no dashboard, which Ray Jobs need; start it with "
                           "--include-dashboard=true, or set execution.join_running=false to have the launcher "
                           "start its own")
    return url if url.startswith("http") else f"http://{url}"


def start_head(*, num_cpus: int | None, log_path: Path) -> LocalRay:
    """Start a private head with a dashboard on free ports; returns once the dashboard answers."""
    _enable_token_auth_for_new_head()
    (gcs, dashboard, client, agent_http, agent_grpc, metrics, runtime_env, node_manager,
     object_manager) = _free_ports(9)
    address_file = _address_file()
    previous = address_file.read_text() if address_file.is_file() else None
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--disable-usage-stats",
           f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
           f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent_http}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
           f"--runtime-env-agent-port={runtime_env}", f"--node-manager-port={node_manager}",
           f"--object-manager-port={object_manager}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    head = LocalRay(dashboard_url=f"http://127.0.0.1:{dashboard}", started_here=True, process=proc,
                    _address_file=address_file, _previous_address=previous)
    try:
        _wait_for_dashboard(head, log_path)
    except BaseException:
        head.stop()
        raise
    log.debug("started a Ray head: dashboard %s (log %s)", head.dashboard_url, log_path)
    return head


def _wait_for_dashboard(head: LocalRay, log_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        if head.process is not None and head.process.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"the sweep's Ray head exited with code {head.process.returncode} while starting; "
                               f"last lines of {log_path}: {' | '.join(tail)}")
        try:
            JobSubmissionClient(head.dashboard_url).list_jobs()
            return
        except Exception as exc:  # not up yet: connection refused, 5xx while modules load
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sweep's Ray head did not answer at {head.dashboard_url} within "
                                   f"{_START_TIMEOUT_S:.0f} s ({type(exc).__name__}: {exc}); see {log_path}") from None
        time.sleep(1.0)


def local_ray(*, join_running: bool, num_cpus: int | None, log_path: Path) -> LocalRay:
    """A `ray start` instance on this machine when ``join_running`` and one is recorded,
    else a head started here."""
    if join_running:
        from ray._private.utils import read_ray_address  # where `ray start` records its address

        address = read_ray_address()
        if address:
            url = _dashboard_of(address)
            if num_cpus is not None:
                log.info("execution.num_cpus=%s not applied: joining the running Ray at %s", num_cpus, address)
            return LocalRay(dashboard_url=url, started_here=False)
    return start_head(num_cpus=num_cpus, log_path=log_path)
