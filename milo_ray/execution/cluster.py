"""Connecting the driver to Ray: the one place that calls ``ray.init``.

Runs connect per their ``execution`` config (:func:`connect`: start a right-sized local
instance, join one already running on this machine so Hydra multirun jobs share it, or
join a cluster). Tests and scripts start a private local instance with
:func:`start_local` or join a given address with :func:`join`; code that may run before
anyone connected (a scheduler or a method used directly) calls
:func:`ensure_connected`. Every start goes through here so that each one is private
when it should be (``address="local"``), quiet, and keeps Ray's token auth.

Keys: Ray starts its processes (GCS, raylet, the dashboard and its agent, the runtime-env
agent, and through the raylet every worker) with a copy of the driver's environment, where a
provider's key usually is. Every start and join therefore runs with the credential variables
(:func:`milo_ray.redaction.secret_env_names`) taken out of this process's environment
(:func:`keys_left_out`), so no Ray process ever holds one; the keys reach the rollout
workers' gateways and the mutation tasks as arguments of actor calls and tasks instead. No
``runtime_env`` is ever passed, so nothing of the driver's environment travels with a job to
a cluster either."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from milo_ray import redaction

log = logging.getLogger(__name__)

SLOT_RESOURCE = "sandbox_slot"
# ray._private.ray_constants.DEBUG_AUTOSCALING_STATUS: where the autoscaler reports.
_AUTOSCALING_STATUS_KEY = "__autoscaling_status"
# ray.autoscaler._private.util.format_readonly_node_type: a node of a cluster no autoscaler manages.
_READONLY_NODE_TYPE = re.compile(r"node_[0-9a-f]+")


@dataclass(frozen=True)
class ClusterInfo:
    address: str
    started_here: bool
    nodes: int
    cpus: float
    slots: float


def _running_local_address() -> str | None:
    """The address of a Ray instance started on this machine with ``ray start``, if any.

    Only ``ray start`` records its address (in Ray's temp dir); instances that another
    driver started privately with ``ray.init()`` die with that driver, so they are never
    joined."""
    try:
        from ray._private.utils import get_ray_address_file, read_ray_address  # noqa: PLC0415

        address = read_ray_address() or None
    except Exception:  # pragma: no cover - private API moved: start a private instance
        return None
    if address is not None and not _answers(address):
        # A `ray start` head that was killed leaves its address file behind; joining it
        # would wait on a GCS that never answers.
        log.warning("the Ray address %s recorded in %s does not answer (a `ray start` head that died?); "
                    "starting a private Ray instance instead", address, get_ray_address_file(None))
        return None
    return address


def _answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


class _DropDefaultTokenAuthNotice(logging.Filter):
    """Drops Ray's notice that a new local instance enabled token authentication.

    Token auth stays on (Ray's default for a new local instance); only the warning that
    it did so, printed at the top of every run, goes.  Other auth messages pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


def quiet_token_auth_notice() -> None:
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropDefaultTokenAuthNotice) for f in logger.filters):
        logger.addFilter(_DropDefaultTokenAuthNotice())


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def keys_left_out() -> Iterator[list[str]]:
    """This process's environment without its credential variables for the duration of the
    block (whose processes Ray starts inherit it), restored after; yields the names left
    out. The driver reads its keys before and after (preflight, the secrets it hands to the
    workers), never while Ray starts."""
    with _ENV_LOCK:
        removed = {name: os.environ.pop(name) for name in redaction.secret_env_names(os.environ)}
        try:
            yield sorted(removed)
        finally:
            os.environ.update(removed)


def _init(**kwargs: Any) -> None:
    """``ray.init`` with the keys left out of what Ray's processes inherit (see the module
    docstring); never with a ``runtime_env``, which would ship the driver's settings."""
    import ray  # noqa: PLC0415 - keep `import milo_ray.execution` light

    if "runtime_env" in kwargs:
        raise ValueError("keys and the driver's environment never travel in a runtime_env")
    with keys_left_out() as names:
        if names:
            log.info("starting Ray without the credential variables %s in its processes' environment "
                     "(the gateways get their keys as call arguments)", ", ".join(names))
        ray.init(**kwargs)


def start_local(
    *, num_cpus: int | None = None, slots: int | None = 8, dashboard: bool = False, configure_logging: bool = True,
    slot_resource: str = SLOT_RESOURCE,
) -> ClusterInfo:
    """Start a private Ray instance in this process: never one that `ray start` left
    running here. ``slots``: how many of ``slot_resource`` (``sandbox_slot``) the node
    declares, i.e. the rollouts it runs at once (None: declare none).
    ``configure_logging=False`` leaves the logging setup to the caller (pytest)."""
    quiet_token_auth_notice()
    _init(
        # "local" always starts a new instance: without it Ray would join one that
        # `ray start` left running here and refuse num_cpus for it.
        address="local",
        num_cpus=num_cpus,
        include_dashboard=bool(dashboard),
        resources={} if slots is None else {slot_resource: float(slots)},
        **_options(configure_logging),
    )
    return _info(started_here=True)


def join(address: str, *, configure_logging: bool = True) -> ClusterInfo:
    """Join the Ray instance or cluster at ``address`` (``auto``, ``host:port``, ``ray://...``)."""
    import ray  # noqa: PLC0415

    log.info("joining Ray at %s", address)
    for attempt in range(1, _CLIENT_START_ATTEMPTS + 1):
        try:
            _init(address=address, **_options(configure_logging))
            break
        except ConnectionAbortedError as e:
            # A Ray Client server is a process the cluster's proxy starts per driver; on a
            # loaded head it can die while starting ("Starting Ray client server failed"),
            # a transient failure of the cluster, not of this run: ask for another one.
            if not address.startswith("ray://") or attempt == _CLIENT_START_ATTEMPTS:
                raise
            log.warning("Ray Client server did not start (attempt %d of %d): %s; trying again", attempt,
                        _CLIENT_START_ATTEMPTS, str(e).strip().splitlines()[-1] if str(e).strip() else e)
            ray.shutdown()
    return _info(started_here=False)


# Tries at a Ray Client connection whose server failed to start (see join).
_CLIENT_START_ATTEMPTS = 3


def connect(execution: Any) -> ClusterInfo:
    """Initialize Ray per ``execution`` (an ExecutionConfig-like object). Idempotent:
    a driver that is already connected (multirun jobs in one process) stays connected."""
    return _connect(execution.address, execution.join_running, execution.num_cpus, execution.slots_per_node,
                    execution.dashboard, getattr(execution, "slot_resource", SLOT_RESOURCE))


def ensure_connected(address: str | None = None, *, slots: int | None = None,
                     slot_resource: str = SLOT_RESOURCE) -> ClusterInfo:
    """Connect unless connected already: join ``address`` (else ``RAY_ADDRESS``, else a
    `ray start` instance on this machine), or start a private local instance whose node
    declares ``slots`` of ``slot_resource`` (None: none)."""
    return _connect(address, True, None, slots, False, slot_resource)


def cluster_autoscales(wait_s: float = 0.0) -> bool:
    """Whether an autoscaler manages the connected cluster (it may add nodes with
    sandbox slots that no node declares yet).

    Ray's monitor publishes its autoscaler's report in the GCS key-value store each
    update (every few seconds; ``wait_s``: how long to wait for a first report on a head
    that just started). A head started without an autoscaling config runs a read-only
    autoscaler that names each node's type after the node (``node_<node id>``); a real
    one names the node types of its cluster config (``ray.head.default``, ``worker``...)."""
    import json  # noqa: PLC0415
    import time  # noqa: PLC0415

    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized  # noqa: PLC0415

    try:
        if not _internal_kv_initialized():
            return False
        deadline = time.monotonic() + wait_s
        raw = _internal_kv_get(_AUTOSCALING_STATUS_KEY)
        while not raw and time.monotonic() < deadline:
            time.sleep(0.5)
            raw = _internal_kv_get(_AUTOSCALING_STATUS_KEY)
        report = json.loads(raw).get("autoscaler_report") if raw else None
        if report:
            types = (set(report.get("active_nodes") or {}) | set(report.get("idle_nodes") or {})
                     | set(report.get("pending_launches") or {}) | set((report.get("node_type_mapping") or {}).values()))
        else:
            types = _v2_node_types()
        return any(t and not _READONLY_NODE_TYPE.fullmatch(t) for t in types)
    except Exception:  # pragma: no cover - the status format moved: assume a fixed cluster
        log.debug("could not read the autoscaler status", exc_info=True)
        return False


def _v2_node_types() -> set[str]:
    """Node type names Ray's autoscaler v2 reports (it keeps its state in the GCS, not
    in the key-value report); empty when no v2 autoscaler runs."""
    import ray  # noqa: PLC0415
    from ray.autoscaler.v2.sdk import get_cluster_status  # noqa: PLC0415

    status = get_cluster_status(ray.get_runtime_context().gcs_address, timeout=10)
    nodes = list(status.active_nodes) + list(status.idle_nodes)
    return {n.ray_node_type_name for n in nodes} | {r.ray_node_type_name for r in status.pending_launches}


def _connect(address: str | None, join_running: bool, num_cpus: int | None, slots: int | None,
             dashboard: bool, slot_resource: str = SLOT_RESOURCE) -> ClusterInfo:
    import ray  # noqa: PLC0415

    if ray.is_initialized():
        return _info(started_here=False)
    address = address or os.environ.get("RAY_ADDRESS")
    if not address and join_running:
        address = _running_local_address()
    if address:
        return join(address)
    return start_local(num_cpus=num_cpus, slots=slots, dashboard=dashboard, slot_resource=slot_resource)


def _options(configure_logging: bool) -> dict[str, Any]:
    # Worker output stays in the workers' log files: rollouts print a lot, and the
    # driver's terminal belongs to the progress line.
    if configure_logging:
        return dict(log_to_driver=False, configure_logging=True, logging_level=logging.WARNING)
    return dict(log_to_driver=False, configure_logging=False)


def _info(*, started_here: bool) -> ClusterInfo:
    import ray  # noqa: PLC0415

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    totals = ray.cluster_resources()
    return ClusterInfo(
        address=ray.get_runtime_context().gcs_address,
        started_here=started_here,
        nodes=len(nodes),
        cpus=float(totals.get("CPU", 0.0)),
        slots=float(totals.get(SLOT_RESOURCE, 0.0)),
    )


def driver_node() -> Any:
    """A scheduling strategy that places an actor on this (the driver's) node: for
    actors that read the driver's disk."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
