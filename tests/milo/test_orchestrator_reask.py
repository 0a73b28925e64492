"""The loop re-asks an orchestrator decision it cannot execute exactly once
(papers/000 App. C.2), records both calls, and skips the intervention when the second
answer is refused too, without stopping the run. Driven through ``intervene`` on a
small real MILO state (no Ray): a scripted test double, and the LLM orchestrator
against a local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from milo_ray.agents.orchestrators.llm import LLMOrchestrator
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.llm.usage import AgentReply, AgentUsage
from milo_ray.milo.events import (MILO_EVENTS, Decision, DecisionInvalid, Init, InterventionDone, MiloEvent, NodeRecorded, Progress,
                                  Reassign, decode)
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.orchestrator import intervene
from milo_ray.milo.state import MiloState
from milo_ray.search.agent_calls import AgentCallLog, RoleCap
from milo_ray.store.memory import MemoryRunStore
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

POOL = ["conservative", "bold", "sloppy"]
TRIGGER, ROUND = 1, 2
DID = f"d{TRIGGER}-{ROUND}"
UNKNOWN_ISLAND = {"diagnosis": "dry", "reassign": [{"island": 9, "mutator": "bold"}]}
VALID = {"diagnosis": "dry", "kind": "dry_mutator", "reassign": [{"island": TRIGGER, "mutator": "bold"}]}


class Replying:
    """An orchestrator answering ``answers[i]`` on its i-th decide call (an exception
    instance is raised instead), recording the state each call saw."""

    name = "replying"

    def __init__(self, answers: list[Any], usage: AgentUsage = AgentUsage()) -> None:
        self.answers, self.usage, self.states = list(answers), usage, []

    def decide(self, snapshot_markdown: str, state: dict[str, Any], seed: int) -> AgentReply[Any]:
        self.states.append(state)
        answer = self.answers[len(self.states) - 1]
        if isinstance(answer, Exception):
            raise answer
        return AgentReply(answer, self.usage)

    def graft(self, request: MutationRequest) -> MutationResult:
        return MutationResult(None, error="these tests make no graft")


def _node(node_id: str, island: int, acc: float, *, parent: str | None = None) -> LineageNode:
    return LineageNode(node_id=node_id, harness_id=f"h-{node_id}", island=island, round=0 if parent is None else 1,
                       origin="seed" if parent is None else "mutation", parent=parent, accuracy=acc,
                       costs={"output_tokens": 1e5, "seconds": 600.0}, fitness=[acc, 0.995, 0.9167],
                       behavior={"t1": acc, "t2": acc}, admitted=True, verdict_reason="admitted",
                       mutator="conservative" if parent else None)


class View:
    """The part of a run ``intervene`` and ``apply_decision`` use: a real state built
    from events, a real agent ledger on a memory store, events kept in order."""

    def __init__(self, tmp: Path, orch: Any, *, caps: dict[str, RoleCap] | None = None) -> None:
        self.state, self.events = MiloState(), []
        self.cfg = SimpleNamespace(max_moves=2, patience=1, mutation_time_cap_s=60.0)
        self.pool_names, self.run_dir, self.stop = POOL, tmp, False
        self.ctx = SimpleNamespace(seed=0, agent_calls=AgentCallLog(MemoryRunStore("reask"), caps=caps))
        self._orch = orch
        for e in [Init(search_tasks=["t1", "t2"], val_tasks=["v1"], task_pool=["t1", "t2", "t3"], islands=[0, 1],
                       assignment={0: "bold", 1: "conservative"}),
                  NodeRecorded(_node("s0-a", 0, 0.5)), NodeRecorded(_node("s1-b", 1, 0.5)),
                  NodeRecorded(_node("1-1", 1, 0.5, parent="s1-b")), NodeRecorded(_node("1-2", 1, 0.5, parent="1-1")),
                  Progress(0, ROUND, 0), Progress(TRIGGER, ROUND, 2)]:
            self.emit(e)

    def emit(self, event: MiloEvent, *, island: int | None = None, round: int | None = None,
             harness_id: str | None = None) -> None:
        # Through the stored form, as a resumed run reads it.
        self.events.append(decode(MILO_EVENTS.kind_of(event), json.loads(json.dumps(event.to_payload()))))
        self.state.apply(self.events[-1])

    def orchestrator(self) -> Any:
        return self._orch

    def role_refused(self, role: str) -> str | None:
        return self.ctx.agent_calls.exhausted_reason(role)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def calls(self) -> list[dict[str, Any]]:
        return self.ctx.agent_calls.store.read("agent_calls").to_pylist()


def run(view: View) -> None:
    asyncio.run(intervene(view, TRIGGER))


def test_an_invalid_answer_is_reasked_once_and_the_corrected_decision_is_applied(tmp_path):
    orch = Replying([UNKNOWN_ISLAND, VALID], AgentUsage(100, 20, 0.001))
    view = View(tmp_path, orch)
    run(view)
    assert len(orch.states) == 2
    first, second = orch.states
    assert "reask" not in first
    assert second["reask"]["previous"] == UNKNOWN_ISLAND
    assert "reassign[0].island: unknown island 9" in second["reask"]["error"]
    assert {k: v for k, v in second.items() if k != "reask"} == first  # the same inputs otherwise
    (d,) = view.of(Decision)
    assert d.decision["reassign"] == VALID["reassign"] and view.of(DecisionInvalid) == []
    assert [(e.island, e.mutator) for e in view.of(Reassign)] == [(TRIGGER, "bold")]
    assert view.state.assignment[TRIGGER] == "bold" and [e.decision_id for e in view.of(InterventionDone)] == [DID]
    calls = view.calls()
    assert [(c["role"], c["call_id"]) for c in calls] == [("orchestrator", f"decide:{DID}"),
                                                           ("orchestrator", f"decide:{DID}:reask")]
    assert all(c["output_tokens"] == 20 and c["agent"] == "replying" and c["model"] is None for c in calls)
    odir = tmp_path / "orchestrator" / DID
    assert json.loads((odir / "decision.json").read_text()) == UNKNOWN_ISLAND
    assert json.loads((odir / "decision.reask.json").read_text()) == VALID


def test_two_invalid_answers_skip_the_intervention_after_exactly_two_calls(tmp_path):
    orch = Replying(["no JSON here", UNKNOWN_ISLAND, VALID])
    view = View(tmp_path, orch)
    run(view)
    assert len(orch.states) == 2 and len(view.calls()) == 2
    (bad,) = view.of(DecisionInvalid)
    assert (bad.decision_id, bad.trigger, bad.round) == (DID, TRIGGER, ROUND)
    assert "must be a JSON object" in bad.first_error and bad.first_raw == "no JSON here"
    assert "unknown island 9" in bad.error and bad.raw == UNKNOWN_ISLAND
    assert view.of(Decision) == [] and view.of(Reassign) == [] and view.of(InterventionDone) == []
    # The run goes on: the stall is recorded as handled, so the island is not asked
    # again before P more rounds, and its mutator is unchanged.
    assert view.state.last_intervention[TRIGGER] == ROUND and view.state.assignment[TRIGGER] == "conservative"


def test_a_valid_first_answer_is_not_reasked(tmp_path):
    orch = Replying([VALID, VALID])
    view = View(tmp_path, orch)
    run(view)
    assert len(orch.states) == 1 and len(view.calls()) == 1 and len(view.of(Decision)) == 1
    assert not (tmp_path / "orchestrator" / DID / "decision.reask.json").exists()


def test_a_failed_call_is_asked_again_without_an_answer_to_correct(tmp_path):
    orch = Replying([RuntimeError("connection reset"), VALID])
    view = View(tmp_path, orch)
    run(view)
    assert "reask" not in orch.states[1] and len(view.of(Decision)) == 1
    assert view.calls()[0]["error"] == "RuntimeError: connection reset"


def test_a_failed_call_twice_names_the_call_error(tmp_path):
    orch = Replying([RuntimeError("connection reset"), RuntimeError("still down")])
    view = View(tmp_path, orch)
    run(view)
    (bad,) = view.of(DecisionInvalid)
    assert "call failed: RuntimeError: connection reset" in bad.first_error
    assert "call failed: RuntimeError: still down" in bad.error


def test_a_spent_orchestrator_budget_allows_no_reask(tmp_path):
    orch = Replying([UNKNOWN_ISLAND, VALID], AgentUsage(100, 20, 0.0))
    view = View(tmp_path, orch, caps={"orchestrator": RoleCap(tokens=50)})
    run(view)
    assert len(orch.states) == 1 and len(view.calls()) == 1
    (bad,) = view.of(DecisionInvalid)
    assert "unknown island 9" in bad.error and "not re-asked" in bad.error and bad.first_error is None


def test_a_decision_invalid_stored_before_reasks_existed_still_decodes():
    old = {"decision_id": "d0-3", "trigger": 0, "round": 3, "error": "bad", "raw": {"x": 1}}
    e = decode("milo.decision_invalid", old)
    assert (e.error, e.raw, e.first_error, e.first_raw) == ("bad", {"x": 1}, None, None)
    st = MiloState()
    st.apply(e)
    assert st.last_intervention == {0: 3}


def test_the_llm_orchestrator_is_reasked_through_the_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_REASK_KEY", "local-secret")
    script = [reply("Reassign island 1 to bold.", prompt_tokens=900, completion_tokens=9),
              reply("```json\n" + json.dumps(VALID) + "\n```", prompt_tokens=950, completion_tokens=40)]
    with ScriptedOpenAIServer(script) as srv:
        orch = LLMOrchestrator({"model": "openai/scripted", "api_base": srv.url, "api_key_env": "ORCH_REASK_KEY"})
        view = View(tmp_path, orch)
        run(view)
    assert len(srv.requests) == 2
    again = srv.requests[1]["messages"]
    assert (again[2]["role"], again[2]["content"]) == ("assistant", "Reassign island 1 to bold.")
    assert "must be a JSON object" in again[3]["content"]
    assert view.state.assignment[TRIGGER] == "bold"
    assert [(c["call_id"], c["model"], c["input_tokens"], c["output_tokens"]) for c in view.calls()] == [
        (f"decide:{DID}", "openai/scripted", 900, 9), (f"decide:{DID}:reask", "openai/scripted", 950, 40)]
