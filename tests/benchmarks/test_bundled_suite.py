"""The bundled Harbor suite (milo_ray/data/harbor_tasks): every task is well formed, is not
solved by its untouched workspace, and is solved by its reference solution -- all run under
bubblewrap, offline, with the host standing in for the tasks' python:3.11-slim image.

The product's bwrap sandbox is tested on its own; this file drives ``bwrap`` directly so the
suite's own guarantees do not depend on it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

import milo_ray

SUITE = Path(milo_ray.__file__).parent / "data" / "harbor_tasks"
TASKS = sorted(p.name for p in SUITE.iterdir() if (p / "task.toml").is_file())
REQUIRED = ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh",
            "tests/run_checks.py", "tests/test_outputs.py", "solution/solve.sh")
# Paths the sandbox provides itself; the rest of the host's root is bound read-only.
OWN = {"app", "logs", "tests", "solution", "tmp", "dev", "proc"}
# The host's system python (no pytest, no site packages of the dev environment) stands in
# for the image's, so a task that needs anything beyond the standard library fails here.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def copy_lines(task: Path) -> list[tuple[str, str]]:
    """The Dockerfile's COPY (source, destination) pairs."""
    return [tuple(line.split()[1:3]) for line in (task / "environment" / "Dockerfile").read_text().splitlines()
            if line.startswith("COPY ")]


def workspace(task: Path, tmp: Path) -> dict[str, Path]:
    """Host directories for /app (environment files copied per COPY), /logs, /tests, /solution."""
    dirs = {name: tmp / name for name in ("app", "logs", "tests", "solution")}
    dirs["app"].mkdir()
    dirs["logs"].mkdir()
    shutil.copytree(task / "tests", dirs["tests"])
    shutil.copytree(task / "solution", dirs["solution"])
    for src, dest in copy_lines(task):
        assert dest.startswith("/app"), f"{task.name}: COPY outside /app: {dest}"
        source, target = task / "environment" / src, dirs["app"] / dest.removeprefix("/app").strip("/")
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / source.name if dest.endswith("/") else target)
    return dirs


def run_in_bwrap(dirs: dict[str, Path], command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    args = ["bwrap", "--die-with-parent", "--unshare-net", "--clearenv", "--setenv", "PATH", PATH,
            "--setenv", "HOME", "/tmp"]
    # `--ro-bind / /` cannot create /app etc. on a read-only root, so the root's entries
    # are bound one by one (symlinks such as /bin -> usr/bin recreated as symlinks).
    for entry in sorted(Path("/").iterdir()):
        if entry.name in OWN:
            continue
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry), str(entry)]
        else:
            args += ["--ro-bind", str(entry), str(entry)]
    for name in ("app", "logs", "tests", "solution"):
        args += ["--bind", str(dirs[name]), f"/{name}"]
    args += ["--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc", "--chdir", "/app", "bash", "-c", command]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def verify(dirs: dict[str, Path]) -> tuple[float, dict]:
    shutil.rmtree(dirs["logs"] / "verifier", ignore_errors=True)
    proc = run_in_bwrap(dirs, "bash /tests/test.sh")
    reward_file = dirs["logs"] / "verifier" / "reward.txt"
    assert reward_file.is_file(), f"no reward written:\n{proc.stdout}\n{proc.stderr}"
    ctrf = json.loads((dirs["logs"] / "verifier" / "ctrf.json").read_text())
    return float(reward_file.read_text()), ctrf


def failures(ctrf: dict) -> str:
    return "\n".join(f"{t['name']}: {t.get('message', '')}" for t in ctrf["results"]["tests"] if t["status"] != "passed")


@needs_bwrap
@pytest.mark.parametrize("name", TASKS)
def test_task_unsolved_by_default_and_solved_by_reference(name, tmp_path):
    dirs = workspace(SUITE / name, tmp_path)
    reward, ctrf = verify(dirs)
    assert 0 <= reward < 1, f"{name}: the untouched workspace already scores {reward}"
    summary = ctrf["results"]["summary"]
    assert summary["tests"] >= 4 and summary["failed"] >= 1, f"{name}: {summary}"

    solved = run_in_bwrap(dirs, "bash /solution/solve.sh")
    assert solved.returncode == 0, f"{name}: solve.sh failed:\n{solved.stdout}\n{solved.stderr}"
    reward, ctrf = verify(dirs)
    assert reward == 1.0, f"{name}: reference solution scores {reward}:\n{failures(ctrf)}"
    results = ctrf["results"]
    assert results["tool"]["name"] == "unittest"
    assert results["summary"]["tests"] == results["summary"]["passed"] == len(results["tests"]) >= 4
    assert results["summary"]["failed"] == 0
    assert all(t["status"] == "passed" and t["name"] for t in results["tests"])


@pytest.mark.parametrize("name", TASKS)
def test_task_structure(name):
    task = SUITE / name
    for rel in REQUIRED:
        assert (task / rel).is_file(), f"{name}: missing {rel}"
    assert "/app" in (task / "instruction.md").read_text(), f"{name}: instruction does not name /app"

    lines = [line for line in (task / "environment" / "Dockerfile").read_text().splitlines() if line.strip()]
    assert lines[:2] == ["FROM python:3.11-slim", "WORKDIR /app"], f"{name}: {lines[:2]}"
    assert lines[2:] and all(re.fullmatch(r"COPY \S+ /app/\S*", line) for line in lines[2:]), f"{name}: {lines}"
    for src, _ in copy_lines(task):
        assert (task / "environment" / src).exists(), f"{name}: COPY source {src} missing"

    toml = tomllib.loads((task / "task.toml").read_text())
    assert toml["version"] == "1.0"
    meta = toml["metadata"]
    assert meta["difficulty"] in ("easy", "medium", "hard") and meta["category"] and meta["tags"], f"{name}: {meta}"
    assert 0 < toml["agent"]["timeout_sec"] <= 3600 and 0 < toml["verifier"]["timeout_sec"] <= 600
    env = toml["environment"]
    assert (env["cpus"], env["memory_mb"], env["allow_internet"]) == (1, 1024, False), f"{name}: {env}"


def test_suite_shape_and_one_shared_runner():
    assert 12 <= len(TASKS) <= 20, TASKS
    difficulties = [tomllib.loads((SUITE / t / "task.toml").read_text())["metadata"]["difficulty"] for t in TASKS]
    for level in ("easy", "medium", "hard"):
        assert difficulties.count(level) >= 3, (level, difficulties)
    # One runner and one test.sh, byte for byte, in every task (each tests/ dir ships alone).
    for shared in ("tests/run_checks.py", "tests/test.sh"):
        assert len({(SUITE / t / shared).read_bytes() for t in TASKS}) == 1, f"{shared} differs between tasks"
    assert len((SUITE / TASKS[0] / "tests" / "run_checks.py").read_text().splitlines()) < 60
    readme = (SUITE / "README.md").read_text()
    assert all(f"`{t}`" in readme for t in TASKS), "README.md does not list every task"
