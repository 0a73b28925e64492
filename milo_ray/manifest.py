"""The run manifest (DESIGN §3): resolved config, package versions, git sha, seed,
model ids (the solver's, and the embedder model actually used), start/stop times and
status. Written at start, rewritten at the end; a resumed run keeps its run id and
appends to its history."""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

from omegaconf import DictConfig, OmegaConf

from milo_ray.config.errors import UserError

_PACKAGES = ("milo_ray", "ray", "numpy", "scipy", "pyarrow", "hydra-core", "deepagents", "langchain",
             "langchain-litellm", "litellm", "sentence-transformers", "torch", "duckdb")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_sha() -> str | None:
    """The commit of the milo_ray source tree, if it is a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# The manifest's own layout; a run written by a newer milo_ray says so and is refused by
# name rather than misread. Manifests written before the field existed are version 1.
MANIFEST_VERSION = 1


def newer_manifest(manifest: dict[str, Any]) -> str | None:
    """Why this milo_ray cannot read ``manifest`` (written by a newer one), or None."""
    version = manifest.get("manifest_version", 1)
    if isinstance(version, int) and version <= MANIFEST_VERSION:
        return None
    return (f"manifest.json is from a newer milo_ray (manifest_version {version!r}; this one reads up to "
            f"{MANIFEST_VERSION}); upgrade milo_ray to open this run")


def load_manifest(run_dir: Path, *, where: str, fail: Callable[[str], Exception]) -> dict[str, Any]:
    """``run_dir``/manifest.json, checked: every problem (missing, unreadable, not JSON, not an
    object, written by a newer milo_ray) is raised as ``fail(one line)`` starting with ``where``
    and naming the fix. The resume path and the results API each pass their own error type."""
    file = Path(run_dir) / "manifest.json"
    try:
        manifest = json.loads(file.read_text("utf-8"))
    except FileNotFoundError:
        raise fail(f"{where}: no run there (manifest.json missing)") from None
    except ValueError as exc:  # JSONDecodeError, and bytes that are not UTF-8
        raise fail(f"{where}: corrupt manifest, not valid JSON ({exc}); restore manifest.json from a backup or "
                   "move the run directory aside (its tables are not affected)") from None
    except OSError as exc:
        raise fail(f"{where}: cannot read manifest.json ({exc.strerror or exc}); check the directory's "
                   "permissions and mount") from None
    if not isinstance(manifest, dict):
        raise fail(f"{where}: corrupt manifest, a JSON {type(manifest).__name__} instead of an object; restore "
                   "manifest.json or start a new run")
    newer = newer_manifest(manifest)
    if newer:
        raise fail(f"{where}: {newer}")
    return manifest


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest of the run ``run.resume`` names; a problem is a UserError naming that key."""
    return load_manifest(run_dir, where=f"run.resume={run_dir}", fail=UserError)


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def build_manifest(cfg: DictConfig, *, run_dir: Path, cluster: Any, resumed: bool,
                   run_id: str | None = None) -> dict[str, Any]:
    now = time.time()
    history: list[dict[str, Any]] = []
    if resumed:
        previous = read_manifest(run_dir)
        run_id = previous["run_id"]
        history = previous.get("history", [])
    entry = {
        "started_at": now,
        "host": socket.gethostname(),
        "cluster": {"address": cluster.address, "nodes": cluster.nodes, "cpus": cluster.cpus, "slots": cluster.slots},
        "resumed": resumed,
    }
    return {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run_id or new_run_id(),
        "status": "running",
        "config": OmegaConf.to_container(cfg, resolve=True),
        "seed": int(cfg.run.seed),
        "model_id": cfg.model.id,
        "models": {"solver": {"id": cfg.model.id, "solver": cfg.model.get("solver")},
                   "embedder": embedder_models(_configured_embedder(cfg), [])},
        "method": str(cfg.method.get("_target_", "")),
        "benchmark": str(cfg.benchmark.get("_target_", "")),
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "started_at": history[0]["started_at"] if history else now,
        "finished_at": None,
        "history": [*history, entry],
    }


def _configured_embedder(cfg: DictConfig) -> str | None:
    spec = OmegaConf.select(cfg, "backend.agents.embedder", default=None)
    name = spec.get("model_name") if spec is not None and hasattr(spec, "get") else None
    return None if name is None else str(name)


EMBEDDER_LOADED = "embedder.loaded"  # the event kind a load is recorded as (payload: an EmbedderLoad)


def embedder_models(configured: str | None, loads: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's embedder entry: the configured model, every model actually loaded
    (in every session of the run), and whether any load fell back to the packaged model."""
    loads = list(loads)
    used: list[str] = []
    for load in loads:
        if load.get("used") and load["used"] not in used:
            used.append(load["used"])
    return {"configured": configured, "used": used, "fell_back": any(bool(x.get("fell_back")) for x in loads)}


def finish_manifest(manifest: dict[str, Any], *, status: str, summary: dict[str, Any], budget: Any,
                    embedder_loads: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The manifest at the end of a session; ``embedder_loads``: the payloads of the run's
    ``embedder.loaded`` events (all sessions)."""
    now = time.time()
    done = dict(manifest)
    models = dict(manifest.get("models") or {})
    models["embedder"] = embedder_models((models.get("embedder") or {}).get("configured"), embedder_loads)
    done["models"] = models
    done["status"] = status
    done["finished_at"] = now
    done["summary"] = json.loads(json.dumps(summary, default=str))
    done["budget"] = {"executions_used": getattr(budget, "executions_used", None)}
    done["history"] = [*manifest["history"][:-1], {**manifest["history"][-1], "finished_at": now, "status": status}]
    return done


def elapsed_before(history: list[dict[str, Any]], activity: Iterable[float]) -> float:
    """Seconds the earlier sessions of a resumed run spent (``history[-1]`` is the current one).

    A session that stopped on its own has ``finished_at``; one that was killed ends at
    its last stored activity (an event or a finished rollout) before the next session
    started: whatever it did after that was lost and is done again.
    """
    times = sorted(float(t) for t in activity if t is not None)
    total = 0.0
    for cur, nxt in zip(history[:-1], history[1:]):
        start = float(cur["started_at"])
        end = cur.get("finished_at")
        if end is None:
            inside = [t for t in times if start <= t < float(nxt["started_at"])]
            end = inside[-1] if inside else start
        total += max(0.0, float(end) - start)
    return total


def deadline_for(time_limit_s: float | None, elapsed_s: float, *, now: float | None = None) -> float | None:
    """The ``time.monotonic()`` instant a run's time limit ends, counting the seconds its
    earlier sessions already ran (None: no limit)."""
    if time_limit_s is None:
        return None
    return (time.monotonic() if now is None else now) + float(time_limit_s) - float(elapsed_s)
