"""CI's rotation (scripts/ci_rotation.py): any three consecutive commits check every
mutation and every slow test file, a change to a guarded file gets its mutation checked
at once, and the slow suite's ``--rotation`` option deselects exactly the other parts."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

ci_rotation = importlib.import_module("ci_rotation")
mutation_check = importlib.import_module("mutation_check")


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout


def _commit(repo: Path, path: str, text: str) -> ci_rotation.Rotation:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    _git(repo, "add", path)
    _git(repo, "commit", "-q", "-m", f"edit {path}")
    return ci_rotation.rotation_of(repo)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    return tmp_path


def _slow_test_files() -> list[str]:
    # Every test file could hold slow tests: the property is asked of all of them.
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))


def test_any_three_consecutive_commits_check_every_mutation_and_every_slow_test_file(repo):
    rotations = [_commit(repo, "notes.txt", f"commit {i}") for i in range(6)]
    assert [r.part for r in rotations] == [1, 2, 0, 1, 2, 0]
    slow_files = _slow_test_files()
    assert len(slow_files) > 100
    for start in range(len(rotations) - 2):
        window = rotations[start:start + 3]
        checked = {m.name for r in window for m in mutation_check.rotated(list(mutation_check.MUTATIONS), r)}
        assert checked == {m.name for m in mutation_check.MUTATIONS}
        run = {f for r in window for f in slow_files if r.runs_slow_file(f)}
        assert run == set(slow_files)
    # ... and each part alone is a real share, not everything: the rotation saves time.
    for r in rotations[:3]:
        assert 0 < len(mutation_check.rotated(list(mutation_check.MUTATIONS), r.with_part(r.part))) < len(
            mutation_check.MUTATIONS)


def test_a_mutation_whose_guarded_file_changed_is_checked_whatever_its_part(repo):
    m = mutation_check.MUTATIONS[0]
    other = next(p for p in range(ci_rotation.PARTS) if p != ci_rotation.part_of(m.name))
    before = _commit(repo, "notes.txt", "unrelated").with_part(other)
    assert not before.checks_mutation(m.name, m.file)
    touched = _commit(repo, m.file, "changed").with_part(other)
    assert m.file in touched.touched
    assert touched.checks_mutation(m.name, m.file)
    # Older changes age out after TOUCHED_COMMITS newer commits.
    for i in range(ci_rotation.TOUCHED_COMMITS):
        aged = _commit(repo, "notes.txt", f"later {i}").with_part(other)
    assert not aged.checks_mutation(m.name, m.file)


def test_a_shallow_clone_still_gets_a_deterministic_part_and_says_it_has_no_guarantee(repo, tmp_path_factory):
    for i in range(3):
        _commit(repo, "notes.txt", f"commit {i}")
    shallow = tmp_path_factory.mktemp("shallow") / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True,
                   capture_output=True)
    a, b = ci_rotation.rotation_of(shallow), ci_rotation.rotation_of(shallow)
    assert a.part == b.part and "shallow" in a.why and "no rotation guarantee" in a.why


def test_the_slow_suites_rotation_option_deselects_exactly_the_other_parts():
    """``pytest -m slow --rotation --rotation-part K`` keeps every slow test of part K's files
    and no other (collected for real, over tests/entry, which has slow files in every part)."""
    def collect(*args: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "-m", "slow", *args, "tests/entry"], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return {line.strip() for line in out.stdout.splitlines() if "::" in line}

    every = collect()
    files = {n.split("::", 1)[0] for n in every}
    assert {ci_rotation.part_of(f) for f in files} == set(range(ci_rotation.PARTS))
    part = ci_rotation.part_of(sorted(files)[0])
    kept = collect("--rotation", f"--rotation-part={part}")
    assert kept == {n for n in every if ci_rotation.part_of(n.split("::", 1)[0]) == part}


def test_a_ci_run_number_picks_the_part_so_consecutive_runs_cover_everything(repo, monkeypatch):
    _commit(repo, "notes.txt", "one commit")
    parts = []
    for n in (41, 42, 43):
        monkeypatch.setenv(ci_rotation.RUN_NUMBER_ENV, str(n))
        rot = ci_rotation.rotation_of(repo)
        assert f"CI run {n}" in rot.why
        parts.append(rot.part)
    assert sorted(parts) == [0, 1, 2]
    monkeypatch.setenv(ci_rotation.RUN_NUMBER_ENV, "latest")
    with pytest.raises(ValueError, match="MILO_CI_RUN_NUMBER='latest'"):
        ci_rotation.rotation_of(repo)
