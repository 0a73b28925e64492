"""The verdict decision (milo_ray.tasks.verdicts.decide) and the static network hint,
without running anything: each rule, and the order in which they apply."""

from __future__ import annotations

from milo_ray.core.tasks import Task
from milo_ray.tasks.static import network_hint
from milo_ray.tasks.verdicts import Graded, StaticFindings, decide

CLEAN = StaticFindings()
NET_ERROR = "reward 0 but the test runner needs the network (its output shows a failed download); output: ..."


def verdict(oracle, noop=Graded(0.0), static=CLEAN):
    return decide("t", static, [Graded(*o) if isinstance(o, tuple) else Graded(o) for o in oracle], noop).verdict


def test_ok_needs_the_oracle_at_one_and_doing_nothing_below_one():
    assert verdict([1.0], Graded(0.99)) == "ok"
    assert verdict([1.0, 1.0], Graded(0.0)) == "ok"


def test_trivial_when_doing_nothing_already_scores_one():
    assert verdict([1.0], Graded(1.0)) == "trivial"


def test_broken_when_the_oracle_is_below_one_and_the_reason_is_its_error():
    v = decide("t", CLEAN, [Graded(0.0, "task t: the gold patch does not apply: error: corrupt patch", "task")] * 2)
    assert v.verdict == "broken" and "gold patch does not apply" in v.reason
    assert verdict([0.5, 0.5]) == "broken"
    assert "scored the reference solution 0.5" in decide("t", CLEAN, [Graded(0.5)]).reason


def test_flaky_when_the_oracle_runs_disagree_even_if_one_is_perfect():
    assert verdict([1.0, 0.0]) == "flaky"
    assert verdict([0.5, 0.0]) == "flaky"
    assert verdict([1.0, 1.0, 0.75]) == "flaky"


def test_needs_network_only_on_a_failed_fetch_step_never_on_the_static_hint_alone():
    assert verdict([(0.0, NET_ERROR, "task")]) == "needs-network"
    hinted = StaticFindings(network_hint="the verifier runs `pip install pytest` and the task has no internet access")
    # A fetch step in the script is a note: only the run's output shows it failing.
    v = decide("t", hinted, [Graded(0.0)], Graded(0.0))
    assert v.verdict == "broken" and v.notes == (f"static: {hinted.network_hint}",)
    # A verifier that installs from the network but passes offline works here: ok.
    assert verdict([1.0], static=hinted) == "ok"
    # The words inside the verifier's quoted output (what a test printed) are not the note.
    assert verdict([(0.0, "reward 0; output: this task needs the network (says a test)", "task")]) == "broken"
    solve_then_verify = "task t: solve.sh exited 1; output: x; verifier: reward 0 but " + NET_ERROR.split(" but ", 1)[1]
    assert verdict([(0.0, solve_then_verify, "task")]) == "needs-network"


def test_a_static_blocker_and_an_infra_failure_come_first():
    blocked = StaticFindings(blocker=("needs-docker", "RUN apt-get"))
    assert verdict([1.0], static=blocked) == "needs-docker"
    assert verdict([(1.0, "docker build failed", "infra")]) == "unrunnable"
    assert verdict([]) == "unrunnable"


def _task(test_sh: str, tmp_path) -> Task:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test.sh").write_text(test_sh)
    return Task("t", "check", "x", 60, 1, metadata={"format": "harbor", "task_dir": str(tmp_path)})


def test_the_network_hint_reads_the_verifier_script(tmp_path):
    assert "pip install pytest" in network_hint(_task("#!/bin/bash\npip install pytest==8.3\npytest\n", tmp_path), False)
    assert "curl" in network_hint(_task("curl -LsSf https://astral.sh/uv/install.sh | sh\n", tmp_path), False)
    assert network_hint(_task("# pip install pytest (done in the image)\necho pip-installed\npytest\n", tmp_path),
                        False) == ""
    assert network_hint(_task("pip install pytest\n", tmp_path), True) == ""  # the task has internet access
    # A probe of a blocked URL keeps nothing it fetches: not a fetch step.
    assert network_hint(_task("curl -sS -o /dev/null http://blocked.example/ || echo blocked\n", tmp_path), False) == ""
    swe = Task("s", "check", "x", 60, 1, metadata={"format": "swe", "test_cmd": "pip install -e . && pytest -rA"})
    assert "pip install" in network_hint(swe, False)
