"""SWE-style JSONL rows: field variants, all problems at once with line numbers, pytest
-rA parsing, and grading/solving a real git repository in a real (bwrap) sandbox."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from milo_ray.benchmarks.swe import SWE, SweBenchmark, parse_pytest_log
from milo_ray.core.tasks import format_of
from milo_ray.testing.swe_repo import FAIL_TO_PASS, PASS_TO_PASS, calc_repo

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("git") is None,
                                 reason="bwrap and git needed")


def row(iid: str, **kw) -> dict:
    base = {"instance_id": iid, "repo": "o/r", "base_commit": "abc", "problem_statement": f"fix {iid}",
            "FAIL_TO_PASS": ["tests/t.py::test_a"], "PASS_TO_PASS": [], "image_name": f"img/{iid}:1"}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_rows_in_both_cases_and_json_string_lists_load(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [
        row("a__1", install_config={"test_cmd": "pytest -rA"}),
        row("b__2", FAIL_TO_PASS=None, PASS_TO_PASS=None, fail_to_pass='["t::x", "t::y"]', pass_to_pass='["t::z"]',
            image_name=None, dockerhub_tag="org/img:b2", workdir="/app"),
        row("c__3", FAIL_TO_PASS=json.dumps(["t::c"]), PASS_TO_PASS="", image_name=None, docker_image="c:1"),
    ])
    bench = SweBenchmark(path=str(f), splits={"train": 2, "test": 1}, test_cmd="python -m pytest -rA")
    a, b, c = bench.task("a__1"), bench.task("b__2"), bench.task("c__3")
    assert a.metadata["test_cmd"] == "pytest -rA" and b.metadata["test_cmd"] == "python -m pytest -rA"
    assert b.metadata["fail_to_pass"] == ["t::x", "t::y"] and b.metadata["pass_to_pass"] == ["t::z"]
    assert c.metadata["fail_to_pass"] == ["t::c"] and c.metadata["pass_to_pass"] == []
    assert b.metadata["docker_image"] == "org/img:b2" and c.metadata["docker_image"] == "c:1"
    assert a.metadata["workdir"] == "/testbed" and b.metadata["workdir"] == "/app"
    assert a.instruction == "fix a__1" and a.time_cap_s == 7200.0 and format_of(a) is SWE
    spec = SWE.sandbox_spec(b)
    assert spec.docker_image == "org/img:b2" and spec.workdir == "/app" and spec.allow_internet is False
    assert sorted(len(v) for v in bench.splits().values()) == [1, 2]
    json.dumps(a.metadata)


def test_image_template_fills_rows_without_an_image(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [row("django__django-1", image_name=None)])
    bench = SweBenchmark(path=str(f), splits={"test": 1.0}, test_cmd="pytest -rA",
                         image_template="swebench/sweb.eval.x86_64.{instance_id_docker}:latest")
    assert bench.task("django__django-1").metadata["docker_image"] == "swebench/sweb.eval.x86_64.django_1776_django-1:latest"


def test_every_bad_row_is_reported_at_once_with_its_line(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [
        row("ok"),
        "{not json",
        row("noimg", image_name=None),
        row("badlist", FAIL_TO_PASS="not a list"),
        row("empty", FAIL_TO_PASS=[]),
        row("ok"),
        row(None, repo=""),
    ])
    with pytest.raises(ValueError) as e:
        SweBenchmark(path=str(f), test_cmd=None)
    msg = str(e.value)
    for needle in ("x.jsonl", "line 1 (ok): no install_config.test_cmd", "line 2: not valid JSON",
                   "line 3 (noimg): no image_name", "line 4 (badlist): FAIL_TO_PASS is a string but not a JSON list",
                   "line 5 (empty): FAIL_TO_PASS and PASS_TO_PASS are both empty",
                   "line 6 (ok): instance_id 'ok' appears twice", "line 7: instance_id is missing",
                   "line 7: repo is missing"):
        assert needle in msg, needle


def test_pytest_rA_and_verbose_lines_are_parsed():
    out = """tests/t.py::test_v PASSED                                     [ 33%]
tests/t.py::test_w[a-b] FAILED                                [ 66%]
=========================== short test summary info ============================
PASSED tests/t.py::test_a
PASSED tests/t.py::test_p[1 2]
FAILED tests/t.py::test_b - AssertionError: assert 1 == 2
ERROR tests/t.py::test_c - RuntimeError: boom
XFAIL tests/t.py::test_d - reason
SKIPPED [1] tests/t.py:9: no
"""
    assert parse_pytest_log(out) == {
        "tests/t.py::test_v": "PASSED", "tests/t.py::test_w[a-b]": "FAILED", "tests/t.py::test_a": "PASSED",
        "tests/t.py::test_p[1 2]": "PASSED", "tests/t.py::test_b": "FAILED", "tests/t.py::test_c": "ERROR",
        "tests/t.py::test_d": "XFAIL", "[1] tests/t.py:9: no": "SKIPPED"}


@pytest.fixture
def swe_repo(tmp_path):
    """A tiny package with a bug in ``sub``; returns (row, factory of a fresh checkout)."""
    repo = calc_repo(tmp_path / "src")
    src = repo.path
    r = row("calc__1", base_commit=repo.base_commit, patch=repo.gold_patch, test_patch=repo.test_patch,
            FAIL_TO_PASS=json.dumps(FAIL_TO_PASS), PASS_TO_PASS=PASS_TO_PASS,
            install_config={"test_cmd": "python3 -m pytest -rA --tb=no -p no:cacheprovider"})
    bench = SweBenchmark(path=str(write_jsonl(tmp_path / "t.jsonl", [r])), splits={"test": 1.0})
    task = bench.task("calc__1")
    counter = iter(range(100))

    def checkout():
        from milo_ray.testing.dir_sandbox import DirSandbox

        sb = DirSandbox.from_spec(SWE.sandbox_spec(task), tmp_path / f"sb{next(counter)}")
        shutil.copytree(src, sb.host_path("/testbed"), dirs_exist_ok=True)
        return sb

    return task, checkout


@needs_bwrap
def test_verify_scores_the_fraction_of_listed_tests_and_resets_the_agents_test_edits(swe_repo):
    task, checkout = swe_repo
    with checkout() as sb:
        # The agent "passes" by writing its own test_sub; grading must use the row's tests.
        sb.execute("printf 'from calc import add\\ndef test_add():\\n    assert True\\n"
                   "def test_sub():\\n    assert True\\n' > tests/test_calc.py")
        v = SWE.verify(task, sb)
    assert v.error is None and v.score == 0.5
    assert v.reward["fail_to_pass"] == 0.0 and v.reward["pass_to_pass"] == 1.0
    assert {t["name"]: t["status"] for t in v.ctrf["results"]["tests"]} == {
        "tests/test_calc.py::test_sub": "failed", "tests/test_calc.py::test_add": "passed"}


@needs_bwrap
def test_solve_applies_the_gold_patch_and_then_every_listed_test_passes(swe_repo):
    task, checkout = swe_repo
    with checkout() as sb:
        assert SWE.solve(task, sb) is None
        v = SWE.verify(task, sb)
        assert v.score == 1.0 and v.error is None and v.ctrf["results"]["summary"]["passed"] == 2
        assert "does not apply" in SWE.solve(task, sb)  # already applied


@needs_bwrap
def test_a_test_command_with_unparseable_output_is_a_task_error(swe_repo):
    import dataclasses

    task, checkout = swe_repo
    task = dataclasses.replace(task, metadata={**task.metadata, "test_cmd": "echo no such runner; false"})
    with checkout() as sb:
        v = SWE.verify(task, sb)
    assert v.score == 0.0 and "no test results parsed" in v.error and "no such runner" in v.error


def test_the_config_group_builds_the_benchmark(tmp_path):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    f = write_jsonl(tmp_path / "x.jsonl", [row(f"r__{i}") for i in range(10)])
    cfg = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "benchmark" / "swe.yaml")
    assert cfg.pop("defaults")  # its usual executor, for Hydra; not a constructor argument
    bench = instantiate(cfg, path=str(f), test_cmd="pytest -rA")
    assert {k: len(v) for k, v in bench.splits().items()} == {"search": 5, "val": 3, "test": 2}
    assert len(bench.seed_harnesses()) == 5


@needs_bwrap
def test_a_gold_patch_that_does_not_apply_scores_zero_with_the_reason_not_the_untouched_trees_score(swe_repo):
    # The untouched tree passes test_add (PASS_TO_PASS), half the listed tests: graded as
    # is, a broken gold patch would score 0.5 and look half right.
    import dataclasses

    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.harness.model import Harness

    task, checkout = swe_repo
    broken = dataclasses.replace(task, metadata={**task.metadata, "patch": task.metadata["patch"].replace(
        "-    return a + b", "-    return a * b")})

    class Checkouts:
        name = "dir"

        def unsupported(self, spec):
            return None

        def open(self, spec, scratch, **_):
            return checkout()

    executor = AgentExecutor(sandbox=Checkouts(), agent="oracle")
    oracle = Harness.from_source("# the oracle ignores the harness\n")
    with checkout() as sb:
        assert SWE.verify(broken, sb).score == 0.5  # what the untouched tree scores
    result = executor.execute(oracle, broken, 0, 0)
    assert result.score == 0.0 and result.error_kind == "task"
    assert "the gold patch does not apply" in result.error
    assert result.trace["verifier"]["score"] == 0.5  # the verifier's own view is kept for diagnosis
    good = executor.execute(oracle, task, 0, 0)
    assert good.score == 1.0 and good.error is None
