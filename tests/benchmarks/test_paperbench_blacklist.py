"""A paper's blacklist, checked on what the agent did: a tool call that reaches a listed
resource voids the attempt (score 0, with the reason), whatever the rubric said; what a
tool returned (the paper citing its own code) and entries that name no resource do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from milo_ray.benchmarks.paperbench import PaperBenchBenchmark
from milo_ray.benchmarks.paperbench.blacklist import violation
from milo_ray.core.tasks import Verdict
from milo_ray.execution.agent_executor import _AgentRun, _void_if_screened

PAPERS = Path(__file__).parents[1] / "fixtures" / "paperbench" / "papers"
LIST = ["https://github.com/Example/Tiny-Attention", "none", "# the authors' code"]


def _call(name: str, **args) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": name, "args": args}]}


@pytest.mark.parametrize("command", [
    "git clone https://github.com/example/tiny-attention.git /tmp/x",
    "curl -sL github.com/example/tiny-attention/archive/main.zip -o a.zip",
    "pip install git+https://www.github.com/EXAMPLE/tiny-attention",
])
def test_a_tool_call_that_reaches_a_blacklisted_resource_is_a_violation(command):
    steps = [{"role": "user", "content": "go"}, _call("bash", command=command)]
    reason = violation(LIST, steps)
    assert reason is not None and "https://github.com/Example/Tiny-Attention" in reason and "'bash'" in reason


def test_reading_the_paper_that_cites_its_code_and_entries_naming_nothing_are_no_violation():
    steps = [_call("read_file", file_path="/home/paper/paper.md"),
             {"role": "tool", "content": "Code: https://github.com/example/tiny-attention", "name": "read_file"},
             _call("bash", command="git clone https://github.com/example/other-repo")]
    assert violation(LIST, steps) is None
    assert violation(["none", "", "# comment"], [_call("bash", command="echo none")]) is None


def test_a_void_attempt_scores_zero_with_its_reason_and_keeps_the_verifiers_view():
    task = PaperBenchBenchmark(str(PAPERS / "tiny-attention"), splits={"search": 1}).tasks("search")[0]
    run = _AgentRun(status="completed", steps=[_call("bash", command="git clone https://github.com/example/tiny-attention")])
    verdict = Verdict(score=0.75, details={"score": 0.75})
    _void_if_screened(task.format, task, run, verdict)
    assert verdict.score == 0.0 and verdict.details["score_before_voiding"] == 0.75
    assert run.error_kind == "harness" and run.error.startswith("void: the agent reached a blacklisted resource")
    # The reference solution is not an agent: it is never screened.
    oracle = _AgentRun(status="oracle", steps=run.steps)
    kept = Verdict(score=1.0)
    _void_if_screened(task.format, task, oracle, kept)
    assert kept.score == 1.0 and oracle.error is None


def test_internet_is_off_unless_asked_and_checked():
    quiet = PaperBenchBenchmark(str(PAPERS / "tiny-attention"), splits={"search": 1}).tasks("search")[0]
    online = PaperBenchBenchmark(str(PAPERS / "tiny-attention"), splits={"search": 1}, internet=True).tasks("search")[0]
    assert not quiet.format.sandbox_spec(quiet).allow_internet and online.format.sandbox_spec(online).allow_internet
    with pytest.raises(ValueError, match="benchmark.internet"):
        PaperBenchBenchmark(str(PAPERS / "tiny-attention"), internet="yes")
