"""Kill the driver mid-run (SIGKILL), resume from the store, and reach exactly the
state of an uninterrupted run: same lineage, assignment and stall counters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUNNER = Path(__file__).with_name("milo_resume_runner.py")


def _run(run_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(RUNNER.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(RUNNER), str(run_dir), str(out), *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _progress_rows(run_dir: Path) -> int:
    from milo_ray.store.parquet import ParquetRunStore  # noqa: F401  (layout owner)
    import pyarrow.dataset as ds

    path = run_dir / "events"
    if not path.exists():
        return 0
    try:
        t = ds.dataset(str(path), format="parquet").to_table(columns=["kind"]).to_pylist()
    except Exception:
        return 0
    return sum(r["kind"] == "milo.progress" for r in t)


@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path):
    ref_out = tmp_path / "ref.json"
    ref = _run(tmp_path / "ref", ref_out)
    victim_dir = tmp_path / "victim"
    victim = _run(victim_dir, tmp_path / "unused.json")
    deadline = time.monotonic() + 600
    while _progress_rows(victim_dir) < 4 and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert victim.poll() is None, "the run finished before it could be killed; " + victim.stderr.read().decode()[-2000:]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    resumed_out = tmp_path / "resumed.json"
    resumed = _run(victim_dir, resumed_out, "--resume")
    for p in (ref, resumed):
        assert p.wait(timeout=900) == 0, p.stderr.read().decode()[-3000:]
    a, b = json.loads(ref_out.read_text()), json.loads(resumed_out.read_text())
    assert a["assignment"] == b["assignment"]
    assert a["islands"].keys() == b["islands"].keys()
    for j in a["islands"]:
        assert a["islands"][j]["rounds"] == b["islands"][j]["rounds"]
        assert a["islands"][j]["stall"] == b["islands"][j]["stall"]
        assert a["islands"][j]["nodes"] == b["islands"][j]["nodes"]
