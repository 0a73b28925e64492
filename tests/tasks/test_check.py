"""``python -m milo_ray.tasks check``: a suite with one task of every verdict gets exactly
those verdicts; a failed reference solution scores 0 with its reason; a missing image is
found before anything runs; the outputs (Parquet, markdown, split file) hold the verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from milo_ray.tasks.check import run_check
from milo_ray.tasks.output import write, write_split_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_suite import EXPECTED, make_task  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


# The suite's check starts Ray and runs 7 tasks' rollouts under bwrap (~25 s).
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def suite_result(verdict_suite, ray_local):
    return run_check(verdict_suite.path, verdict_suite.overrides, repeat=2)


@slow
def test_each_task_of_the_suite_gets_its_verdict(suite_result):
    got = {v.task_id: v.verdict for v in suite_result.verdicts}
    assert got == EXPECTED, {v.task_id: v.reason for v in suite_result.verdicts if got[v.task_id] != EXPECTED[v.task_id]}


@slow
def test_a_failed_reference_solution_scores_zero_with_its_reason(suite_result):
    v = next(v for v in suite_result.verdicts if v.task_id == "broken-solution")
    # The untouched workspace scores 0.5 (the no-op shows it); the failed solution must not.
    assert v.oracle_scores == (0.0, 0.0) and v.noop_score == 0.5
    assert "solve.sh exited 3" in v.reason and "patch does not apply" in v.reason


@slow
def test_reasons_name_what_decided_the_verdict(suite_result):
    by = {v.task_id: v for v in suite_result.verdicts}
    assert by["flaky-verifier"].oracle_scores in ((1.0, 0.0), (0.0, 1.0))
    assert "needs the network" in by["network-verifier"].reason
    assert "RUN pip install" in by["run-step"].reason and "sandbox=docker" in by["run-step"].reason
    assert "tests/test.sh is missing" in by["no-verifier"].reason
    assert by["trivial-task"].noop_score == 1.0 and by["ok-task"].noop_score == 0.0
    assert by["run-step"].oracle_scores == () and by["no-verifier"].oracle_scores == ()  # never ran


@slow
def test_verdicts_are_written_as_parquet_markdown_and_an_ok_split_file(suite_result, tmp_path):
    paths = write(suite_result, tmp_path / "out")
    rows = pq.read_table(paths["parquet"]).to_pylist()
    assert {r["task_id"]: r["verdict"] for r in rows} == EXPECTED
    assert next(r for r in rows if r["task_id"] == "broken-solution")["oracle_scores"] == [0.0, 0.0]
    md = paths["markdown"].read_text()
    assert "| flaky-verifier | flaky |" in md and "7 tasks: 1 ok, 1 trivial, 1 broken, 1 flaky" in md
    import dataclasses

    one_split = dataclasses.replace(suite_result, benchmark_cfg={"splits": {"test": 1.0}, "split_seed": 0})
    assert write_split_file(one_split, tmp_path / "ok.json") == {"test": ["ok-task"]}
    assert json.loads((tmp_path / "ok.json").read_text()) == {"test": ["ok-task"]}
    with pytest.raises(ValueError, match="would get no task"):  # one ok task cannot fill three splits
        write_split_file(suite_result, tmp_path / "three.json")


def test_missing_images_are_unrunnable_before_anything_runs(tmp_path, fake_docker):
    suite = tmp_path / "suite"
    make_task(suite, "prebuilt-missing", dockerfile="", toml_extra='docker_image = "registry.example/gone:1"\n')
    (suite / "prebuilt-missing" / "environment" / "Dockerfile").unlink()
    make_task(suite, "base-missing")  # FROM python:3.11-slim, which the fake host lacks
    make_task(suite, "base-present")
    result = run_check(suite, ["sandbox=docker", f"sandbox.docker=[{fake_docker}]",
                               "sandbox.base_image_override=null"], noop=False)
    by = {v.task_id: v for v in result.verdicts}
    assert by["prebuilt-missing"].verdict == "unrunnable" and "registry.example/gone:1 is not on" in by[
        "prebuilt-missing"].reason
    assert by["base-missing"].verdict == "unrunnable" and "starts FROM it" in by["base-missing"].reason
    assert "python:3.11-slim" in by["base-missing"].reason
    # With a base image the host holds, the task would run (here: the fake daemon cannot).
    present = run_check(suite, ["sandbox=docker", f"sandbox.docker=[{fake_docker}]",
                                "sandbox.base_image_override=present:1"], noop=False)
    assert "base-present" not in {v.task_id for v in present.verdicts if "not on the Docker host" in v.reason}


@slow
def test_the_command_line_checks_a_suite_and_exits_1_when_a_task_is_not_ok(tmp_path, fake_docker):
    suite = tmp_path / "suite"
    make_task(suite, "base-missing")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "milo_ray.tasks", "check", str(suite), "--no-noop", "sandbox=docker",
                           "--out", str(tmp_path / "out"), f"sandbox.docker=[{fake_docker}]"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "unrunnable" in proc.stdout and (tmp_path / "out" / "verdicts.parquet").is_file()
    bad = subprocess.run([sys.executable, "-m", "milo_ray.tasks", "check", str(tmp_path / "nowhere")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "no such file or directory" in bad.stderr


@slow
def test_the_bundled_suite_is_all_ok(ray_local):
    result = run_check(REPO / "milo_ray" / "data" / "harbor_tasks", ["execution.num_cpus=2"])
    assert len(result.verdicts) == 15
    assert {v.task_id: v.verdict for v in result.verdicts if v.verdict != "ok"} == {}
