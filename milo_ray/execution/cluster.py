"""Connecting the driver to Ray: start a right-sized local instance, join one already
running on this machine (so Hydra multirun jobs share it), or join a cluster."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SLOT_RESOURCE = "sandbox_slot"


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
        from ray._private.utils import read_ray_address  # noqa: PLC0415

        return read_ray_address() or None
    except Exception:  # pragma: no cover - private API moved: start a private instance
        return None


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


def connect(execution: Any) -> ClusterInfo:
    """Initialize Ray per ``execution`` (an ExecutionConfig-like object). Idempotent:
    a driver that is already connected (multirun jobs in one process) stays connected."""
    import ray  # noqa: PLC0415 - keep `import milo_ray.execution` light

    started_here = False
    if not ray.is_initialized():
        address = execution.address or os.environ.get("RAY_ADDRESS")
        if not address and execution.join_running:
            address = _running_local_address()
        common = dict(log_to_driver=False, configure_logging=True, logging_level=logging.WARNING)
        if address:
            log.info("joining Ray at %s", address)
            ray.init(address=address, **common)
        else:
            started_here = True
            quiet_token_auth_notice()
            ray.init(
                # "local" always starts a new instance: without it Ray would join one that
                # `ray start` left running here and refuse num_cpus for it.
                address="local",
                num_cpus=execution.num_cpus,
                include_dashboard=bool(execution.dashboard),
                resources={SLOT_RESOURCE: float(execution.slots_per_node)},
                **common,
            )
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    totals = ray.cluster_resources()
    return ClusterInfo(
        address=ray.get_runtime_context().gcs_address,
        started_here=started_here,
        nodes=len(nodes),
        cpus=float(totals.get("CPU", 0.0)),
        slots=float(totals.get(SLOT_RESOURCE, 0.0)),
    )
