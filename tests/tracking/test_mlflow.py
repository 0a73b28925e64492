"""tracking=mlflow against a real local MLflow file store, read back with MlflowClient;
tracking=none composes by default; a failing tracking backend never fails the run."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from milo_ray.config.errors import UserError
from milo_ray.run import CONF_DIR, _build
from milo_ray.store.memory import MemoryRunStore
from milo_ray.tracking import TRACKING_FAILED, NoTracking, RunStatus, TrackingSession, final_metrics, flatten_config
from milo_ray.tracking.mlflow import MAX_PARAM_CHARS, MlflowTracking

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def runs(shared_runs) -> Path:
    """milo (MLflow experiment "tiny") and ssr logged to MLflow, and failing, whose
    tracking backend raises: tests/shared_runs.py."""
    return shared_runs


@pytest.fixture(autouse=True)
def _file_store(monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x's opt-in for its file store


def _client_run(run_dir: Path, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} under {run_dir / 'mlruns'}"
    (run,) = client.search_runs([exp.experiment_id])
    return client, run


def _last(client, run, key: str) -> float:
    history = client.get_metric_history(run.info.run_id, key)
    assert history, f"metric {key} was never logged"
    return max(history, key=lambda m: (m.step, m.timestamp)).value


def _events(run_dir: Path, kind: str) -> list[dict]:
    rows = duckdb.sql(f"select payload from '{run_dir}/events/*.parquet' where kind = '{kind}' order by seq").fetchall()
    return [json.loads(p) for (p,) in rows]


def test_a_milo_run_is_read_back_from_the_local_mlflow_store(runs):
    run_dir = runs / "milo"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    summary = manifest["summary"]
    client, run = _client_run(run_dir, "tiny")
    assert run.info.status == "FINISHED" and run.data.tags["milo_ray_run_id"] == manifest["run_id"]
    params = run.data.params
    flat = flatten_config(manifest["config"])
    assert set(params) == set(flat) and params["method.max_rounds"] == str(manifest["config"]["method"]["max_rounds"]) and params["run.dir"] == str(run_dir)
    assert params["tracking.experiment"] == "tiny" and params["tracking.uri"] == "null"
    for j, isl in summary["islands"].items():
        assert _last(client, run, f"island{j}/heldout_accuracy") == pytest.approx(isl["heldout_accuracy"])
        assert _last(client, run, f"island{j}/stall") == isl["stall"]
        assert _last(client, run, f"island{j}/round") == isl["rounds"]
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, f"island{j}/stall"))
        assert steps[-1] == isl["rounds"]
    nodes = [e["node"] for e in _events(run_dir, "milo.node")]
    best_search = max(n["accuracy"] for n in nodes if n["admitted"] and n["accuracy"] is not None)
    assert _last(client, run, "best_search_accuracy") == pytest.approx(best_search)
    assert _last(client, run, "best_heldout_accuracy") == pytest.approx(summary["best"]["heldout_accuracy"])
    assert _last(client, run, "executions_used") == manifest["budget"]["executions_used"]
    top = summary["final_test"][0]
    assert run.data.metrics["test/pr_at_k"] == pytest.approx(top["pr_at_k"])
    assert run.data.metrics[f"test/{top['name']}/rr_at_k"] == pytest.approx(top["rr_at_k"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "manifest.json" in artifacts
    local = client.download_artifacts(run.info.run_id, "manifest.json", str(run_dir.parent / "dl"))
    assert json.loads(Path(local).read_text()) == manifest
    # The report the run wrote, page and figures, is the run's "report" artifact.
    assert (run_dir / "report" / "report.html").is_file()
    report = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "report")}
    assert "report.html" in report and "milo_pareto.png" in report, report


def test_an_ssr_run_logs_parent_and_child_scores_per_round(runs):
    run_dir = runs / "ssr"
    client, run = _client_run(run_dir, "milo_ray")
    selections = duckdb.sql(f"select round, payload from '{run_dir}/events/*.parquet' where kind = 'ssr.selection' "
                            "order by seq").fetchall()
    assert selections
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "parent_score")}
    assert history == pytest.approx({r: json.loads(p)["parent_score"] for r, p in selections})
    children = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "best_child_score")}
    assert children == pytest.approx({r: json.loads(p)["best_child_score"] for r, p in selections
                                      if json.loads(p)["best_child_score"] is not None})
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert run.data.metrics["test/pr_at_k"] == pytest.approx(manifest["summary"]["final_test"][0]["pr_at_k"])
    assert run.info.status == "FINISHED"


def test_a_failing_tracking_backend_is_logged_once_recorded_and_the_run_finishes(runs):
    run_dir = runs / "failing"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["summary"]["final_test"]
    (failed,) = _events(run_dir, TRACKING_FAILED)
    assert failed == {"backend": "failing", "stage": "log_metrics",
                      "error": "ConnectionError: tracking server unreachable"}
    log = (run_dir / "run.log").read_text()
    assert log.count("tracking (failing) failed at log_metrics") == 1


def test_long_params_are_truncated_bad_key_characters_replaced_and_a_resumed_run_continues(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t = MlflowTracking()
    t.start(run_id="r1", run_dir=run_dir, params={"long": "x" * (MAX_PARAM_CHARS + 50), "odd+key": "1"}, resumed=False)
    t.log_metrics({"island0/stall": 2}, step=3)
    t.finish(status="interrupted", run_dir=run_dir)
    again = MlflowTracking()
    again.start(run_id="r1", run_dir=run_dir, params={"long": "changed", "new": "2"}, resumed=True)
    again.finish(status="finished", run_dir=run_dir)
    assert again.run_id == t.run_id
    client, run = _client_run(run_dir, "milo_ray")
    assert run.data.params == {"long": "x" * (MAX_PARAM_CHARS - 3) + "...", "odd_key": "1", "new": "2"}
    assert run.data.metrics == {"island0/stall": 2.0} and run.info.status == "FINISHED"


def test_params_sent_to_mlflow_are_redacted_for_registered_secrets(tmp_path):
    from milo_ray import redaction

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    redaction.register({"MLFLOW_TEST_KEY": "sk-canary-mlflow-0123456789"})
    try:
        t = MlflowTracking()
        t.start(run_id="r2", run_dir=run_dir, params={"model.note": "key is sk-canary-mlflow-0123456789"},
                resumed=False)
        t.finish(status="finished", run_dir=run_dir)
    finally:
        redaction.clear()
    _, run = _client_run(run_dir, "milo_ray")
    assert run.data.params == {"model.note": "key is [redacted $MLFLOW_TEST_KEY]"}


def test_a_tracker_that_fails_to_start_is_recorded_once_and_never_called_again():
    calls = []

    class Down:
        name = "down"

        def start(self, **kw):
            calls.append("start")
            raise OSError("no route to host")

        def log_metrics(self, *a):
            calls.append("log")

        def finish(self, **kw):
            calls.append("finish")

    store = MemoryRunStore()
    status = RunStatus()
    session = TrackingSession(Down(), store)
    session.start(run_id="r", run_dir=Path("/nonexistent"), config={"a": 1}, resumed=False, status=status)
    store.event("milo.progress", {"island": 0, "rounds_done": 1, "stall": 0})
    session.finish(status="finished", summary={"final_test": [{"name": "x", "pr_at_k": 0.5}]}, run_dir=Path("."))
    assert calls == ["start"] and session.failed == "start: OSError: no route to host"
    rows = [r for r in store.read("events").to_pylist() if r["kind"] == TRACKING_FAILED]
    assert len(rows) == 1 and json.loads(rows[0]["payload"])["stage"] == "start"


def test_final_metrics_and_flattened_params():
    rows = [{"name": "ssr final", "pr_at_k": 0.5, "pr_ci": [0.4, 0.6], "harness_id": "h", "k": 1},
            {"name": "ssr initial", "pr_at_k": 0.25, "pr_ci": [None, None]}]
    assert final_metrics({"final_test": rows}) == {
        "test/ssr final/pr_at_k": 0.5, "test/ssr final/pr_ci_lo": 0.4, "test/ssr final/pr_ci_hi": 0.6,
        "test/ssr final/k": 1.0, "test/pr_at_k": 0.5, "test/pr_ci_lo": 0.4, "test/pr_ci_hi": 0.6, "test/k": 1.0,
        "test/ssr initial/pr_at_k": 0.25}
    assert flatten_config({"a": {"b": 1, "c": [1, 2], "d": None, "e": {}}, "f": "x"}) == {
        "a.b": "1", "a.c": "[1, 2]", "a.d": "null", "a.e": "{}", "f": "x"}


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def test_tracking_is_none_by_default_and_mlflow_settings_are_checked_before_the_run():
    assert isinstance(_build("tracking", _compose([]).tracking), NoTracking)
    cfg = _compose(["tracking=mlflow"])
    assert cfg.tracking.uri is None and cfg.tracking.experiment == "milo_ray"
    assert isinstance(_build("tracking", cfg.tracking), MlflowTracking)
    with pytest.raises(UserError, match=r"^tracking: tracking.experiment='': give the MLflow experiment's name"):
        _build("tracking", _compose(["tracking=mlflow", "tracking.experiment=''"]).tracking)
