"""The command line as a person uses it: the directories a run writes, exit codes,
--help, a method/benchmark mismatch refused before anything is written, what a
resumed run keeps, and the run-level time limit in every method."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from milo_ray.config.errors import UserError
from milo_ray.config.validate import check_overrides
from milo_ray.run import CONF_DIR

HERE = Path(__file__).parent
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


def _cli(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "milo_ray.run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV)


def _err_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_default_free_running_milo_runs_and_writes_only_its_run_directory(tmp_path):
    proc = _cli(tmp_path, "method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1",
                "method.k_test=1", "method.max_rounds=2", "run.progress=false", "run.report=false", "execution.num_cpus=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["runs"], "nothing but runs/<timestamp> in the working directory"
    (run_dir,) = list((tmp_path / "runs").iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["config"]["method"]["round_sync"] is False
    assert not (run_dir / ".hydra").exists() and (run_dir / "run.log").is_file()
    assert f"run directory: {run_dir}" in proc.stdout
    islands = manifest["summary"]["islands"]
    assert len(islands) == 3 and all(row["rounds"] == 2 for row in islands.values())


@pytest.mark.parametrize("args,key", [
    (["method=ssr", "method.train_split=train"], "method.train_split='train'"),
    (["method=eval", "method.split=train"], "method.split='train'"),
    (["method=milo", "method.search_split=train"], "method.search_split='train'"),
    (["method=milo", "benchmark=surrogate_swepro", "method.val_split=search"], "method.val_split='search'"),
    (["method=milo", "method.pool_size=4"], "method.pool_size=4"),
    (["benchmark._target_=no.such.Benchmark"], "benchmark._target_=no.such.Benchmark"),
])
def test_a_method_benchmark_mismatch_is_refused_in_one_line_before_anything_is_written(tmp_path, args, key):
    proc = _cli(tmp_path, *args, f"run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = _err_lines(proc)
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}"), lines
    assert list(tmp_path.iterdir()) == [], "bad input must leave no file or directory behind"


@pytest.mark.slow  # a whole run in a child process: the slow suite (.ci/run runs it)
def test_a_crash_exits_1_not_2_and_leaves_a_failed_manifest_and_its_traceback_in_run_log(tmp_path):
    run_dir = tmp_path / "run"
    proc = _cli(tmp_path, "method=eval", "method._target_=crashing_method.CrashingEval", "benchmark=surrogate_deepswe",
                f"run.dir={run_dir}", "execution.num_cpus=1")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "a bug in the method" in proc.stderr
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
    log = (run_dir / "run.log").read_text()
    assert "the run crashed" in log and "RuntimeError: a bug in the method" in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_constructor_bug_is_a_crash_while_an_argument_it_does_not_take_is_bad_input(tmp_path):
    common = ("method=eval", "method._target_=crashing_method.BuggyConstructorEval", "benchmark=surrogate_deepswe",
              "execution.num_cpus=1")
    bug = _cli(tmp_path, *common, f"run.dir={tmp_path / 'bug'}")
    assert bug.returncode == 1, (bug.returncode, bug.stderr[-2000:])
    assert "TypeError" in bug.stderr and "len(self.k)" in bug.stderr  # the constructor's own traceback
    wrong = _cli(tmp_path, *common, "+method.widht=3", f"run.dir={tmp_path / 'wrong'}")
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert _err_lines(wrong)[0].startswith("error: method.widht: BuggyConstructorEval has no parameter 'widht'")


def test_help_lists_every_group_option_and_run_key_and_no_internal_schema():
    from milo_ray.config.help import GROUP_HELP, run_keys
    from milo_ray.config.paths import config_groups

    proc = subprocess.run([sys.executable, "-m", "milo_ray.run", "--help"], capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert proc.returncode == 0
    assert "schema" not in proc.stdout
    groups = {p.name for p in Path(CONF_DIR).iterdir() if p.is_dir()}
    assert {"sandbox", "tracking", "experiment"} <= groups <= set(config_groups(CONF_DIR))
    for group in groups:
        assert group == "experiment" or group in GROUP_HELP, f"group {group} has no description in GROUP_HELP"
        for option in (p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml")):
            assert option in proc.stdout, f"{group}={option} missing from --help"
    keys = dict(run_keys())
    assert {"run.dir", "run.resume", "run.seed", "run.report", "run.skip_unrunnable_tasks",
            "run.budget.roles.ROLE.tokens"} <= set(keys)
    for key, text in keys.items():
        assert text, f"{key} has no help text (give its schema field setting(..., help=...))"
        assert key in proc.stdout
    # Each method's keys and the sweep launcher's, read from their schemas: a field without
    # help (metadata, a docstring entry or a comment above it) fails here.
    from milo_ray.config.help import launcher_keys, method_keys

    rows = [r for rs in method_keys().values() for r in rs] + launcher_keys()
    assert {"method.num_islands", "method.racing", "method.k", "hydra.launcher.entrypoint_resources"} <= {
        r.key for r in rows}
    for r in rows:
        assert r.help, f"{r.key} has no help text (document the field in its schema's docstring)"
        assert f"  {r.key} " in proc.stdout, f"{r.key} missing from --help"


# --- resume: what a resumed run keeps -------------------------------------------------------

def _stored_run(tmp_path: Path, **run: object) -> Path:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["method=eval", *[f"run.{k}={v}" for k, v in run.items()]])
    GlobalHydra.instance().clear()
    run_dir = tmp_path / "stored"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"config": OmegaConf.to_container(cfg, resolve=True)}))
    return run_dir


def _resumed(run_dir: Path, *overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from milo_ray.run import _resume_config

    argv = [f"run.resume={run_dir}", *overrides]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=argv)
    GlobalHydra.instance().clear()
    return _resume_config(cfg, argv)


def test_a_resumed_run_keeps_its_stored_time_limit_budget_and_progress_unless_given_again(tmp_path):
    run_dir = _stored_run(tmp_path, time_limit_s=1000, progress="false", **{"budget.executions": 70})
    kept = _resumed(run_dir)
    assert (kept.run.time_limit_s, kept.run.progress, kept.run.budget.executions) == (1000, False, 70)
    assert kept.method._target_ == "milo_ray.evaluation.EvalMethod" and kept.run.dir == str(run_dir.resolve())
    given = _resumed(run_dir, "run.time_limit_s=5", "run.budget.executions=90", "run.progress=true")
    assert (given.run.time_limit_s, given.run.progress, given.run.budget.executions) == (5, True, 90)


@pytest.mark.parametrize("override", ["run.seed=3", "method=ssr", "benchmark.preset=surrogate_swepro",
                                      "+backend.agents.judge={_target_: x.Y}"])
def test_a_resumed_run_refuses_an_override_that_would_change_its_stored_config(tmp_path, override):
    run_dir = _stored_run(tmp_path)
    with pytest.raises(UserError, match="resumed run continues with its stored config"):
        check_overrides(CONF_DIR, [f"run.resume={run_dir}", override])
    with pytest.raises(UserError, match="resumed run continues with its stored config"):
        _resumed(run_dir, override)


# --- the run's one time limit, in every method -----------------------------------------------

class _WaveScheduler:
    """Stands in for the rollout scheduler: answers every request, and lets the run's
    deadline pass after the first wave."""

    def __init__(self, ctx_box: list) -> None:
        self.ctx_box, self.waves = ctx_box, []

    def add_harness(self, h) -> None:
        pass

    def run(self, requests):
        from milo_ray.core.rollouts import RolloutResult

        self.waves.append(len(requests))
        self.ctx_box[0].deadline = time.monotonic() - 1.0
        return [RolloutResult(r.harness_id, r.task_id, r.rollout_idx, score=1.0) for r in requests]


def test_eval_starts_no_rollout_wave_past_the_runs_deadline_and_reports_the_completed_k(tmp_path):
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.evaluation import EvalMethod
    from milo_ray.store import MemoryRunStore

    bench = SurrogateBenchmark(preset="surrogate_deepswe", seed=0)
    box: list = []
    sched = _WaveScheduler(box)
    ctx = RunContext(run_id="t", run_dir=tmp_path, seed=0, store=MemoryRunStore(run_id="t"), benchmark=bench,
                     scheduler=sched, model_id="m", deadline=time.monotonic() + 3600)
    box.append(ctx)
    summary = EvalMethod(k=4, split="test", names=["minimal"]).run(ctx)
    assert sched.waves == [50], "one wave (one rollout per test task), then the deadline stops the rest"
    assert (summary["k"], summary["k_requested"], summary["stop_reason"]) == (1, 4, "time limit")
    assert summary["harnesses"][0]["k"] == 1 and summary["harnesses"][0]["pass_at_k"] == 1.0
