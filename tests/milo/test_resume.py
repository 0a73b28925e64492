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


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["assignment"] == b["assignment"]
    assert a["islands"].keys() == b["islands"].keys()
    for j in a["islands"]:
        assert a["islands"][j]["rounds"] == b["islands"][j]["rounds"]
        assert a["islands"][j]["stall"] == b["islands"][j]["stall"]
        assert a["islands"][j]["nodes"] == b["islands"][j]["nodes"]


@pytest.fixture(scope="module")
def reference_state(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("reference")
    ref = _run(d / "run", d / "state.json")
    assert ref.wait(timeout=900) == 0, ref.stderr.read().decode()[-3000:]
    return json.loads((d / "state.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("kill_point", [
    "milo.node:island=1,origin=seed",  # initialization: island 0 seeded, island 1 not yet
    "milo.heldout:node_id=0-2",  # a round's child recorded, its held-out score not
    "milo.progress:island=0,rounds_done=2",  # held-out recorded, the round not closed
    "milo.heldout:node_id=d0-1-g0",  # a graft's child recorded, the move not finished
    "milo.move_done:decision_id=d1-2,kind=speciate",  # a new island created, the move not marked done
])
def test_a_run_killed_between_two_steps_resumes_to_the_uninterrupted_state(tmp_path, reference_state, kill_point):
    victim = _run(tmp_path / "run", tmp_path / "unused.json", "--die-before", kill_point)
    assert victim.wait(timeout=900) == 3, "the kill point was never reached: " + victim.stderr.read().decode()[-2000:]
    resumed = _run(tmp_path / "run", tmp_path / "resumed.json", "--resume")
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read().decode()[-3000:]
    _assert_same_state(reference_state, json.loads((tmp_path / "resumed.json").read_text()))


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
    _assert_same_state(json.loads(ref_out.read_text()), json.loads(resumed_out.read_text()))
