"""Seed harnesses build real agents offline and carry their intended mechanisms."""

from __future__ import annotations

import itertools

import pytest
from deepagents.backends import StateBackend
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from milo_ray.harness.mechanisms import detect_mechanisms
from milo_ray.harness.mechanisms import templates as T
from milo_ray.harness.mechanisms.catalog import MECHANISMS
from milo_ray.harness.seeds import SEED_NAMES, load_seeds

EXPECTED = {
    "minimal": set(),
    "stock": {"deepagents_stack"},
    "division_of_labor": {"deepagents_stack", "delegation_protocol", "explorer_subagent", "coder_subagent",
                          "verifier_subagent", "completion_gate"},
    "plan_and_solve": {"deepagents_stack", "plan_protocol", "plan_nudge", "plan_gate"},
    "reproduce_first": {"deepagents_stack", "scientist_protocol", "rubric_gate"},
}


class ToolFreeFake(GenericFakeChatModel):
    """A fake chat model that accepts tool binding and always answers without tools."""

    def bind_tools(self, tools, **kwargs):
        return self


def _model():
    return ToolFreeFake(messages=itertools.repeat(AIMessage(content="done")))


def test_load_seeds_names_and_order():
    hs = load_seeds()
    assert [h.name for h in hs] == list(SEED_NAMES)
    assert [h.name for h in load_seeds(["stock"])] == ["stock"]
    with pytest.raises(ValueError):
        load_seeds(["nope"])


@pytest.mark.parametrize("harness", load_seeds(), ids=lambda h: h.name)
def test_seed_builds_and_runs_an_agent_with_a_fake_model(harness):
    ns: dict = {}
    exec(compile(harness.source, f"{harness.name}/harness.py", "exec"), ns)
    agent = ns["build_agent"](_model(), StateBackend())
    out = agent.invoke({"messages": [{"role": "user", "content": "say done"}]})
    assert any(isinstance(m, AIMessage) for m in out["messages"])
    if harness.name == "reproduce_first":
        assert out.get("rubric"), "the default rubric must activate deepagents' RubricMiddleware"
    if harness.name == "plan_and_solve":  # the nudge and the gate each injected a directive
        assert sum(getattr(m, "type", "") == "human" for m in out["messages"]) >= 3


@pytest.mark.parametrize("harness", load_seeds(), ids=lambda h: h.name)
def test_detect_finds_the_intended_mechanisms(harness):
    assert set(detect_mechanisms(harness.source)) == EXPECTED[harness.name]




# Every definition any mechanism template makes (the bare loop's core tools included).
TEMPLATE_DEFINITIONS = {name: text for template in [T.CORE_TOOLS] + [s.template for s in MECHANISMS.values()]
                        for name, text in T.definitions(template).items()}


@pytest.mark.parametrize("harness", load_seeds(), ids=lambda h: h.name)
def test_seed_mechanism_code_is_the_template_code_verbatim(harness):
    """The seeds are files users and mutators read, so their mechanisms are written out,
    and the templates of those mechanisms are read from them: every top-level definition
    but ``build_agent`` is a template's, character for character (a seed defines nothing
    no template inserts), and every mechanism detected in the seed is one of them."""
    defined = T.definitions(harness.source)
    unknown = set(defined) - set(TEMPLATE_DEFINITIONS) - {"build_agent"}
    assert not unknown, f"{harness.name} defines {sorted(unknown)}, which no mechanism template has"
    for name in set(defined) - {"build_agent"}:
        assert defined[name] == TEMPLATE_DEFINITIONS[name], f"{harness.name}.{name} differs from its template"
    for mechanism in detect_mechanisms(harness.source):
        spec = MECHANISMS[mechanism]
        if spec.template:
            assert spec.symbol in defined and spec.symbol in TEMPLATE_DEFINITIONS
