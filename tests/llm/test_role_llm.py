"""A search role's model: its settings are checked with errors naming the field, and one
call through litellm to a local server returns the answer with exactly the usage the
server billed (retries counted, USD from the role's prices, a failure never raised)."""

from __future__ import annotations

import pytest

from milo_ray.llm.role_llm import RoleLLM, ask, total_usage
from milo_ray.llm.solver_calls import SolverCall
from milo_ray.llm.usage import AgentUsage
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, ScriptedOpenAIServer, error, reply

KEY = SCRIPTED_KEY_ENV



@pytest.mark.parametrize("spec,needle", [
    (None, "backend.agents.judge.llm: expected a mapping"),
    ({}, "backend.agents.judge.llm.model: not set"),
    ({"model": "openai/x", "temprature": 0.1}, "unknown key(s) ['temprature']"),
    ({"model": "openai/x", "max_retries": -1}, "backend.agents.judge.llm.max_retries=-1"),
    ({"model": "openai/x", "usd_per_mtok_input": 1.0},
     "backend.agents.judge.llm.usd_per_mtok_input / backend.agents.judge.llm.usd_per_mtok_output: only one price"),
    ({"model": "openai/x", "context_tokens": 10}, "context_tokens=10"),
])
def test_a_bad_role_model_is_refused_naming_the_field(spec, needle):
    with pytest.raises(ValueError) as e:
        RoleLLM.of(spec, where="backend.agents.judge.llm")
    assert needle in str(e.value)


def test_one_call_returns_the_answer_and_the_usage_the_server_billed(key_env):
    with ScriptedOpenAIServer([error(503), reply("a verdict", prompt_tokens=700, completion_tokens=40)],
                              model="judge") as srv:
        llm = RoleLLM.of({"model": "openai/judge", "api_base": srv.url, "api_key_env": KEY, "retry_base_s": 0.01,
                          "usd_per_mtok_input": 2.0, "usd_per_mtok_output": 10.0}, where="x")
        text, usage = ask(llm, [("system", "judge it"), ("user", "the trajectory")])
        billed = srv.billed_by_model()
    assert text == "a verdict"
    assert billed == {"judge": (700, 40)}
    assert (usage.input_tokens, usage.output_tokens, usage.retries, usage.error) == (700, 40, 1, None)
    assert usage.cost_usd == pytest.approx((700 * 2.0 + 40 * 10.0) / 1e6)
    assert [m["role"] for m in srv.requests[-1]["messages"]] == ["system", "user"]


def test_a_failing_endpoint_is_an_usage_with_its_error_not_an_exception(key_env):
    with ScriptedOpenAIServer([error(400)]) as srv:
        llm = RoleLLM.of({"model": "openai/scripted", "api_base": srv.url, "api_key_env": KEY}, where="x")
        text, usage = ask(llm, [("user", "hello")])
    assert text is None and usage.error is not None and "BadRequest" in usage.error
    assert usage.tokens == 0 and len(srv.requests) == 1  # a 400 is never retried


def test_many_calls_add_up_and_one_unpriced_call_makes_the_total_unknown():
    def call(tin, tout, usd):
        return SolverCall(AgentUsage(tin, tout, usd, seconds=1.0, retries=1), 0.0, 1.0, "m")

    priced = total_usage([call(10, 2, 0.5), call(5, 1, 0.25)], seconds=3.0)
    assert (priced.input_tokens, priced.output_tokens, priced.cost_usd, priced.retries, priced.seconds) == \
        (15, 3, 0.75, 2, 3.0)
    assert total_usage([call(10, 2, 0.5), call(5, 1, None)], seconds=1.0).cost_usd is None
