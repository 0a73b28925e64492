"""The ``ray_jobs`` launcher's settings (``hydra.launcher.*``) and their checks.

The mapping settings (``entrypoint_resources``, ``runtime_env``) default to an empty
mapping, not null: OmegaConf cannot merge a command-line dict or a dotted key into a
null node, so only an empty one accepts every command-line form
(``'hydra.launcher.entrypoint_resources={driver_slot:1}'``,
``hydra.launcher.entrypoint_resources.driver_slot=1``, ``++...``). Empty means unset.

Keys never travel in a job's ``runtime_env`` (Ray logs it and shows it on the
dashboard): a job's driver gets provider keys from the environment of the Ray node it
runs on, so a runtime_env that carries one is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from milo_ray.config.errors import UserError
from milo_ray.core.llm_endpoint import KEY_PREFIXES

DRIVER_NODES = ("auto", "any")
LAUNCHER_TARGET = "hydra_plugins.milo_ray_jobs_launcher.ray_jobs_launcher.RayJobsLauncher"


@dataclass
class RayJobsLauncherConf:
    """``hydra/launcher=ray_jobs``.

    address: the Ray dashboard to submit to (``http://HEAD:8265``); null: a Ray on this
        machine (one started with ``ray start`` when ``execution.join_running``, else a
        head the launcher starts with a dashboard on free ports and stops at the end).
    max_concurrent: jobs running at once; null: one per CPU of the cluster when the sweep
        starts (per ``entrypoint_num_cpus`` CPUs when a job reserves more than one), at least 1.
    entrypoint_num_cpus: CPUs each job's driver reserves (Ray places the driver where they
        are free). The driver mostly waits on Ray; its rollouts and mutations reserve their
        own resources, so the default leaves most of each core to them.
    entrypoint_resources: custom resources each driver reserves (e.g. ``{driver_slot: 1}``,
        a resource the head declares a few of, to cap the drivers it runs at once).
    driver_node: ``auto`` runs every driver on the node whose disk holds the run directories
        (this machine's node for a Ray on this machine, the head for an ``address``), so no
        run is left on a worker's disk that leaves with the worker; ``any`` lets Ray place
        them wherever their resources are free, for run directories every node reaches (an
        object-store URI ``run.dir`` is placed so by itself).
    runtime_env: the jobs' Ray runtime environment (e.g. ``working_dir`` on a cluster);
        never keys. On a Ray on this machine the launcher adds ``PYTHONPATH`` so the jobs
        import the code the launcher runs.
    python: the interpreter of each job's driver; null: this one (``sys.executable``) on a
        Ray on this machine, ``python`` on a cluster.
    poll_s: seconds between status polls of the running jobs.
    log_tail_lines: lines of a failed job's log in its summary row.
    max_usd: the sweep's spend cap in USD, every job's metered model calls together: each
        job is handed ``run.budget.sweep`` (a ledger named by the sweep directory, shared by
        all its jobs, that their gateways reserve on and charge); at the cap every job stops
        as at its own budget (resumable), and the summary names the jobs it stopped. Null:
        no cap beyond each job's own ``run.budget``.
    """

    _target_: str = LAUNCHER_TARGET
    address: Optional[str] = None
    max_concurrent: Optional[int] = None
    entrypoint_num_cpus: Optional[float] = 0.25
    entrypoint_resources: Dict[str, float] = field(default_factory=dict)
    driver_node: str = "auto"
    runtime_env: Dict[str, Any] = field(default_factory=dict)
    python: Optional[str] = None
    poll_s: float = 2.0
    log_tail_lines: int = 20
    max_usd: Optional[float] = None


# Mappings whose keys are the user's (Ray resource names, runtime_env fields): open to new
# keys from the command line even though Hydra puts the config in struct mode.
OPEN_MAPPINGS = ("entrypoint_resources", "runtime_env")


def launcher_config_node() -> Any:
    """The config Hydra stores for ``hydra/launcher=ray_jobs``: the schema, with the
    user-keyed mappings (:data:`OPEN_MAPPINGS`) open, so a dotted key or a dict adds keys
    without a ``+``."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(RayJobsLauncherConf)
    for name in OPEN_MAPPINGS:
        OmegaConf.set_struct(node[name], False)
    return node


@dataclass(frozen=True)
class LauncherSettings:
    """Checked settings (plain values, no OmegaConf)."""

    address: str | None
    max_concurrent: int | None
    entrypoint_num_cpus: float | None
    entrypoint_resources: dict[str, float] | None
    runtime_env: dict[str, Any] | None
    python: str | None
    poll_s: float
    log_tail_lines: int
    driver_node: str = "auto"
    max_usd: float | None = None


# Variable names that hold secrets by convention; values that look like provider keys.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


def check_runtime_env(runtime_env: dict[str, Any] | None) -> None:
    """Refuse a runtime_env that carries a key (by its variable's name or its value's form)."""
    env_vars = (runtime_env or {}).get("env_vars") or {}
    for name, value in env_vars.items():
        if _SECRET_NAME.search(str(name)) or str(value).startswith(KEY_PREFIXES):
            raise UserError(f"hydra.launcher.runtime_env.env_vars.{name}: keys never travel in a job's runtime_env "
                            "(Ray logs it and shows it on the dashboard); set it in the environment of the Ray "
                            "nodes (the head's, for the jobs' drivers) and name it with model.api_key_env")


def settings_from(node: Any) -> LauncherSettings:
    """Check ``hydra.launcher`` (a DictConfig or mapping) and return plain settings."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, DictConfig):
        raw = OmegaConf.to_container(node, resolve=True)
    else:  # Hydra passes the plugin's config as keyword arguments, nested nodes still OmegaConf
        raw = {k: OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v
               for k, v in dict(node).items()}
    raw.pop("_target_", None)
    max_concurrent = raw.get("max_concurrent")
    if max_concurrent is not None and (not isinstance(max_concurrent, int) or max_concurrent < 1):
        raise UserError(f"hydra.launcher.max_concurrent={max_concurrent}: must be an integer >= 1 "
                        "(or null: one job per CPU of the cluster)")
    cpus = raw.get("entrypoint_num_cpus")
    if cpus is not None and (not math.isfinite(cpus) or cpus < 0):
        raise UserError(f"hydra.launcher.entrypoint_num_cpus={cpus}: must be >= 0 (or null)")
    resources = raw.get("entrypoint_resources")
    for name, amount in (resources or {}).items():
        if not isinstance(amount, (int, float)) or amount < 0:
            raise UserError(f"hydra.launcher.entrypoint_resources.{name}={amount}: must be a number >= 0")
    driver_node = raw.get("driver_node") or "auto"
    if driver_node not in DRIVER_NODES:
        raise UserError(f"hydra.launcher.driver_node={driver_node}: must be one of {', '.join(DRIVER_NODES)} "
                        "(auto: drivers on the node whose disk holds the run directories; any: wherever Ray "
                        "finds their resources, for run directories every node reaches)")
    if raw.get("poll_s") is None or raw["poll_s"] <= 0:
        raise UserError(f"hydra.launcher.poll_s={raw.get('poll_s')}: must be > 0 seconds")
    if raw.get("log_tail_lines") is None or raw["log_tail_lines"] < 1:
        raise UserError(f"hydra.launcher.log_tail_lines={raw.get('log_tail_lines')}: must be an integer >= 1")
    address = raw.get("address")
    if address is not None and not re.match(r"^https?://", str(address)):
        raise UserError(f"hydra.launcher.address={address}: the Ray dashboard's address, e.g. http://HEAD:8265 "
                        "(Ray Jobs are submitted to the dashboard, not to ray:// or the GCS port); "
                        "null runs the jobs on a Ray on this machine")
    check_runtime_env(raw.get("runtime_env"))
    max_usd = raw.get("max_usd")
    if max_usd is not None and (isinstance(max_usd, bool) or not isinstance(max_usd, (int, float))
                                or not math.isfinite(max_usd) or max_usd <= 0):
        raise UserError(f"hydra.launcher.max_usd={max_usd}: must be a number of USD > 0 (or null: no sweep cap)")
    return LauncherSettings(address=address, max_concurrent=max_concurrent, entrypoint_num_cpus=cpus,
                            entrypoint_resources={k: float(v) for k, v in resources.items()} if resources else None,
                            runtime_env=raw.get("runtime_env") or None, python=raw.get("python"),
                            driver_node=driver_node, max_usd=None if max_usd is None else float(max_usd),
                            poll_s=float(raw["poll_s"]), log_tail_lines=int(raw["log_tail_lines"]))


def default_max_concurrent(cluster_cpus: float, entrypoint_num_cpus: float | None) -> int:
    """The cap when ``max_concurrent`` is null: one job per CPU of the cluster, or per
    ``entrypoint_num_cpus`` CPUs when each driver reserves more than one; at least 1."""
    per_job = max(1.0, float(entrypoint_num_cpus or 0.0))
    return max(1, int(cluster_cpus // per_job))
