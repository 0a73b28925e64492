"""The solver's model and every search role's model are one settings type with one
validation: the same bad value gets the same problem under each one's own config path,
and every problem of one block is reported together."""

from __future__ import annotations

import pytest

from milo_ray.llm.role_llm import RoleLLM
from milo_ray.config.schemas import ModelConfig, model_config
from milo_ray.core.llm_endpoint import LLMEndpoint
from milo_ray.core.problems import InvalidSettings

BAD = [
    ({"temperature": 3.0}, "temperature=3.0: must be in [0, 2]"),
    ({"max_retries": -1}, "max_retries=-1: must be an integer >= 0"),
    ({"request_timeout_s": 0}, "request_timeout_s=0: must be > 0 seconds"),
    ({"rpm": 0}, "rpm=0: must be an integer >= 1"),
    ({"tpm": "many"}, "tpm='many': must be an integer >= 1"),
    ({"api_base": "localhost:8000"}, "api_base='localhost:8000': not a URL"),
    ({"api_key_env": "sk-abcdefghijklmnop"}, "api_key_env: this looks like an API key"),
    ({"usd_per_mtok_input": 1.0}, "usd_per_mtok_input / "),
    ({"retry_base_s": 5.0, "retry_max_s": 1.0}, "retry_base_s=5.0, "),
]


@pytest.mark.parametrize("fields,needle", BAD)
def test_one_rule_for_the_solver_and_every_role(fields, needle):
    with pytest.raises(InvalidSettings) as solver:
        model_config({"solver": "openai/x", **fields})
    with pytest.raises(InvalidSettings) as role:
        RoleLLM.of({"model": "openai/x", **fields}, where="backend.agents.judge.llm")
    assert f"model.{needle}" in str(solver.value)
    assert f"backend.agents.judge.llm.{needle}" in str(role.value)
    assert [p.problem for p in solver.value.problems] == [p.problem for p in role.value.problems]
    assert "sk-abcdefghijklmnop" not in str(solver.value) + str(role.value)


def test_every_problem_of_one_block_is_listed():
    with pytest.raises(InvalidSettings) as info:
        ModelConfig(solver="openai/x", temperature=9.0, rpm=0, max_retries=-2).check()
    keys = [p.key for p in info.value.problems]
    assert keys == ["model.temperature=9.0", "model.max_retries=-2", "model.rpm=0"]
    assert str(info.value).count("\n") == 2


def test_the_schemas_extend_the_endpoint_type():
    from milo_ray.config.schemas import BackendConfig

    for cls in (ModelConfig, BackendConfig, RoleLLM):
        assert issubclass(cls, LLMEndpoint)
    assert LLMEndpoint().endpoint_problems("x") == []
