"""The command line over a run directory that is held, damaged or out of space: a second
driver and a damaged run are bad input (exit 2, one line naming the holder or the file,
nothing written); a run whose disk fills stops with exit 3 and resumes once space is back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from milo_ray.run import EXIT_BAD_INPUT, EXIT_INFRA
from milo_ray.store import ParquetRunStore
from milo_ray.testing.store_contract import make_result
from milo_ray.testing.tmpfs import MountRefused, SmallDisk

ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
QUICK_EVAL = ["method=eval", "method.k=1", "method.names=[minimal]", "run.progress=false", "execution.num_cpus=1"]


def _cli(module: str, args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=ENV)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_a_second_driver_on_a_run_directory_another_holds_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    holder = ParquetRunStore(run_dir, flush_seconds=None)  # this process is the live driver
    try:
        proc = _cli("milo_ray.run", [*QUICK_EVAL, f"run.dir={run_dir}"], tmp_path)
    finally:
        holder.close()
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    assert f"is in use by pid {os.getpid()} on " in _error_line(proc)
    assert not (run_dir / "manifest.json").exists()  # refused before anything was written


def test_a_run_with_a_part_changed_after_it_was_written_is_refused_by_the_report(tmp_path):
    run_dir = tmp_path / "run"
    with ParquetRunStore(run_dir, run_id="r", flush_seconds=None) as s:
        s.write_manifest({"run_id": "r", "status": "finished", "method": "milo_ray.evaluation.EvalMethod"})
        s.append_rollouts([make_result(i) for i in range(3)])
    part = next((run_dir / "rollouts").glob("part-*.parquet"))
    t = pq.read_table(part)
    pq.write_table(t.set_column(t.schema.get_field_index("score"), "score", pc.add(t["score"], 1.0))
                   .replace_schema_metadata(t.schema.metadata), part)
    proc = _cli("milo_ray.report", [str(run_dir)], tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    line = _error_line(proc)
    assert str(part) in line and "content changed after it was written" in line
    assert not (run_dir / "report").exists()


FULL_DISK_EVAL = ["method=eval", "method.k=8", "method.split=test", "benchmark=surrogate_swepro",
                  "run.progress=false", "run.report=false", "execution.num_cpus=2"]


def _rollouts(run_dir: Path) -> list[tuple]:
    return duckdb.sql(f"select cache_key, score from '{run_dir}/rollouts/*.parquet' order by cache_key").fetchall()


@pytest.mark.slow
def test_a_run_whose_disk_fills_stops_with_exit_3_and_resumes_once_space_is_back(tmp_path):
    try:
        disk = SmallDisk(tmp_path / "disk", size_kib=64 << 10)
    except MountRefused as e:
        pytest.skip(str(e))
    try:
        run_dir = disk.path / "run"
        proc = subprocess.Popen([sys.executable, "-m", "milo_ray.run", *FULL_DISK_EVAL, f"run.dir={run_dir}"],
                                cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not list((run_dir / "rollouts").glob("*.parquet")):
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before its disk could fill; make it longer"
        filler = disk.fill()
        try:
            _, stderr = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == EXIT_INFRA, stderr[-3000:]
        assert "error: " in stderr and "no space left on the device holding" in stderr
        before = _rollouts(run_dir)
        assert before and json.loads((run_dir / "manifest.json").read_text())["run_id"]  # whole, readable
        assert not list(run_dir.rglob("*.tmp"))

        filler.unlink()
        resumed = subprocess.run([sys.executable, "-m", "milo_ray.run", f"run.resume={run_dir}",
                                  "run.progress=false", "run.report=false"],
                                 cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        after = _rollouts(run_dir)
        keys = [row[0] for row in after]
        assert len(keys) == len(set(keys)) == 5 * 100 * 8, "every rollout exactly once"
        assert set(before) <= set(after), "nothing stored before the disk filled was lost or changed"
        assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
    finally:
        disk.unmount()


def _finished_run(run_dir: Path, **manifest: object) -> Path:
    with ParquetRunStore(run_dir, run_id="r", flush_seconds=None) as s:
        s.write_manifest({"run_id": "r", "status": "interrupted", "method": "milo_ray.evaluation.EvalMethod",
                          **manifest})
        s.append_rollouts([make_result(i) for i in range(2)])
    return run_dir


def test_a_run_written_by_a_newer_milo_ray_is_refused_by_name_on_resume_and_by_the_results_api(tmp_path):
    from milo_ray.results import RunDirError, load_run

    run_dir = _finished_run(tmp_path / "run", manifest_version=99)
    before = (run_dir / "manifest.json").read_bytes()
    proc = _cli("milo_ray.run", [f"run.resume={run_dir}", "run.progress=false"], tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-3000:]
    assert "manifest.json is from a newer milo_ray (manifest_version 99" in _error_line(proc)
    assert (run_dir / "manifest.json").read_bytes() == before
    with pytest.raises(RunDirError, match="manifest_version 99"):
        load_run(run_dir)


@pytest.mark.parametrize("damage", ["not_an_object", "unreadable"])
def test_a_manifest_that_is_not_a_run_manifest_is_refused_in_one_line(tmp_path, damage):
    from milo_ray.config.errors import UserError
    from milo_ray.manifest import read_manifest
    from milo_ray.results import RunDirError, load_run

    run_dir = _finished_run(tmp_path / "run")
    manifest = run_dir / "manifest.json"
    manifest.unlink()
    if damage == "not_an_object":
        manifest.write_text("[1, 2]")
    else:
        manifest.mkdir()  # reading it fails with an OSError, as an unreadable file would
    with pytest.raises(UserError) as info:
        read_manifest(run_dir)
    assert str(info.value).startswith(f"run.resume={run_dir}: ") and "\n" not in str(info.value)
    with pytest.raises(RunDirError):
        load_run(run_dir)
