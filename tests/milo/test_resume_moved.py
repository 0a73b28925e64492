"""A lock-step MILO run killed mid-way, its directory moved and its ``workspace/``
(harness directories, evidence) deleted, resumes from its tables and blobs alone: the
recorded node paths are rebuilt under the new directory, the harness and evidence
directories a mutation or graft reads are rewritten, and the run reaches the state an
uninterrupted run reaches, running every rollout exactly once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import milo_resume_checks as checks
import pytest
from milo_resume_checks import KilledRun, RayInstance

pytestmark = pytest.mark.slow  # three sessions of a MILO run (~1-2 minutes)


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory):
    ray = RayInstance(tmp_path_factory.mktemp("ray") / "ray.err")
    yield ray
    ray.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, ray_instance) -> KilledRun:
    run = KilledRun(tmp_path_factory.mktemp("reference") / "run", free=False, ray=ray_instance)
    run.complete()
    return run


def _move(run: KilledRun, to) -> None:
    """Move the run directory and drop its workspace: only the store's tables and blobs
    (and the test's own call log) go along, as when a run is resumed from a bucket."""
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(run.run_dir), str(to))
    for f in run.run_dir.parent.glob(f"{run.run_dir.name}.session*"):
        shutil.move(str(f), str(to.parent / f.name))
    shutil.rmtree(to / "workspace")
    run.run_dir = to


@pytest.fixture(scope="module")
def moved_run(tmp_path_factory, ray_instance) -> KilledRun:
    run = KilledRun(tmp_path_factory.mktemp("first") / "run", free=False, ray=ray_instance)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    # Killed once islands have admitted children (their parents' evidence is read by the
    # next mutation), then again after a graft's child (a graft reads both parents).
    run.die_at("after milo.node:node_id=0-1")
    assert (run.run_dir / "workspace" / "harnesses").is_dir()
    _move(run, elsewhere / "a" / "run")
    run.die_at("before milo.heldout:node_id=d0-1-g0")
    _move(run, elsewhere / "b" / "run")
    run.complete()
    return run


def test_a_moved_run_without_its_workspace_reaches_the_uninterrupted_state(moved_run, reference):
    checks.assert_same_state(reference.state, moved_run.state)
    checks.assert_run_finished(moved_run)


def test_a_moved_run_without_its_workspace_runs_every_rollout_once(moved_run):
    checks.assert_no_rollout_run_twice(moved_run.run_dir)
    checks.assert_each_node_recorded_once(moved_run.run_dir)
    checks.assert_no_recorded_work_redone(moved_run)


def test_a_moved_run_rewrites_the_files_its_mutations_read_under_its_new_directory(moved_run):
    # Every mutation request the resumed sessions wrote names a parent directory and an
    # evidence directory under the run's current directory, both present.

    requests = sorted((moved_run.run_dir / "workspace" / "mutations").glob("island-*/round-*.request.json"))
    assert requests, "no mutation request was written after the move"
    for path in requests:
        req = json.loads(path.read_text())
        for key in ("parent_dir", "evidence_dir"):
            assert req[key].startswith(str(moved_run.run_dir)), (path, key, req[key])
        assert req["evidence_files"], (path, "the parent's evidence is empty")
        assert (Path(req["parent_dir"]) / "harness.py").is_file(), (path, "the parent's harness was not rewritten")
