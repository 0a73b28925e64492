"""From the command line, on Harbor task directories under bubblewrap: a user's own harness
directory in ``benchmark.seeds`` (validated before the run, refused in one message when bad),
``executor.agent=oracle`` validating every task of the suite once, tasks the sandbox cannot
run skipped on request, and an input error with several problems printing all of them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "execution"))
from real_tasks import make_task, solving_policy  # noqa: E402

from milo_ray.harness.seeds import seed_dir  # noqa: E402
from milo_ray.testing.openai_server import ScriptedOpenAIServer  # noqa: E402

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # each test is a run or several of the entry point (~30 s)
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}


def _cli(cwd: Path, *args: str, env: dict[str, str] = ENV, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "milo_ray.run", *args, "run.progress=false", "run.report=false",
                           "execution.num_cpus=2"], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def _rows(run_dir: Path, table: str = "rollouts") -> list[dict]:
    return [r for f in sorted((run_dir / table).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_oracle_eval_validates_every_task_of_every_split_once(tmp_path):
    tasks = tmp_path / "tasks"
    names = [f"t{i}" for i in range(5)]
    for n in names:
        make_task(tasks, n)
    run_dir = tmp_path / "run"
    proc = _cli(tmp_path, "method=eval", "executor.agent=oracle", "benchmark=harbor", f"benchmark.path={tasks}",
                "benchmark.splits={train: 0.4, val: 0.2, test: 0.4}", "method.k=3", f"run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(run_dir)
    assert sorted(r["task_id"] for r in rows) == names  # every task, once, whatever its split
    assert len({r["harness_id"] for r in rows}) == 1 and {r["rollout_idx"] for r in rows} == {0}
    assert {r["split"] for r in rows} == {"train", "val", "test"}
    summary = json.loads((run_dir / "manifest.json").read_text())["summary"]
    assert summary["mode"] == "oracle" and summary["resolved"] == 5 and summary["failing"] == []
    assert "5/5 tasks resolved" in proc.stdout
    # The read side scores what ran, under the oracle's name: 5 tasks, 1 rollout each (not
    # method.k=3 against the test split's 2 tasks under the seed harness's name).
    from milo_ray import results
    from milo_ray.report import final_test_lead

    res = results.load_run(run_dir)
    (row,) = results.final_test(res).to_dict("records")
    assert (row["label"], row["n_tasks"], row["k"], row["n_rollouts"]) == ("oracle (reference solutions)", 5, 1, 5)
    assert row["pass_at_k"] == row["pr_at_k"] == row["rr_at_k"] == 1.0
    (cmp,) = results.compare([res]).to_dict("records")
    assert (cmp["label"], cmp["n_tasks"], cmp["k"], cmp["pr_at_k"]) == ("oracle (reference solutions)", 5, 1, 1.0)
    assert "reference solutions" in final_test_lead(res) and "held" not in final_test_lead(res)


def test_a_task_the_sandbox_cannot_run_is_skipped_with_a_warning_when_asked(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks, "fine")
    needy = make_task(tasks, "needs-apt")
    (needy / "environment" / "Dockerfile").write_text("FROM debian:12\nWORKDIR /app\nRUN apt-get install -y jq\n")
    refused = _cli(tmp_path, "method=eval", "executor.agent=oracle", "benchmark=harbor", f"benchmark.path={tasks}",
                   "benchmark.splits={test: 1.0}", f"run.dir={tmp_path / 'refused'}")
    assert refused.returncode == 2 and "run.skip_unrunnable_tasks=true" in refused.stderr
    run_dir = tmp_path / "run"
    proc = _cli(tmp_path, "method=eval", "executor.agent=oracle", "benchmark=harbor", f"benchmark.path={tasks}",
                "benchmark.splits={test: 1.0}", "run.skip_unrunnable_tasks=true", f"run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: skipping task needs-apt" in proc.stderr and "sandbox=docker" in proc.stderr
    assert [r["task_id"] for r in _rows(run_dir)] == ["fine"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert list(manifest["skipped_tasks"]) == ["needs-apt"]
    assert "needs-apt skipped" in (run_dir / "run.log").read_text()
    assert any(r["kind"] == "tasks_skipped" for r in _rows(run_dir, "events"))


def test_an_input_error_with_several_problems_prints_every_one(tmp_path):
    tasks = tmp_path / "tasks"
    for n in ("good", "bad-a", "bad-b", "bad-c"):
        make_task(tasks, n)
    for n in ("bad-a", "bad-b", "bad-c"):
        (tasks / n / "instruction.md").unlink()
    proc = _cli(tmp_path, "method=eval", "executor.agent=oracle", "benchmark=harbor", f"benchmark.path={tasks}",
                f"run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert "3 problem(s)" in proc.stderr
    for n in ("bad-a", "bad-b", "bad-c"):
        assert f"task {n}: instruction.md is missing" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_benchmark_seeds_takes_a_harness_directory_validated_before_the_run(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks, "answer-a")
    mine = tmp_path / "my_harness"
    shutil.copytree(seed_dir("minimal"), mine)
    broken = tmp_path / "broken_harness"
    broken.mkdir()
    (broken / "harness.py").write_text("def build_agent(model, backend):\n    return (\n")
    base = ("method=eval", "method.k=1", "benchmark=harbor", f"benchmark.path={tasks}", "benchmark.splits={test: 1.0}")

    missing = _cli(tmp_path, *base, "executor.agent=oracle", "benchmark.seeds=[./nowhere]", f"run.dir={tmp_path / 'r0'}")
    assert missing.returncode == 2 and "benchmark.seeds" in missing.stderr and "does not exist" in missing.stderr
    unknown = _cli(tmp_path, *base, "executor.agent=oracle", "benchmark.seeds=[minimall]", f"run.dir={tmp_path / 'r1'}")
    assert unknown.returncode == 2 and "benchmark.seeds" in unknown.stderr and "./minimall" in unknown.stderr
    invalid = _cli(tmp_path, *base, "executor.agent=oracle", f"benchmark.seeds=[minimal,{broken}]",
                   f"run.dir={tmp_path / 'r2'}")
    assert invalid.returncode == 2, invalid.stderr[-2000:]
    assert "benchmark.seeds" in invalid.stderr and "broken_harness: syntax" in invalid.stderr
    assert "harness.py:2" in invalid.stderr
    assert not any((tmp_path / r).exists() for r in ("r0", "r1", "r2"))

    run_dir = tmp_path / "run"
    with ScriptedOpenAIServer(solving_policy) as srv:
        proc = _cli(tmp_path, *base, "model=litellm", "model.solver=openai/scripted", f"model.api_base={srv.url}",
                    "benchmark.seeds=[./my_harness]", f"run.dir={run_dir}",
                    env={**ENV, "OPENAI_API_KEY": "local"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(run_dir)
    assert [r["score"] for r in rows] == [1.0]
    assert [h["name"] for h in _rows(run_dir, "harnesses")] == ["my_harness"]
