"""Harbor task directories: loading the real-world variants, Dockerfile analysis, env
templates, all problems reported at once, and grading in a real (bwrap) sandbox."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from milo_ray.benchmarks.harbor import HARBOR, HarborBenchmark, read_reward
from milo_ray.benchmarks.harbor_task import analyze_dockerfile, parse_size_mb
from milo_ray.core.tasks import format_of

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not installed")

PASS_TEST = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def make_task(root: Path, name: str, *, toml: str = 'version = "1.0"\n', dockerfile: str | None = "FROM ubuntu:24.04\nWORKDIR /app\n",
              test_sh: str = PASS_TEST, solve_sh: str | None = None, files: dict[str, str] | None = None,
              instruction: str = "Write 42 to /app/answer.txt.\n") -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "environment").mkdir()
    if instruction is not None:
        (d / "instruction.md").write_text(instruction)
    if toml is not None:
        (d / "task.toml").write_text(textwrap.dedent(toml))
    if dockerfile is not None:
        (d / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    (d / "tests" / "test.sh").write_text(test_sh)
    if solve_sh is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(solve_sh)
    for rel, text in (files or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def one_task(root: Path, **kw):
    make_task(root, "t", **kw)
    bench = HarborBenchmark(path=str(root), splits={"test": 1.0})
    return bench.tasks("test")[0]


def test_legacy_and_schema_versioned_task_toml_both_load(tmp_path):
    make_task(tmp_path, "legacy", toml="""
        version = "1.0"
        [agent]
        timeout_sec = 120.0
        [verifier]
        timeout_sec = 60
        [environment]
        cpus = 2
        memory = "2G"
        storage = "10G"
    """)
    make_task(tmp_path, "modern", toml="""
        schema_version = "1.3"
        [agent]
        timeout_sec = 900
        [environment]
        memory_mb = 4096
        storage_mb = 2048
        allow_internet = true
        docker_image = "ghcr.io/x/y:1"
    """)
    bench = HarborBenchmark(path=str(tmp_path), splits={"search": 1, "test": 1}, split_seed=3)
    legacy, modern = bench.task("legacy"), bench.task("modern")
    assert legacy.time_cap_s == 120.0 and legacy.metadata["verifier_timeout_s"] == 60.0
    assert legacy.metadata["memory_mb"] == 2048 and legacy.metadata["storage_mb"] == 10240
    assert legacy.metadata["cpus"] == 2.0 and legacy.metadata["allow_internet"] is False
    assert modern.time_cap_s == 900.0 and modern.metadata["verifier_timeout_s"] == 600.0  # default
    assert modern.metadata["memory_mb"] == 4096 and modern.metadata["allow_internet"] is True
    assert modern.metadata["format"] == "harbor" and modern.metadata["task_dir"] == str((tmp_path / "modern").resolve())
    assert legacy.instruction.startswith("Write 42") and legacy.token_cap == 20_000_000
    # Ships to workers: plain values, and the task directory as a packed tree.
    json.dumps({k: v for k, v in legacy.metadata.items() if k != "files"})
    assert legacy.metadata["files"].origin == legacy.metadata["task_dir"]
    assert format_of(modern) is HARBOR
    spec = HARBOR.sandbox_spec(modern)
    assert spec.docker_image == "ghcr.io/x/y:1" and spec.memory_mb == 4096 and spec.allow_internet


def test_network_mode_none_means_no_internet(tmp_path):
    task = one_task(tmp_path, toml='version = "1.0"\n[environment]\nnetwork_mode = "none"\n')
    assert task.metadata["allow_internet"] is False
    assert parse_size_mb("512M") == 512 and parse_size_mb(1024) == 1024 and parse_size_mb("1.5GB") == 1536


def test_workdir_from_dockerfile_then_environment_then_default(tmp_path):
    a = make_task(tmp_path, "a", dockerfile="FROM x\nWORKDIR /srv\nWORKDIR code\n",
                  toml='version = "1.0"\n[environment]\nworkdir = "/ignored"\n')
    make_task(tmp_path, "b", dockerfile="FROM x\n", toml='version = "1.0"\n[environment]\nworkdir = "/work/b"\n')
    make_task(tmp_path, "c", dockerfile="FROM x\n")
    bench = HarborBenchmark(path=str(tmp_path), splits={"test": 1.0})
    assert bench.task("a").metadata["workdir"] == "/srv/code"  # last WORKDIR, relative to the previous
    assert bench.task("b").metadata["workdir"] == "/work/b"
    assert bench.task("c").metadata["workdir"] == "/app"
    context = Path(HARBOR.sandbox_spec(bench.task("a")).build_context)
    # The task's files as shipped to a node, not the directory it was read from.
    assert context == bench.task("a").metadata["files"].local_path() / "environment" != a / "environment"
    assert (context / "Dockerfile").read_text() == (a / "environment" / "Dockerfile").read_text()


def test_copy_lines_become_copy_in_resolved_against_workdir(tmp_path):
    task = one_task(tmp_path, dockerfile="""
        FROM python:3.12-slim
        WORKDIR /app
        ENV MODE=fast GREETING="hi there"
        COPY data.csv ./
        COPY --chown=1000 ["src", "lib/"]
        ADD notes.txt /opt/notes.md
        CMD ["bash"]
    """, files={"environment/data.csv": "a,b\n", "environment/src/m.py": "x=1\n", "environment/notes.txt": "n"})
    env = task.metadata["files"].local_path() / "environment"
    spec = HARBOR.sandbox_spec(task)
    assert spec.copy_in == ((str(env / "data.csv"), "/app/data.csv"), (str(env / "src"), "/app/lib"),
                            (str(env / "notes.txt"), "/opt/notes.md"))
    assert spec.env == {"MODE": "fast", "GREETING": "hi there"}
    assert spec.needs_docker is None and task.metadata["base_image"] == "python:3.12-slim"
    assert "approximated by the host" in task.metadata["host_note"]


def test_run_step_makes_the_task_need_docker(tmp_path):
    task = one_task(tmp_path, dockerfile="FROM ubuntu\nWORKDIR /app\nRUN apt-get update && apt-get install -y jq\n")
    reason = HARBOR.sandbox_spec(task).needs_docker
    assert reason and "Dockerfile:3: RUN apt-get update" in reason and "sandbox=docker" in reason
    facts = analyze_dockerfile("FROM a AS b\nFROM c\nUSER app\n", tmp_path)
    assert "multi-stage" in facts.needs_docker and "1 more" in facts.needs_docker

    class Bwrapish:
        name = "bwrap"

        def unsupported(self, spec):
            return f"task {spec.task_id}: {spec.needs_docker}" if spec.needs_docker else None

    bench = HarborBenchmark(path=str(tmp_path), splits={"test": 1.0})
    assert [r.split(":")[0] for r in bench.unsupported_tasks(Bwrapish())] == ["task t"]


def test_env_templates_resolve_from_host_and_secrets_never_enter_metadata(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", "s3cr3t-value")
    monkeypatch.setenv("REGION", "eu")
    task = one_task(tmp_path, toml="""
        version = "1.0"
        [environment.env]
        API_TOKEN = "${MY_API_TOKEN}"
        WHERE = "region-${REGION}"
        LEVEL = "${UNSET_LEVEL_VAR:-3}"
    """)
    assert "s3cr3t-value" not in json.dumps(task.metadata, default=repr)
    assert task.metadata["env"]["API_TOKEN"] == "${MY_API_TOKEN}"
    assert HARBOR.sandbox_spec(task).env == {"API_TOKEN": "s3cr3t-value", "WHERE": "region-eu", "LEVEL": "3"}


def test_a_broken_suite_reports_every_problem_at_once(tmp_path):
    make_task(tmp_path, "ok")
    make_task(tmp_path, "no_instruction", instruction=None)
    make_task(tmp_path, "bad_version", toml='schema_version = "2.0"\n')
    make_task(tmp_path, "bad_timeout", toml='version = "1.0"\n[agent]\ntimeout_sec = -5\n[environment]\nmemory = "lots"\n')
    make_task(tmp_path, "missing_copy", dockerfile="FROM x\nCOPY nothere.txt /app/\n")
    make_task(tmp_path, "unset_env", toml='version = "1.0"\n[environment.env]\nK = "${SURELY_UNSET_VAR_XYZ}"\n')
    make_task(tmp_path, "bad_toml", toml="version = \n")
    with pytest.raises(ValueError) as e:
        HarborBenchmark(path=str(tmp_path))
    msg = str(e.value)
    assert str(tmp_path.resolve()) in msg and "7 problem(s)" in msg
    for needle in ("task no_instruction: instruction.md is missing", "task bad_version: task.toml version '2.0'",
                   "task bad_timeout: task.toml [agent] timeout_sec=-5", "task bad_timeout: task.toml [environment] memory",
                   "task missing_copy: environment/Dockerfile:2: COPY source 'nothere.txt'",
                   "task unset_env: task.toml [environment.env].K uses ${SURELY_UNSET_VAR_XYZ}",
                   "task bad_toml: task.toml does not parse"):
        assert needle in msg
    assert "task ok" not in msg


def test_reward_json_wins_and_its_variants_are_read():
    assert read_reward(b'{"reward": 0.25, "tests": 4, "note": "x"}', b"1")[:2] == (0.25, {"reward": 0.25, "tests": 4.0})
    assert read_reward(b'{"reward": 1}', None)[0] == 1.0  # an int reward
    assert read_reward(b"1", None)[0] == 1.0
    assert read_reward(b'{"a": 1.0, "b": 0.5}', None)[0] == 0.75  # sub-rewards: the mean
    assert read_reward(b'{"passed": 3, "total": 5}', None)[2].startswith("reward.json has no 'reward'")
    assert read_reward(None, b" 0.5\n")[0] == 0.5
    assert read_reward(None, b"2")[2] == "reward.txt=2.0 is outside [0, 1]"
    assert read_reward(None, b"1.0000000001")[0] == 1.0
    assert read_reward(b"{oops", b"1")[2].startswith("reward.json is not valid JSON")


@needs_bwrap
def test_verify_passes_a_solved_workspace_and_fails_an_unsolved_one(tmp_path):
    from milo_ray.testing.dir_sandbox import DirSandbox

    task = one_task(tmp_path / "suite", solve_sh="echo 42 > answer.txt\n")
    with DirSandbox.from_spec(HARBOR.sandbox_spec(task), tmp_path / "sb1") as sb:
        # Planted by the agent: reward.json would win over the verifier's reward.txt.
        sb.execute("mkdir -p /logs/verifier && echo '{\"reward\": 1}' > /logs/verifier/reward.json")
        v = HARBOR.verify(task, sb)
        assert v.score == 0.0 and v.error is None and v.reward == {"reward": 0.0}
    with DirSandbox.from_spec(HARBOR.sandbox_spec(task), tmp_path / "sb2") as sb:
        assert HARBOR.solve(task, sb) is None
        v = HARBOR.verify(task, sb)
        assert v.score == 1.0 and v.error is None


@needs_bwrap
def test_reward_json_from_the_verifier_wins_over_reward_txt_and_ctrf_is_read(tmp_path):
    from milo_ray.testing.dir_sandbox import DirSandbox

    test_sh = """#!/bin/bash
echo 0 > /logs/verifier/reward.txt
echo '{"reward": 0.5, "passed": 1, "failed": 1}' > /logs/verifier/reward.json
echo '{"results": {"summary": {"tests": 2, "passed": 1}}}' > /logs/verifier/ctrf.json
"""
    task = one_task(tmp_path / "suite", test_sh=test_sh)
    with DirSandbox.from_spec(HARBOR.sandbox_spec(task), tmp_path / "sb") as sb:
        v = HARBOR.verify(task, sb)
    assert v.score == 0.5 and v.reward == {"reward": 0.5, "passed": 1.0, "failed": 1.0}
    assert v.ctrf["results"]["summary"]["passed"] == 1


@needs_bwrap
def test_a_verifier_that_cannot_download_its_runner_is_a_task_error_naming_the_network(tmp_path):
    from milo_ray.testing.dir_sandbox import DirSandbox

    test_sh = """#!/bin/bash
curl -LsSf https://astral.sh/uv/install.sh | sh
if uvx pytest /tests/test_outputs.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
    task = one_task(tmp_path / "suite", test_sh=test_sh)
    with DirSandbox.from_spec(HARBOR.sandbox_spec(task), tmp_path / "sb") as sb:
        v = HARBOR.verify(task, sb)
    assert v.score == 0.0 and v.error and "needs the network" in v.error
    no_reward = one_task(tmp_path / "suite2", test_sh="#!/bin/bash\npip download --no-cache-dir nosuchpkg-zz 2>&1 || "
                         "echo 'Could not resolve host: pypi.org'\nexit 1\n")
    with DirSandbox.from_spec(HARBOR.sandbox_spec(no_reward), tmp_path / "sb2") as sb:
        v = HARBOR.verify(no_reward, sb)
    assert v.score == 0.0 and "wrote no /logs/verifier/reward.txt" in v.error and "needs the network" in v.error


@needs_bwrap
def test_solve_reports_a_missing_or_failing_solution(tmp_path):
    from milo_ray.testing.dir_sandbox import DirSandbox

    task = one_task(tmp_path / "a")
    failing = one_task(tmp_path / "b", solve_sh="echo broken >&2\nexit 3\n")
    with DirSandbox.from_spec(HARBOR.sandbox_spec(task), tmp_path / "sb") as sb:
        assert "no solution/solve.sh" in HARBOR.solve(task, sb)
        err = HARBOR.solve(failing, sb)
    assert "solve.sh exited 3" in err and "broken" in err


def test_default_path_is_the_bundled_suite():
    from milo_ray.benchmarks import harbor

    assert harbor.BUNDLED_SUITE == Path(harbor.__file__).resolve().parent.parent / "data" / "harbor_tasks"


def test_the_config_group_builds_the_benchmark_and_seeds_are_checked(tmp_path):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    make_task(tmp_path, "a")
    make_task(tmp_path, "b")
    cfg = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "benchmark" / "harbor.yaml")
    assert cfg.pop("defaults")  # its usual executor, for Hydra; not a constructor argument
    bench = instantiate(cfg, path=str(tmp_path), splits={"search": 1, "test": 1}, seeds=["minimal", "stock"])
    assert sorted(bench.splits()) == ["search", "test"] and bench.name == f"harbor:{tmp_path.name}"
    assert [h.name for h in bench.seed_harnesses()] == ["minimal", "stock"]
    with pytest.raises(ValueError, match="benchmark.seeds: unknown seed harness"):
        HarborBenchmark(path=str(tmp_path), splits={"test": 1.0}, seeds=["nope"])


@needs_bwrap
def test_a_verifier_calling_a_missing_python_says_so(tmp_path):
    from milo_ray.testing.dir_sandbox import DirSandbox

    # An empty PATH stands in for a host without `python` (bash prints "python: command not found").
    task = one_task(tmp_path / "suite", test_sh="#!/bin/bash\nPATH=/nonexistent python -m pytest /tests\n")
    with DirSandbox.from_spec(HARBOR.sandbox_spec(task), tmp_path / "sb") as sb:
        v = HARBOR.verify(task, sb)
    assert v.score == 0.0 and "calls `python`" in v.error and "wrote no" in v.error
