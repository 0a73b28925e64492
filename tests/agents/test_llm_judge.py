"""The LLM experience judge against a local OpenAI-compatible server (real HTTP through
litellm and langchain): verdicts become records, bad answers are re-asked with what was
wrong, failed calls keep their usage, long trajectories are condensed to the budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from milo_ray.agents.judges.condense import estimate_tokens
from milo_ray.agents.judges.llm import LLMJudge
from milo_ray.agents.judges.schema import VERDICT_SCHEMA
from milo_ray.agents.prompts import placeholders, render
from milo_ray.ssr import evidence as ev
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, ScriptedOpenAIServer, error, reply

KEY = SCRIPTED_KEY_ENV
GOOD = {"w": 0.7, "a": 0.8, "u": 0.6, "summary": "The agent declared done without running the tests.",
        "suggestions": ["Add a completion gate that runs the test suite before finishing."],
        "insights": "Finishing without running the tests fails tasks whose edge cases the agent never saw.",
        "failure_modes": ["premature_completion"], "mechanisms": ["completion_gate"]}
FEEDBACK = {"score": 0.0, "resolved": False, "timed_out": False, "error_kind": None, "error": None,
            "ctrf": {"results": {"tests": [{"name": "test_edge", "status": "failed", "message": "edge case wrong"}]}},
            "verifier": {"output": "1 failed, 3 passed", "error": None},
            "pool": {"tasks": 8, "resolved_rate": 0.5, "timeout_rate": 0.125, "mean_score": 0.55}}


pytestmark = pytest.mark.usefixtures("key_env")


def llm(srv, **kw):
    return {"model": "openai/scripted", "api_base": srv.url, "api_key_env": KEY, "max_retries": 0,
            "retry_base_s": 0.01, "retry_max_s": 0.05, **kw}


def trajectory(n_units=2, body=40):
    steps = [{"role": "user", "content": "Make the parser accept empty input."}]
    for k in range(n_units):
        steps.append({"role": "assistant", "content": f"action {k}",
                      "tool_calls": [{"id": f"c{k}", "name": "execute", "args": {"command": f"run {k}"}}]})
        steps.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"result {k} " + "y" * body + f" END{k}"})
    steps.append({"role": "assistant", "content": "All done; the change should be complete."})
    for i, s in enumerate(steps):
        s["step"] = i
    return {"task_id": "t1", "steps": steps, "final": {"status": "completed"}}


def item(task_id="t1", traj=None, feedback=None):
    return ev.JudgeItem(task_id, traj or trajectory(), feedback or FEEDBACK, 0.0, False, trace_ref="ref")


def test_a_valid_answer_becomes_a_record_with_the_servers_usage():
    with ScriptedOpenAIServer([reply(json.dumps(GOOD), prompt_tokens=1234, completion_tokens=56)]) as srv:
        rec = ev.judge_one(LLMJudge(llm(srv)), item(), round=0, harness_id="h", retries=2)
    assert rec.ok and rec.attempts == 1
    assert (rec.w, rec.a, rec.u, rec.summary) == (0.7, 0.8, 0.6, GOOD["summary"])
    assert rec.mechanisms == ["completion_gate"] and rec.insights == GOOD["insights"]
    [u] = rec.usage
    assert (u.input_tokens, u.output_tokens, u.error) == (1234, 56, None)
    [body] = srv.requests
    system, user = body["messages"]
    assert system["role"] == "system" and "ONLY one JSON object" in system["content"]
    # the outcome and the trajectory reach the model
    for needle in ("# Task t1", "test_edge", "edge case wrong", "1 failed, 3 passed", "50% resolved",
                   "shown whole", "the change should be complete"):
        assert needle in user["content"], needle


def test_an_out_of_range_answer_is_reasked_with_the_error_and_the_previous_answer():
    bad = json.dumps({**GOOD, "w": 1.5})
    with ScriptedOpenAIServer([reply(bad), reply(f"```json\n{json.dumps(GOOD)}\n```")]) as srv:
        rec = ev.judge_one(LLMJudge(llm(srv)), item(), round=0, harness_id="h", retries=2)
    assert rec.ok and rec.attempts == 2 and len(rec.usage) == 2 and rec.w == 0.7
    first, second = (r["messages"] for r in srv.requests)
    assert len(first) == 2
    assert second[:2] == first  # the same question, then the rejected answer and why
    assert second[2] == {"role": "assistant", "content": bad}
    assert second[3]["role"] == "user" and "'w'" in second[3]["content"] and "rejected" in second[3]["content"]


def test_an_answer_that_stays_malformed_is_a_judge_error_with_every_attempts_usage():
    with ScriptedOpenAIServer([reply("I think w is high.", prompt_tokens=100, completion_tokens=7)]) as srv:
        rec = ev.judge_one(LLMJudge(llm(srv)), item(), round=0, harness_id="h", retries=2)
    assert not rec.ok and rec.attempts == 3 and "after 3 attempts" in rec.judge_error and "JSON" in rec.judge_error
    assert len(srv.requests) == 3 and [(u.input_tokens, u.output_tokens) for u in rec.usage] == [(100, 7)] * 3
    assert rec.w is None and rec.q is None


def test_a_failed_call_is_a_failed_attempt_whose_usage_is_kept_and_then_asked_plainly():
    with ScriptedOpenAIServer([error(500)]) as srv:
        out = LLMJudge(llm(srv)).judge(trajectory(), FEEDBACK, "t1")
    assert out.output is None and "500" in out.usage.error
    with ScriptedOpenAIServer([error(500), reply(json.dumps(GOOD))]) as srv:
        rec = ev.judge_one(LLMJudge(llm(srv)), item(), round=0, harness_id="h", retries=1)
    assert rec.ok and rec.attempts == 2 and len(rec.usage) == 2 and rec.usage[0].error
    assert len(srv.requests[-1]["messages"]) == 2  # nothing to correct: the same question again
    with ScriptedOpenAIServer([error(500)]) as srv:
        rec = ev.judge_one(LLMJudge(llm(srv)), item(), round=0, harness_id="h", retries=1)
    assert not rec.ok and "judge call failed" in rec.judge_error and len(rec.usage) == 2


def test_a_long_trajectory_is_condensed_to_the_budget_keeping_its_ending():
    budget = 3000
    traj = trajectory(n_units=80, body=2000)
    assert estimate_tokens(json.dumps(traj)) > 10 * budget
    with ScriptedOpenAIServer([reply(json.dumps(GOOD))]) as srv:
        rec = ev.judge_one(LLMJudge(llm(srv), max_trajectory_tokens=budget), item(traj=traj), round=0,
                           harness_id="h", retries=0)
    assert rec.ok
    user = srv.requests[0]["messages"][1]["content"]
    shown = user.split("```json\n", 1)[1].rsplit("\n```", 1)[0]
    assert len(shown) <= 4 * budget
    assert "was condensed" in user and "steps omitted" in shown
    assert "END79" in shown and "the change should be complete" in shown  # the ending, whole
    assert "Make the parser accept empty input." in shown  # the task
    assert "END40" not in shown


def test_the_template_renders_every_placeholder_with_real_values():
    assert placeholders("judge") == {"keys", "schema"}
    text = render("judge", keys="w, a, u", schema=json.dumps(VERDICT_SCHEMA))
    assert "${" not in text and "$" not in text.replace("$schema", "")
    judge = LLMJudge({"model": "openai/scripted"})
    for key in VERDICT_SCHEMA["properties"]:
        assert f'"{key}"' in judge.instructions
    assert "same" in judge.instructions.lower() and "successful" in judge.instructions


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="max_trajectory_tokens"):
        LLMJudge({"model": "openai/x", "context_tokens": 8000}, max_trajectory_tokens=8000)
    with pytest.raises(ValueError, match="judge.llm.model"):
        LLMJudge({"api_base": "http://x"})
    assert LLMJudge({"model": "openai/x", "context_tokens": 10_000}).max_trajectory_tokens == 6000


def test_judged_records_are_embedded_with_the_packaged_embedder():
    from milo_ray.agents.embedder import SentenceTransformerEmbedder

    other = {**GOOD, "summary": "The run hit its time cap while reinstalling dependencies.",
             "insights": "Long installs eat the time budget; cache them."}
    answers = {"t1": GOOD, "t2": other}

    def by_task(body):
        task = "t1" if "# Task t1" in body["messages"][1]["content"] else "t2"
        return reply(json.dumps(answers[task]))

    with ScriptedOpenAIServer(by_task) as srv:
        recs = ev.judge_records(LLMJudge(llm(srv)), [item("t1"), item("t2")], round=0, harness_id="h", workers=2)
    emb = SentenceTransformerEmbedder("packaged")
    assert ev.embed_records(recs, emb) == 2
    z = np.stack([r.embedding for r in recs])
    assert z.shape == (2, 384) and {r.embedder for r in recs} == {emb.model_name}
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    assert ev.order_records(recs, "rer", np.random.default_rng(0))
