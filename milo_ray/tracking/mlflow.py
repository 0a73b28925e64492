"""``tracking=mlflow``: mirror a run into an MLflow tracking store.

By default the store is a local file store under the run directory
(``<run dir>/mlruns``, browse it with ``mlflow ui --backend-store-uri <that dir>``), so
tracking works offline, without a server. MLflow 3.x keeps its file store only behind
``MLFLOW_ALLOW_FILE_STORE=true`` (it prefers ``sqlite:``, which needs SQLAlchemy, not
part of ``mlflow-skinny``); for a ``file:`` store this sets that opt-in for the process.
``tracking.uri`` may name any other store (``http://host:5000``, ``sqlite:///...`` with
the full ``mlflow`` installed, ``databricks``).

One MLflow run per run directory, tagged ``milo_ray_run_id``; a resumed run continues
it (params already logged are kept, new rounds add metric points).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from milo_ray import redaction

log = logging.getLogger(__name__)

RUN_ID_TAG = "milo_ray_run_id"
_STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
# MLflow's limits (mlflow.utils.validation), fixed here so the truncation is visible.
MAX_KEY_CHARS = 250
MAX_PARAM_CHARS = 6000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
_BAD_KEY_CHARS = re.compile(r"[^\w\-./ :]")


def clean_key(key: str) -> str:
    """An MLflow-valid key: characters MLflow refuses become ``_``; at most 250 chars."""
    return _BAD_KEY_CHARS.sub("_", key)[:MAX_KEY_CHARS]


def truncate_param(value: str) -> str:
    return value if len(value) <= MAX_PARAM_CHARS else value[: MAX_PARAM_CHARS - 3] + "..."


class MlflowTracking:
    """``uri``: the tracking store (None: ``file:<run dir>/mlruns``); ``experiment``: the
    MLflow experiment's name (created when missing)."""

    name = "mlflow"

    def __init__(self, uri: str | None = None, experiment: str = "milo_ray") -> None:
        if uri is not None and (not isinstance(uri, str) or not uri.strip()):
            raise ValueError(f"tracking.uri={uri!r}: give a tracking store URI (file:/path, http://host:5000, "
                             "sqlite:///path) or null for <run dir>/mlruns")
        if not isinstance(experiment, str) or not experiment.strip():
            raise ValueError(f"tracking.experiment={experiment!r}: give the MLflow experiment's name")
        if importlib.util.find_spec("mlflow") is None:
            raise ValueError("tracking=mlflow: MLflow is not installed; pip install 'milo_ray[tracking]' "
                             "(mlflow-skinny), or use tracking=none")
        self.uri, self.experiment = uri, experiment
        self.client: Any = None
        self.run_id: str | None = None
        self.tracking_uri: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def _resolve_uri(self, run_dir: Path) -> str:
        uri = self.uri or (run_dir / "mlruns").as_uri()
        if "://" not in uri and not uri.startswith("file:") and uri != "databricks":
            uri = Path(uri).expanduser().resolve().as_uri()  # a plain directory path
        if uri.startswith("file:"):
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        return uri

    def start(self, *, run_id: str, run_dir: Path, params: dict[str, str], resumed: bool) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.tracking_uri = self._resolve_uri(run_dir)
        self.client = client = MlflowClient(tracking_uri=self.tracking_uri)
        exp = client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(self.experiment)
        found = client.search_runs([exp_id], filter_string=f"tags.{RUN_ID_TAG} = '{run_id}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            logged = set(found[0].data.params)
        else:
            self.run_id = client.create_run(exp_id, run_name=run_dir.name,
                                            tags={RUN_ID_TAG: run_id, "milo_ray_run_dir": redaction.redact(str(run_dir))}).info.run_id
            logged = set()
        log.info("tracking: MLflow run %s in experiment %r at %s", self.run_id, self.experiment, self.tracking_uri)
        items: dict[str, str] = {}
        for key, value in params.items():
            k = clean_key(key)
            if k not in logged and k not in items:  # a param, once logged, is never changed (MLflow's rule)
                items[k] = truncate_param(redaction.redact(str(value)))
        rows = [Param(k, v) for k, v in items.items()]
        for i in range(0, len(rows), PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=rows[i: i + PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None, at: float | None = None) -> None:
        from mlflow.entities import Metric

        stamp = int((time.time() if at is None else at) * 1000)
        rows = [Metric(clean_key(k), float(v), stamp, int(step or 0)) for k, v in metrics.items()]
        for i in range(0, len(rows), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=rows[i: i + METRICS_PER_BATCH])

    def finish(self, *, status: str, run_dir: Path, report: Path | None = None) -> None:
        manifest = run_dir / "manifest.json"
        if manifest.is_file():
            self.client.log_artifact(self.run_id, str(manifest))
        if report is not None and Path(report).is_file():
            # The report the run wrote: its directory holds the page and its figures.
            self.client.log_artifacts(self.run_id, str(Path(report).parent), artifact_path="report")
        else:
            log.info("tracking: no report artifact (the run wrote none: run.report=false, or writing it failed)")
        self.client.set_terminated(self.run_id, status=_STATUS.get(status, "FAILED"))
