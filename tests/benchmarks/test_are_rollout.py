"""An ARE scenario as a real rollout: the rollout executor starts the scenario's world on
the host, the harness process in its bwrap sandbox gets the scenario's app tools (added to
the agent a seed harness builds, unchanged), a scripted model acts through them, and ARE's
judge decides once the agent's processes are dead. A harness that looks for the scenario
itself (its oracle actions) finds nothing it can read.

Slow, and needs ARE's interpreter (``scripts/are_env.sh``, then ``MILO_RAY_ARE_PYTHON``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from milo_ray.benchmarks.are.benchmark import AREBenchmark
from milo_ray.execution.agent_executor import AgentExecutor
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import load_seeds
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, reply, tool_call
from milo_ray.testing.are import are_interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "are"
KEY_ENV = "MILO_ARE_TEST_KEY"
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def are_python() -> None:
    are_interpreter()


def forwarding_policy(recipient: str):
    """Forwards Greg's email to ``recipient`` with the scenario's tool, tells the user, stops."""

    def policy(body: dict[str, Any]) -> Reply:
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        done = sum(1 for m in body["messages"] if m.get("role") == "tool")
        if "EmailClientV2__forward_email" not in offered:
            return reply(f"NO SCENARIO TOOLS: {sorted(offered)}")
        if done == 0:
            return tool_call("EmailClientV2__forward_email", {"email_id": "greg_email", "recipients": [recipient]})
        if done == 1:
            return tool_call("AgentUserInterface__send_message_to_user", {"content": "Done: forwarded."})
        return reply("Forwarded.")

    return policy


def _executor(url: str, tmp_path: Path) -> AgentExecutor:
    os.environ[KEY_ENV] = "sk-are-" + uuid.uuid4().hex
    return AgentExecutor(model={"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV,
                                "max_retries": 0},
                         sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                         scratch_dir=str(tmp_path))


def _task():
    return AREBenchmark(str(FIXTURES), splits={"search": 1.0}).task("forward_greg_email")


@pytest.mark.parametrize("recipient,score", [("john@example.com", 1.0), ("jon@example.com", 0.0)],
                         ids=["right_recipient", "wrong_recipient"])
def test_a_seed_harness_acts_through_the_scenario_tools_and_ares_judge_scores_it(recipient, score, tmp_path):
    minimal = next(h for h in load_seeds(["minimal"]))
    with ScriptedOpenAIServer(forwarding_policy(recipient)) as srv:
        res = asyncio.run(_executor(srv.url, tmp_path).aexecute(minimal, _task(), 0, 0))
    steps = json.dumps(res.trace["trajectory"], default=str)
    assert "NO SCENARIO TOOLS" not in steps, steps[-2000:]
    assert res.error_kind is None, res.error
    assert res.score == score, res.trace["verifier"]
    details = res.trace["verifier"]["details"]
    assert details["judge"] == "scripted" and details["judge_llm_calls"] == 0
    assert details["agent_actions"] == 2 and details["actions"][0]["tool"] == "EmailClientV2__forward_email"
    assert recipient in details["actions"][0]["args"]
    # The solver's calls are the rollout's; the scripted judge called no model.
    assert len(res.trace["trajectory"]["calls"]) == 3 and "grader" not in res.trace


PROBE = '''
import json, subprocess
from langchain_core.messages import AIMessage, HumanMessage

# Only the scenario's JSON holds these (split, so that this file does not): an oracle
# event's id, the oracle's own answer to the user, a contact's id in the apps' state.
SECRETS = ("392a3a4f-c50e-" + "4d6f-943a-e5194cc9397c", "Done: forwarded" + " to John", "5411523e9a9a4f4d" + "b09f1e5701463b88")


def build_agent(model, backend):
    names = sorted(t.name for t in backend.task_tools)

    class Probe:
        async def astream(self, inputs, config=None, stream_mode=None):
            hits = subprocess.run(
                "timeout 120 grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                + " ".join("-e '" + s + "'" for s in SECRETS) + " / 2>/dev/null | head -20",
                shell=True, capture_output=True, text=True).stdout.split()
            yield {"messages": [HumanMessage(content="go"),
                                AIMessage(content="PROBE " + json.dumps({"hits": hits, "tools": names}))]}
    return Probe()
'''


def test_the_harness_cannot_read_the_scenario_and_holds_only_its_tools(tmp_path):
    with ScriptedOpenAIServer([reply("unused")]) as srv:
        res = asyncio.run(_executor(srv.url, tmp_path).aexecute(Harness.from_source(PROBE, name="probe"), _task(), 0, 0))
    probe = json.loads(_probe_text(res))
    assert probe["hits"] == [], probe["hits"]
    assert "EmailClientV2__forward_email" in probe["tools"] and "wait_for_notification" in probe["tools"]
    assert res.score == 0.0 and res.error_kind is None  # it did nothing, and the judge says so


def _probe_text(res) -> str:
    """What the probe said (the text after ``PROBE``), wherever the trajectory keeps it."""
    def texts(value: Any):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from texts(v)
        elif isinstance(value, list):
            for v in value:
                yield from texts(v)

    for text in texts(res.trace["trajectory"]):
        if text.startswith("PROBE "):
            return text[len("PROBE "):]
    raise AssertionError(json.dumps(res.trace["trajectory"], default=str)[-2000:])


def own_words_policy(body: dict[str, Any]) -> Reply:
    """Forwards Greg's email to John, then tells the user in its own words (which ARE's
    judge checks with an LLM), then stops."""
    done = sum(1 for m in body["messages"] if m.get("role") == "tool")
    if done == 0:
        return tool_call("EmailClientV2__forward_email", {"email_id": "greg_email", "recipients": ["john@example.com"]})
    if done == 1:
        return tool_call("AgentUserInterface__send_message_to_user",
                         {"content": "I have sent Greg's music list on to John as you asked."})
    return reply("Forwarded.")


@pytest.mark.parametrize("max_calls,score", [(20, 1.0), (1, 0.0)], ids=["within_budget", "budget_spent"])
def test_ares_llm_checks_are_the_grader_roles_metered_calls(max_calls, score, tmp_path):
    grader_key = "MILO_ARE_GRADER_KEY"
    os.environ[grader_key] = "sk-grader-" + uuid.uuid4().hex
    task = AREBenchmark(str(FIXTURES), splits={"search": 1.0}, judge="grader").task("forward_greg_email")
    accept = reply("[[True]]\n[[Success]]", prompt_tokens=500, completion_tokens=5)
    with ScriptedOpenAIServer(own_words_policy) as solver, ScriptedOpenAIServer(lambda body: accept) as judge:
        ex = _executor(solver.url, tmp_path)
        # No grader configured: the executor refuses the task before the run, naming the fix.
        assert any("executor.grader" in p for p in ex.unsupported_tasks([task]))
        from milo_ray.execution.grader import GraderSettings

        ex.grader = GraderSettings.of({"llm": {"model": "openai/judge", "api_base": judge.url,
                                               "api_key_env": grader_key, "usd_per_mtok_input": 1.0,
                                               "usd_per_mtok_output": 2.0, "max_retries": 0},
                                       "max_calls": max_calls})
        res = asyncio.run(ex.aexecute(load_seeds(["minimal"])[0], task, 0, 0))
        judged = len(judge.answered)
        solver_traffic = json.dumps(solver.requests)
    assert res.error_kind is None, res.error
    assert res.score == score, res.trace["verifier"]
    grader = res.trace["grader"]
    # Every LLM check the judge made is one metered grader call, recorded with its price;
    # past the budget a check is refused (not sent) and counts as failed.
    assert len(grader["calls"]) == judged == min(max_calls, judged) and judged >= 1
    assert all(c["cost_usd"] == pytest.approx(500e-6 + 5 * 2e-6) for c in grader["calls"])
    assert (grader["refused"] > 0) == (score == 0.0)
    # The solver's calls are the rollout's own, and the grader's key never reached them.
    assert len(res.trace["trajectory"]["calls"]) == 3 and os.environ[grader_key] not in solver_traffic
