"""benchmark=paperbench: rubric scores from scripted verdicts, judge failures under both
conventions, the grading plan's cost bounds, and the grader role's budget and ledger."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from milo_ray.benchmarks.paperbench import PAPERBENCH, PaperBenchBenchmark
from milo_ray.benchmarks.paperbench.judge import SUBMISSION, parse_verdict
from milo_ray.benchmarks.paperbench.rubric import aggregate, parse_rubric, select
from milo_ray.core.rollouts import RolloutResult
from milo_ray.execution.grader import GraderSettings

FIXTURE = Path(__file__).parents[1] / "fixtures" / "paperbench"
PAPERS = FIXTURE / "papers"
REFERENCE = PAPERS / "tiny-attention" / "reference_submission"
BROKEN = FIXTURE / "submissions" / "broken"


class DirSandbox:
    """The grading sandbox's file view over a host directory standing in for /home/submission."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def execute(self, command: str, timeout: int | None = None):
        out = subprocess.run(["bash", "-c", command.replace(SUBMISSION, str(self.root))], capture_output=True,
                             text=True, timeout=timeout)
        return SimpleNamespace(output=out.stdout, exit_code=out.returncode)

    def download_files(self, paths):
        got = []
        for p in paths:
            host = Path(p.replace(SUBMISSION, str(self.root)))
            got.append(SimpleNamespace(path=p, content=host.read_bytes() if host.is_file() else None,
                                       error=None if host.is_file() else "file_not_found"))
        return got


def task(paper: str = "tiny-attention", **options):
    bench = PaperBenchBenchmark(str(PAPERS / paper), splits={"search": 1}, **options)
    return bench.tasks("search")[0]


def grade(submission: Path, tmp_path: Path, grader=None, paper: str = "tiny-attention", **options):
    work = tmp_path / "submission"
    shutil.copytree(submission, work)
    grader = grader or GraderSettings.of({"scripted": True}).for_rollout("h/t/0")
    verdict = PAPERBENCH.verify(task(paper, **options), DirSandbox(work), grader=grader)
    return verdict, grader


def test_reference_submission_scores_one_and_broken_scores_zero_in_codedev(tmp_path):
    good, g = grade(REFERENCE, tmp_path / "a")
    bad, _ = grade(BROKEN, tmp_path / "b")
    assert good.score == 1.0 and bad.score == 0.0
    assert good.details["plan"]["mode"] == "codedev" and good.details["plan"]["leaves_graded"] == 2
    assert len(g.calls) == 2  # one grader call per graded leaf
    assert set(good.details["categories"]) == {"Code Development"}
    leaf = good.details["tree"]["sub_tasks"][0]["sub_tasks"][1]
    assert leaf["id"] == "impl-mask" and leaf["status"] == "graded" and "causal_mask" in leaf["reason"]


def test_full_mode_grades_every_category(tmp_path):
    verdict, g = grade(REFERENCE, tmp_path, mode="full")
    assert verdict.score == 1.0 and len(g.calls) == 4
    assert set(verdict.details["categories"]) == {"Code Development", "Code Execution", "Result Analysis"}


def test_scores_propagate_as_weighted_averages(tmp_path):
    # impl-scores (weight 2) passes, impl-mask (weight 1) fails: impl = 2/3; exec and results pass.
    root = parse_rubric(__import__("json").loads((PAPERS / "tiny-attention" / "rubric.json").read_text()))
    plan = select(root, mode="full")
    verdicts = {"impl-scores": {"score": 1}, "impl-mask": {"score": 0}, "exec": {"score": 1}, "results": {"score": 0}}
    got = aggregate(plan.tree, verdicts)
    assert got["score"] == pytest.approx((3 * 2 / 3 + 1 * 1 + 1 * 0) / 5)
    assert got["categories"]["Code Development"] == pytest.approx(2 / 3)


def test_a_judge_failure_counts_as_zero_or_is_dropped_with_its_weight(tmp_path):
    failing = {"scripted": True, "fail": ["leaf:impl-mask"]}
    zero, _ = grade(REFERENCE, tmp_path / "z", GraderSettings.of(failing).for_rollout("x"), judge_failures="zero")
    drop, _ = grade(REFERENCE, tmp_path / "d", GraderSettings.of(failing).for_rollout("x"), judge_failures="drop")
    assert zero.score == pytest.approx(2 / 3) and zero.details["graded_weight_fraction"] == pytest.approx(1.0)
    assert drop.score == 1.0 and drop.details["graded_weight_fraction"] == pytest.approx(2 / 3)
    assert zero.details["judge_failed_leaves"] == drop.details["judge_failed_leaves"] == 1
    assert "not a verdict" in zero.details["tree"]["sub_tasks"][0]["sub_tasks"][1]["error"]


def test_grader_calls_are_capped_per_rollout(tmp_path):
    g = GraderSettings.of({"scripted": True, "max_calls": 1}).for_rollout("h/t/0")
    verdict, _ = grade(REFERENCE, tmp_path, g)
    assert len(g.calls) == 1 and g.refused == 1 and g.record()["refused"] == 1
    assert verdict.score == pytest.approx(2 / 3)  # the refused leaf counts as a judge failure (zero)
    tokens = GraderSettings.of({"scripted": True, "max_tokens": 1}).for_rollout("h/t/0")
    grade(REFERENCE, tmp_path / "t", tokens)
    assert len(tokens.calls) == 1 and tokens.refused == 1


def test_leaf_sample_and_depth_cap_bound_the_grader_calls_and_are_recorded(tmp_path):
    sampled, g = grade(REFERENCE, tmp_path / "s", mode="full", max_leaves=2)
    assert len(g.calls) == 2 and sampled.details["plan"]["max_leaves"] == 2
    assert sampled.details["plan"]["leaves_in_mode"] == 4 and sampled.details["graded_weight_fraction"] < 1
    capped, g2 = grade(REFERENCE, tmp_path / "c", mode="full", max_depth=1)
    assert len(g2.calls) == 3 and capped.details["plan"]["max_depth"] == 1  # impl graded as one requirement


def test_rubric_errors_name_the_node_and_field():
    with pytest.raises(ValueError, match=r"sub_tasks\[0\]\.weight=-1.*sub_tasks\[1\]\.task_category"):
        parse_rubric({"id": "r", "requirements": "x", "weight": 1, "sub_tasks": [
            {"id": "a", "requirements": "x", "weight": -1, "task_category": "Code Development"},
            {"id": "b", "requirements": "x", "weight": 1}]})


def test_verdict_parsing_takes_only_a_score_and_a_reason():
    assert parse_verdict('sure: {"score": 1, "reason": "ok"}') == {"score": 1, "reason": "ok"}
    assert parse_verdict('{"score": 0.7}') is None and parse_verdict('{"score": true}') is None
    assert parse_verdict("yes") is None


def test_the_agents_paper_folder_never_holds_the_rubric_or_judge_addendum():
    t = task()
    spec = PAPERBENCH.sandbox_spec(t)
    (src, dest), = spec.copy_in
    names = {str(p.relative_to(src)) for p in Path(src).rglob("*")}
    assert dest == "/home" and spec.workdir == "/home"
    assert {"paper/paper.md", "paper/addendum.md", "paper/assets/table1.md", "submission"} <= names
    assert not {n.rsplit("/", 1)[-1] for n in names} & {"rubric.json", "judge.addendum.md", "reference_submission"}
    assert "JUDGE-ONLY" not in t.instruction


def test_grader_calls_are_recorded_as_role_grader_never_as_the_solvers():
    from milo_ray.search.agent_calls import AgentCallLog
    from milo_ray.store.memory import MemoryRunStore

    store = MemoryRunStore()
    log = AgentCallLog(store, caps={})
    calls = [{"purpose": "leaf:a", "model": "scripted-grader", "started_at": 1.0, "input_tokens": 100,
              "output_tokens": 10, "cost_usd": 0.0, "seconds": 0.01, "retries": 0, "error": None}]
    res = RolloutResult("h", "t", 0, score=1.0, input_tokens=5, output_tokens=7, trace={
        "trajectory": {"calls": []}, "grader": {"calls": calls}})
    res.cache_key, res.round = "k", 0
    log.record_rollout_calls(res)
    rows = store.read("agent_calls").to_pylist()
    assert [(r["role"], r["input_tokens"]) for r in rows] == [("grader", 100)]
    assert log.spend("grader").tokens == 110 and log.spend("solver").tokens == 0


def test_grader_settings_refuse_bad_input_naming_the_field():
    assert GraderSettings.of({"llm": None, "scripted": False}) is None
    with pytest.raises(ValueError, match="executor.grader.max_calls"):
        GraderSettings.of({"scripted": True, "max_calls": 0})
    with pytest.raises(ValueError, match="choose one"):
        GraderSettings.of({"scripted": True, "llm": {"model": "openai/x"}})
    with pytest.raises(ValueError, match="unknown key"):
        GraderSettings.of({"scripted": True, "calls": 3})


def test_only_a_format_that_asks_gets_the_grader():
    from milo_ray.execution.agent_executor import AgentExecutor

    seen = {}

    class Plain:
        def verify(self, task, sandbox):
            seen["plain"] = True
            return SimpleNamespace(grader=None)

    class Asks:
        uses_grader = True

        def verify(self, task, sandbox, grader=None):
            seen["grader"] = grader
            grader.ask("s", "<requirement>`x`</requirement><submission>x</submission>", purpose="leaf:x")
            return SimpleNamespace(grader=None)

    ex = AgentExecutor.__new__(AgentExecutor)
    ex.grader, ex._secrets = GraderSettings.of({"scripted": True}), None
    t = SimpleNamespace(task_id="t")
    ex._verify(Plain(), t, None, "l")
    v = ex._verify(Asks(), t, None, "l")
    assert seen["plain"] and seen["grader"] is not None and len(v.grader["calls"]) == 1
    ex.grader = None
    with pytest.raises(ValueError, match="executor.grader"):
        ex._verify(Asks(), t, None, "l")


def test_a_reached_grader_role_cap_stops_new_rollouts_that_need_the_grader():
    # The scheduler asks the agent ledger before it starts each rollout (RolloutScheduler._pump).
    from milo_ray.llm.usage import AgentUsage
    from milo_ray.search.agent_calls import AgentCallLog, RoleCap
    from milo_ray.store.memory import MemoryRunStore

    plain = SimpleNamespace(task_id="plain", format=None)
    calls = AgentCallLog(MemoryRunStore(), caps={"grader": RoleCap(tokens=100)})
    assert calls.grader_refusal(task()) is None
    calls.record("grader", AgentUsage(100, 10, 0.0), call_id="k:grader:1")
    assert "run.budget.roles.grader" in calls.grader_refusal(task())
    assert calls.grader_refusal(plain) is None  # a task that needs no grader still runs
    assert calls.grader_refusal(None) is None


def test_a_failing_grader_endpoint_is_an_infrastructure_failure_not_a_zero(tmp_path):
    from milo_ray.execution.grader import GraderUnavailable

    class Down:
        def ask(self, system, user, *, purpose):
            raise GraderUnavailable("grader call failed: APIConnectionError")

    with pytest.raises(GraderUnavailable):
        grade(REFERENCE, tmp_path, Down())


def test_the_evidence_a_mutator_reads_holds_every_leafs_verdict_and_reason(tmp_path):
    from milo_ray.harness.evidence import write_evidence_dir
    from milo_ray.harness.model import Harness

    t = task()
    verdict, _ = grade(BROKEN, tmp_path / "b")
    good, _ = grade(REFERENCE, tmp_path / "g")
    results = []
    for i, v in enumerate((verdict, good)):
        res = RolloutResult("h", t.task_id, i, score=v.score, trace={
            "trajectory": {"steps": []}, "verifier": {"score": v.score, "output": v.output, "details": v.details}})
        results.append(res)
    edir = write_evidence_dir(tmp_path / "evidence", Harness.from_source("def build_agent(m, b): pass\n"), results,
                              [t])
    worst = (edir / "traces" / t.task_id / "graded.md").read_text()
    assert "**FAIL** `impl-scores`" in worst and "**FAIL** `impl-mask`" in worst
    assert "reason: missing from the submission: causal_mask" in worst
    # Each rollout keeps its own, the one that passed included.
    best = (edir / "traces" / t.task_id / "rollout-1" / "graded.md").read_text()
    assert "**PASS** `impl-mask`" in best and "rubric score" in best and "1.000" in best


LAYERNORM = PAPERS / "tiny-layernorm" / "reference_submission"


class Recording:
    """A grader that passes every leaf and keeps what each call was shown."""

    def __init__(self):
        self.asked: dict[str, tuple[str, str]] = {}

    def ask(self, system, user, *, purpose):
        self.asked[purpose] = (system, user)
        return '{"score": 1, "reason": "shown"}'


def test_reproduce_runs_before_the_judge_and_what_it_wrote_is_graded(tmp_path):
    # The loss leaf asks for a value only the reproduction writes (loss.json).
    without, _ = grade(LAYERNORM, tmp_path / "n", paper="tiny-layernorm", mode="full")
    ran, _ = grade(LAYERNORM, tmp_path / "r", paper="tiny-layernorm", mode="full", reproduce=True)
    loss = lambda v: next(c for c in v.details["tree"]["sub_tasks"] if c["id"] == "loss")  # noqa: E731
    assert loss(without)["score"] == 0 and "final_loss" in loss(without)["reason"]
    assert "reproduction" not in without.details
    assert loss(ran)["score"] == 1 and ran.score == 1.0
    rep = ran.details["reproduction"]
    assert (rep["ran"], rep["exit_code"], rep["timed_out"]) == (True, 0, False) and "training done" in rep["log_tail"]
    assert (tmp_path / "r" / "submission" / "reproduce.log").read_text() == "training done\n"
    assert "reproduce.sh: exit 0" in ran.output
    graded = PAPERBENCH.evidence_files({"details": ran.details})["graded.md"]
    assert "reproduce.sh, run before grading: exit 0" in graded


def test_only_execution_and_result_leaves_are_shown_the_reproduction(tmp_path):
    g = Recording()
    grade(REFERENCE, tmp_path, g, mode="full", reproduce=True, reproduce_timeout_s=60)
    shown = {p.split(":", 1)[1] for p, (system, user) in g.asked.items() if "<reproduction>" in user}
    assert shown == {"exec", "results"} and len(g.asked) == 4
    system, user = g.asked["leaf:exec"]
    assert "reproduce.sh" in system and "exited with status" in user


def test_a_reproduction_past_its_time_limit_is_stopped_and_recorded(tmp_path):
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "reproduce.sh").write_text("echo started\nsleep 60\necho never\n")
    verdict, _ = grade(slow, tmp_path, paper="tiny-layernorm", mode="full", reproduce=True, reproduce_timeout_s=1)
    rep = verdict.details["reproduction"]
    assert rep["timed_out"] and rep["exit_code"] == 124 and rep["log_tail"] == "started\n"
    assert "stopped at its limit" in verdict.output
    (tmp_path / "none").mkdir()
    none, _ = grade(tmp_path / "none", tmp_path / "x", mode="full", reproduce=True)
    assert none.details["reproduction"]["ran"] is False and "reproduce.sh" in none.details["reproduction"]["error"]


def test_reproduce_is_refused_outside_full_mode_and_adds_its_limit_to_the_grading_time():
    with pytest.raises(ValueError, match="benchmark.reproduce=true with benchmark.mode=codedev"):
        task(reproduce=True)
    with pytest.raises(ValueError, match="benchmark.reproduce_timeout_s"):
        task(mode="full", reproduce=True, reproduce_timeout_s=0)
    plain, timed = task(mode="full"), task(mode="full", reproduce=True, reproduce_timeout_s=900)
    assert timed.grading_cap_s > plain.grading_cap_s + 900
    assert "reproduce.sh is run" in timed.instruction and "is not run" in plain.instruction
