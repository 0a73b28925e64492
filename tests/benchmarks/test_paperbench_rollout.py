"""A PaperBench rollout for real: a harness in a bwrap sandbox looks for the rubric and the
judge's addendum everywhere it can read, leaves a submission, and is graded through the
scripted grader after its processes are dead; and ``tasks check`` on the fixture."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from milo_ray.benchmarks.paperbench import PaperBenchBenchmark
from milo_ray.execution.agent_executor import AgentExecutor
from milo_ray.harness.model import Harness

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # a cold harness process in a sandbox, a grading sandbox

PAPERS = Path(__file__).parents[1] / "fixtures" / "paperbench" / "papers"
REPO = Path(__file__).resolve().parents[2]
KEY_ENV = "MILO_PAPERBENCH_TEST_KEY"

PROBE = '''
import json, os, subprocess
from langchain_core.messages import AIMessage, HumanMessage

# Split so that this file itself does not hold them: the judge's note and a rubric leaf's id.
SECRETS = ("JUDGE" + "-ONLY NOTE", "impl" + "-mask")


def build_agent(model, backend):
    class Probe:
        async def astream(self, inputs, config=None, stream_mode=None):
            seen = sorted(os.listdir("/home/paper"))
            hits = subprocess.run(
                "timeout 120 grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                + " ".join("-e '" + s + "'" for s in SECRETS) + " / 2>/dev/null | head -20",
                shell=True, capture_output=True, text=True).stdout.split()
            os.makedirs("/home/submission", exist_ok=True)
            with open("/home/submission/attention.py", "w") as f:
                f.write("def scaled_dot_product(q, k, v):\\n    return q\\n")
            with open("/home/submission/probe.json", "w") as f:
                json.dump({"paper": seen, "hits": hits}, f)
            yield {"messages": [HumanMessage(content="go"), AIMessage(content="PROBE " + json.dumps(hits))]}
    return Probe()
'''


def test_the_harness_cannot_read_the_rubric_or_judge_addendum_and_grading_is_the_graders(tmp_path):
    os.environ[KEY_ENV] = "sk-unused-" + uuid.uuid4().hex
    bench = PaperBenchBenchmark(str(PAPERS / "tiny-attention"), splits={"search": 1})
    task = bench.tasks("search")[0]
    ex = AgentExecutor(model={"solver": "openai/none", "api_base": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV,
                              "max_retries": 0},
                       sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                       scratch_dir=str(tmp_path), grader={"scripted": True, "max_calls": 10})
    assert ex.unsupported_tasks([task]) == []
    res = asyncio.run(ex.aexecute(Harness.from_source(PROBE, name="probe"), task, 0, 0))
    steps = json.dumps(res.trace["trajectory"], default=str)
    assert "PROBE []" in steps, steps[-2000:]  # nothing it could read names the rubric or the judge's notes
    verifier = res.trace["verifier"]["details"]
    # What it left was graded: scaled_dot_product is there, causal_mask is not (weights 2 and 1).
    assert res.score == pytest.approx(2 / 3) and res.error_kind is None
    assert verifier["plan"]["leaves_graded"] == 2 and verifier["submission"]["files"] == 2
    grader = res.trace["grader"]
    assert len(grader["calls"]) == 2 and all(c["model"] == "scripted-grader" for c in grader["calls"])
    # The grader's tokens are not the solver's: the harness made no model call.
    assert res.input_tokens == 0 and res.output_tokens == 0 and res.trace["trajectory"]["calls"] == []


def test_tasks_check_judges_each_paper_by_its_reference_submission_or_says_it_has_none(tmp_path):
    # The fixture's papers, one of whose reference submissions misses what a leaf asks for.
    papers = tmp_path / "papers"
    shutil.copytree(PAPERS, papers)
    layernorm = papers / "tiny-layernorm" / "reference_submission" / "layernorm.py"
    layernorm.write_text("def layer_norm(x, eps=1e-5):\n    return (x - x.mean()) / (x.var() + eps) ** 0.5\n")
    env = {**os.environ, "RAY_TMPDIR": os.environ.get("RAY_TMPDIR", str(tmp_path / "ray"))}
    out = subprocess.run([sys.executable, "-m", "milo_ray.tasks", "check", str(papers), "benchmark=paperbench",
                          "executor.grader.scripted=true", "sandbox=bwrap", "--out", str(tmp_path / "check")],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]  # not every paper is ok
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in (tmp_path / "check" / "verdicts.md").read_text().splitlines()
            if ln.startswith("| tiny-")}
    assert "| ok |" in rows["tiny-attention"] and "the reference solution scores 1, doing nothing 0" in \
        rows["tiny-attention"]
    assert "| broken |" in rows["tiny-layernorm"] and "0.667" in rows["tiny-layernorm"], rows["tiny-layernorm"]
    assert "| unrunnable |" in rows["tiny-momentum"] and "reference_submission/" in rows["tiny-momentum"]
    refused = subprocess.run([sys.executable, "-m", "milo_ray.tasks", "check", str(PAPERS)], capture_output=True,
                             text=True, cwd=REPO, env=env, timeout=600)
    assert refused.returncode == 2 and "executor.grader" in refused.stderr


def test_the_llm_grader_is_metered_by_the_gateway_and_capped(tmp_path):
    from milo_ray.execution.grader import GraderSettings
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply
    from test_paperbench import REFERENCE, grade

    os.environ[KEY_ENV] = "sk-grader-" + uuid.uuid4().hex
    answer = reply('{"score": 1, "reason": "attention.py defines it"}', prompt_tokens=1000, completion_tokens=20)
    with ScriptedOpenAIServer([answer]) as srv:
        settings = GraderSettings.of({"llm": {"model": "openai/scripted", "api_base": srv.url, "api_key_env": KEY_ENV,
                                              "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0,
                                              "max_retries": 0}, "max_calls": 1})
        g = settings.for_rollout("h/tiny-attention/0")
        verdict, _ = grade(REFERENCE, tmp_path, g)
        answered = len(srv.answered)
        sent = json.dumps(srv.requests)
    assert answered == 1 and len(g.calls) == 1 and g.refused == 1  # the second leaf was refused, not sent
    call = g.calls[0]
    assert (call["input_tokens"], call["output_tokens"]) == (1000, 20)
    assert call["cost_usd"] == pytest.approx(1000 * 1e-6 + 20 * 2e-6)
    assert os.environ[KEY_ENV] not in sent  # the key stays in the gateway
    assert verdict.score == pytest.approx(2 / 3)  # impl-scores passed; impl-mask refused counts as 0


def test_reproduce_sh_runs_in_the_bwrap_grading_sandbox_and_its_outputs_are_graded(tmp_path):
    # tiny-layernorm's loss leaf asks for a value only its reference reproduce.sh writes.
    from milo_ray.tasks.executor import ORACLE

    def rollout(**options):
        bench = PaperBenchBenchmark(str(PAPERS / "tiny-layernorm"), splits={"search": 1}, mode="full", **options)
        ex = AgentExecutor(agent="oracle", sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                           scratch_dir=str(tmp_path), grader={"scripted": True})
        return asyncio.run(ex.aexecute(ORACLE, bench.tasks("search")[0], 0, 0))

    ran, plain = rollout(reproduce=True, reproduce_timeout_s=120), rollout()
    assert ran.score == 1.0 and ran.error_kind is None, ran.error
    details = ran.trace["verifier"]["details"]
    rep = details["reproduction"]
    assert (rep["ran"], rep["exit_code"], rep["timed_out"]) == (True, 0, False) and "training done" in rep["log_tail"]
    assert plain.score == pytest.approx(0.75) and "reproduction" not in plain.trace["verifier"]["details"]


CLONER = '''
import os
from langchain_core.messages import AIMessage, HumanMessage


def build_agent(model, backend):
    class Cloner:
        async def astream(self, inputs, config=None, stream_mode=None):
            os.makedirs("/home/submission", exist_ok=True)
            with open("/home/submission/attention.py", "w") as f:
                f.write("def scaled_dot_product(q, k, v):\\n    return q\\n")
            url = "https://github.com/example/" + "tiny-attention"
            call = {"id": "c1", "name": "bash", "args": {"command": "git clone " + url}}
            yield {"messages": [HumanMessage(content="go"), AIMessage(content="", tool_calls=[call])]}
    return Cloner()
'''


def test_an_attempt_that_reached_the_papers_own_code_is_void(tmp_path):
    os.environ[KEY_ENV] = "sk-unused-" + uuid.uuid4().hex
    task = PaperBenchBenchmark(str(PAPERS / "tiny-attention"), splits={"search": 1}).tasks("search")[0]
    ex = AgentExecutor(model={"solver": "openai/none", "api_base": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV,
                              "max_retries": 0},
                       sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                       scratch_dir=str(tmp_path), grader={"scripted": True, "max_calls": 10})
    res = asyncio.run(ex.aexecute(Harness.from_source(CLONER, name="cloner"), task, 0, 0))
    details = res.trace["verifier"]["details"]
    # Graded as it stands (2/3 of the rubric), then void: it reached the paper's own repository.
    assert details["score_before_voiding"] == pytest.approx(2 / 3)
    assert res.score == 0.0 and res.error_kind == "harness"
    assert "blacklisted resource (https://github.com/example/tiny-attention)" in res.error
