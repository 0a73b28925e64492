"""The LLM orchestrator against a local OpenAI-compatible server: real HTTP through
litellm and langchain, scripted answers with known usage, on the snapshot and state
that ``build_inputs`` makes of a small real MILO state."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from milo_ray.agents.orchestrators.llm import LLMOrchestrator, parse_answer
from milo_ray.agents.prompts import placeholders
from milo_ray.llm.usage import AgentReply
from milo_ray.milo.events import Init, NodeRecorded, Progress
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.orchestrator import build_inputs
from milo_ray.milo.state import MiloState
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, ScriptedOpenAIServer, error, reply

KEY = SCRIPTED_KEY_ENV
POOL = ["conservative", "bold", "sloppy"]
FAST = {"retry_base_s": 0.01, "retry_max_s": 0.05}


def _node(node_id: str, island: int, acc: float, behavior: dict[str, float], *, parent: str | None = None,
          admitted: bool = True, mutation: str = "") -> LineageNode:
    return LineageNode(node_id=node_id, harness_id=f"h-{node_id}", island=island, round=0 if parent is None else 1,
                       origin="seed" if parent is None else "mutation", parent=parent, accuracy=acc,
                       costs={"output_tokens": 1e5, "seconds": 600.0}, fitness=[acc, 0.995, 0.9167],
                       behavior=behavior, admitted=admitted, mutation=mutation,
                       verdict_reason="admitted" if admitted else "dominated", mutator="bold" if parent else None)


def population() -> tuple[str, dict]:
    """Two islands, island 1 stalled with a rejected child; the snapshot and state the
    loop hands the orchestrator."""
    st = MiloState()
    for e in [
        Init(search_tasks=["t1", "t2", "t3"], val_tasks=["v1"], task_pool=["t1", "t2", "t3", "t4"], islands=[0, 1],
             assignment={0: "bold", 1: "conservative"}),
        NodeRecorded(_node("s0-a", 0, 2 / 3, {"t1": 1.0, "t2": 1.0, "t3": 0.0})),
        NodeRecorded(_node("s1-b", 1, 1 / 3, {"t1": 1.0, "t2": 0.0, "t3": 0.0})),
        NodeRecorded(_node("1-1", 1, 0.0, {"t1": 0.0, "t2": 0.0, "t3": 0.0}, parent="s1-b", admitted=False,
                           mutation="reword the system prompt")),
        Progress(0, 1, 0),
        Progress(1, 1, 3),
    ]:
        st.apply(e)
    view = SimpleNamespace(state=st, pool_names=POOL, cfg=SimpleNamespace(max_moves=2, patience=3))
    return build_inputs(view, 1)


VALID = {"diagnosis": "Island 1's best fails t2, which island 0's best s0-a solves.", "kind": "exhausted_lineage",
         "loci": ["structure"], "recombine": [{"dest_island": 1, "donor_island": 0, "why": "t2"}]}



def orchestrator(url: str, **kw) -> LLMOrchestrator:
    return LLMOrchestrator({"model": "openai/scripted", "api_base": url, "api_key_env": KEY, **FAST, **kw})


def _text(request: dict) -> str:
    return "\n".join(str(m.get("content")) for m in request["messages"])


@pytest.mark.parametrize("answer", [json.dumps(VALID), "Here it is:\n```json\n" + json.dumps(VALID, indent=2) + "\n```\n"],
                         ids=["bare", "fenced"])
def test_a_json_answer_is_the_decision_and_its_usage_is_the_servers_count(key_env, answer):
    md, state = population()
    with ScriptedOpenAIServer([reply(answer, prompt_tokens=4321, completion_tokens=87)]) as srv:
        out = orchestrator(srv.url).decide(md, state, seed=7)
    assert isinstance(out, AgentReply) and out.output == VALID
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.error) == (4321, 87, None)
    (body,) = srv.requests
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Island 1 has stalled" in system and "At most 2 move(s)" in system
    assert "conservative, bold, sloppy" in system and "Existing islands: 0, 1" in system
    assert md.strip() in user and "Stalled island: 1" in user
    facts = json.loads(user.split("# Search state (JSON)", 1)[1].rsplit("Diagnose island", 1)[0])
    assert facts["mutator_pool"] == POOL and facts["stalled_island"] == 1
    assert facts["task_pool"] == ["t1", "t2", "t3", "t4"] and set(facts["regret"]) == {"t1", "t2", "t3"}
    assert facts["harnesses"]["0"][0]["passes"] == {"t1": 1.0, "t2": 1.0}


def test_an_answer_that_is_not_a_json_object_comes_back_as_its_text(key_env):
    md, state = population()
    with ScriptedOpenAIServer([reply("I would graft island 0 into island 1.")]) as srv:
        out = orchestrator(srv.url).decide(md, state, seed=0)
    assert out.output == "I would graft island 0 into island 1." and out.usage.error is None
    assert parse_answer("[1, 2]") == "[1, 2]"  # JSON, but not an object


def test_a_failed_endpoint_is_an_error_output_never_an_exception(key_env):
    md, state = population()
    with ScriptedOpenAIServer([error(400)]) as srv:
        out = orchestrator(srv.url).decide(md, state, seed=0)
    assert out.usage.error and set(out.output) == {"error"} and out.output["error"] == out.usage.error
    assert len(srv.requests) == 1  # a 400 is not retried


def test_a_reask_shows_the_previous_answer_and_the_validation_error(key_env):
    md, state = population()
    bad = {"diagnosis": "x", "recombine": [{"dest_island": 1, "donor_island": 9}]}
    err = "decision field recombine[0].donor_island: unknown island 9; existing islands are [0, 1]"
    with ScriptedOpenAIServer([reply(json.dumps(VALID))]) as srv:
        out = orchestrator(srv.url).decide(md, {**state, "reask": {"error": err, "previous": bad}}, seed=0)
    assert out.output == VALID
    msgs = srv.requests[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert json.loads(msgs[2]["content"]) == bad
    assert err in msgs[3]["content"] and "ONLY the JSON object" in msgs[3]["content"]


def test_the_template_renders_a_real_snapshot_with_every_placeholder_filled(key_env):
    md, state = population()
    orch = orchestrator("http://127.0.0.1:9")  # never called: building the messages needs no network
    system, user = (text for _, text in orch.messages(md, state))
    assert placeholders("orchestrator") >= {"trigger", "max_moves", "pool", "islands", "assignment"}
    assert "$" not in system and not re.search(r"\$\{\w+\}", user)
    for kind in ("dry_mutator", "exhausted_lineage", "crowded_out_niche", "population_plateau"):
        assert f"`{kind}`" in system
    for move in ("reassign", "recombine", "speciate", "curriculum"):
        assert f'"{move}"' in system
    assert "new island (it\n   will get id 2)" in system and "keep about 3 tasks" in system


def test_bad_settings_and_a_state_without_its_keys_are_refused_by_name():
    with pytest.raises(ValueError, match="backend.agents.orchestrator.llm.model"):
        LLMOrchestrator({"model": ""})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['temprature'\]"):
        LLMOrchestrator({"model": "openai/x", "temprature": 0.1})
    with pytest.raises(ValueError, match="graft_time_cap_s"):
        LLMOrchestrator({"model": "openai/x"}, graft_time_cap_s=0)
    md, state = population()
    with pytest.raises(ValueError, match=r"state lacks \['pool'\]"):
        LLMOrchestrator({"model": "openai/x"}).messages(md, {k: v for k, v in state.items() if k != "pool"})


def test_concurrent_decisions_share_one_chat_model_and_keep_their_own_answers(key_env):
    """Each call's answer comes from its own conversation (the server answers by the
    stalled island it reads), and the chat model is built once."""
    from concurrent.futures import ThreadPoolExecutor

    md, state = population()

    def answer(body):
        j = int(re.search(r"Island (\d+) has stalled", body["messages"][0]["content"]).group(1))
        return reply(json.dumps({**VALID, "diagnosis": f"island {j}"}))

    with ScriptedOpenAIServer(answer) as srv:
        orch = orchestrator(srv.url)
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda j: orch.decide(md, {**state, "trigger": j}, seed=j), [0, 1, 0, 1]))
        model = orch._chat_model()
    assert [o.output["diagnosis"] for o in outs] == ["island 0", "island 1", "island 0", "island 1"]
    assert len(srv.requests) == 4 and orch._chat_model() is model
