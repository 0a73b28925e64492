"""benchmark=einstein_agent: tasks pair a start with a parent optimizer program; the
agent's workspace holds them and the runner; grading runs the optimizer.py the agent
left, on a fresh start, and scores it exactly. Nothing else in the workspace counts."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from milo_ray.benchmarks.einstein import score, start_values
from milo_ray.benchmarks.einstein.agent_tasks import EINSTEIN_AGENT, EinsteinAgentBenchmark
from milo_ray.benchmarks.einstein.benchmark import SEEDS_DIR
from milo_ray.core.tasks import format_of

bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

STARTS = [{"base": "random", "n": 300, "seed": 0}, {"base": "random", "n": 300, "seed": 1},
          {"base": "alphaevolve"}]


def _bench(**kw) -> EinsteinAgentBenchmark:
    args = dict(problem="first_autocorrelation", starts=STARTS, parents=["lse_adam", "subgradient"], budget_s=3.0,
                grace_s=1.0, splits={"search": 1, "val": 1, "test": 1})
    return EinsteinAgentBenchmark(**{**args, **kw})


def _task(bench: EinsteinAgentBenchmark, tid: str):
    return next(t for ts in bench._splits.values() for t in ts if t.task_id == tid)


def test_a_task_per_start_and_parent_and_a_starts_tasks_share_a_split():
    bench = _bench()
    assert bench.artifact_entry == "build_agent"
    by_split = {name: sorted(t.task_id for t in ts) for name, ts in bench._splits.items()}
    assert sorted(sum(by_split.values(), [])) == sorted(
        f"{s}-{p}" for s in ("first-rand-n300-s0", "first-rand-n300-s1", "first-ae-n600")
        for p in ("lse_adam", "subgradient"))
    for ids in by_split.values():  # one start per split, both of its parents with it
        assert len(ids) == 2 and len({i.rsplit("-", 1)[0] for i in ids}) == 1
    task = _task(bench, "first-rand-n300-s0-lse_adam")
    json.dumps(task.metadata)  # ships to workers as JSON
    assert task.metadata["format"] == "einstein_agent" and format_of(task) is EINSTEIN_AGENT
    assert task.metadata["parent_source"] == (SEEDS_DIR / "lse_adam" / "harness.py").read_text()
    assert task.time_cap_s == 900.0 and task.grading_cap_s > task.metadata["budget_s"]
    start_score = score("first_autocorrelation", start_values(task.metadata["start"], "first_autocorrelation"))
    assert f"{start_score:.10g}" in task.instruction and "/app/optimizer.py" in task.instruction
    assert "`lse_adam` program" in task.instruction
    # The methods evolve agent harnesses, not programs.
    from milo_ray.harness.seeds import SEED_NAMES

    assert sorted(h.name for h in bench.seed_harnesses()) == sorted(SEED_NAMES)
    assert [h.name for h in _bench(seeds=["minimal"]).seed_harnesses()] == ["minimal"]


@pytest.mark.parametrize("kw, field", [
    ({"parents": ["nope"]}, "benchmark.parents"),
    ({"parents_dir": "/nonexistent/programs"}, "benchmark.parents_dir"),
    ({"seeds": ["nope"]}, "benchmark.seeds"),
    ({"agent_time_s": 0}, "benchmark.agent_time_s"),
    ({"token_cap": -1}, "benchmark.token_cap"),
    ({"memory_mb": 64}, "benchmark.memory_mb"),
])
def test_bad_settings_are_refused_naming_the_field(kw, field):
    with pytest.raises(Exception, match=field.replace(".", r"\.")):
        _bench(**kw)


@pytest.fixture(scope="module")
def sandbox_factory():
    from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory

    return BwrapSandboxFactory()


def _open(factory, task):
    return factory.open(EINSTEIN_AGENT.sandbox_spec(task), Path(tempfile.mkdtemp(prefix="einstein-agent-test-")))


@bwrap
def test_the_workspace_holds_start_parent_and_runner_and_python3_has_numpy(sandbox_factory):
    task = _task(_bench(), "first-rand-n300-s1-subgradient")
    with _open(sandbox_factory, task) as sb:
        got = {Path(r.path).name: r.content for r in sb.download_files(
            ["/app/start.npy", "/app/optimizer.py", "/app/run_optimizer.py"])}
        start = np.load(io.BytesIO(got["start.npy"]), allow_pickle=False)
        assert np.array_equal(start, start_values(task.metadata["start"], "first_autocorrelation"))
        assert got["optimizer.py"].decode() == task.metadata["parent_source"]
        assert b"def main(argv" in got["run_optimizer.py"]
        # The agent's python3 is the worker's interpreter, with numpy and scipy.
        r = sb.execute("python3 -c 'import numpy, scipy; print(\"ok\")'")
        assert r.exit_code == 0 and "ok" in r.output, r.output


@bwrap
def test_grading_runs_the_agents_program_on_a_fresh_start_and_scores_it_exactly(sandbox_factory):
    task = _task(_bench(), "first-rand-n300-s0-lse_adam")
    start = start_values(task.metadata["start"], "first_autocorrelation")
    with _open(sandbox_factory, task) as sb:
        # The agent damages its copy of the start: grading uses a fresh one.
        sb.upload_files([("/app/start.npy", b"garbage")])
        v = EINSTEIN_AGENT.verify(task, sb)
    d = v.details
    assert v.error is None and v.score > 0 and d["reason"] is None, v.output
    assert d["start_score"] == score("first_autocorrelation", start)
    assert d["score"] == pytest.approx(score("first_autocorrelation", np.array(d["values"])), rel=1e-12)
    assert d["score"] < d["start_score"] and v.reward["score"] == d["score"]
    assert d["trajectory"] and d["program"] == task.metadata["parent_source"]


FAKE_BEST = """\
import numpy as np
def optimize(values, *, seed, deadline):
    raise RuntimeError("gave up")
"""


@bwrap
@pytest.mark.parametrize("files, reason", [
    ({"/app/optimizer.py": b"this is not python"}, "importing optimizer.py failed"),
    ({"/app/optimizer.py": FAKE_BEST.encode()}, "RuntimeError: gave up"),
    ({"/app/optimizer.py": b"def optimize(values, *, seed, deadline):\n    return None\n"},
     "published no point"),
])
def test_a_failing_program_scores_zero_with_the_reason_and_leftovers_do_not_count(sandbox_factory, files, reason):
    task = _task(_bench(), "first-rand-n300-s0-lse_adam")
    with _open(sandbox_factory, task) as sb:
        # A point left in the workspace (flat heights: far better than the random start)
        # and a status claiming success play no part.
        buf = io.BytesIO()
        np.save(buf, np.ones(300))
        sb.upload_files([*files.items(), ("/app/best.npy", buf.getvalue()),
                         ("/app/status.json", b'{"status": "returned", "error": null}')])
        v = EINSTEIN_AGENT.verify(task, sb)
    assert v.score == 0.0 and v.error is None, v.output  # the harness's failure, not the task's
    assert reason in v.details["reason"] and reason in v.output
    assert v.details["values"] is None


@bwrap
def test_no_program_left_scores_zero(sandbox_factory):
    task = _task(_bench(), "first-rand-n300-s0-lse_adam")
    with _open(sandbox_factory, task) as sb:
        sb.execute("rm /app/optimizer.py")
        v = EINSTEIN_AGENT.verify(task, sb)
    assert v.score == 0.0 and v.error is None and "no /app/optimizer.py" in v.output
