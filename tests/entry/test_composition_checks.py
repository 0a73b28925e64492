"""A benchmark/executor/model/backend/method combination that cannot work is refused in
one line, exit 2, before the run directory exists; nothing is built to find out."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated, Optional

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from milo_ray.config.errors import UserError
from milo_ray.config.schemas import ModelConfig, model_config, register_configs
from milo_ray.config.targets import CompositionError, check_agents, check_spec
from milo_ray.config.validate import check_overrides
from milo_ray.core.problems import Bounds
from milo_ray.run import CONF_DIR

register_configs()
FAKE_KEY = "sk-proj-abc123DEF456ghi789"

# (overrides, the start of the one error line, text it must contain)
BAD = {
    "bad model field": (["model.temperature=7"], "model.temperature=7.0", "[0, 2]"),
    "bad model url": (["model.api_base=localhost:8000"], "model.api_base=", "http(s)://"),
    "key in api_key_env": (["model=litellm", "model.solver=openai/gpt-4o-mini", f"model.api_key_env={FAKE_KEY}"],
                           "model.api_key_env:", "looks like an API key"),
    "litellm model without solver": (["model=litellm"], "model.solver: missing", "openai/"),
    "model/executor mismatch": (["model=litellm", "model.solver=openai/gpt-4o-mini"],
                                "model.solver=openai/gpt-4o-mini", "executor=surrogate"),
    "model id on the benchmark": (["+benchmark.model_id=other-model"], "benchmark.model_id:", "model.id"),
    "missing role (milo)": (["backend.agents.orchestrator=null"], "backend.agents.orchestrator:", "milo"),
    "missing role (ssr)": (["method=ssr", "backend.agents.judge=null"], "backend.agents.judge:", "ssr"),
    "unknown _target_": (["backend.agents.judge._target_=milo_ray.agents.judges.offline.NoSuchJudge"],
                         "backend.agents.judge._target_=milo_ray.agents.judges.offline.NoSuchJudge",
                         "no such class"),
    "bad agent field": (["+backend.agents.mutators.0.temperatur=0.5"], "backend.agents.mutators[0].temperatur:",
                        "OfflineMutator"),
    "bad executor field": (["+executor.sandbox=bwrap"], "executor.sandbox:", "SurrogateExecutor"),
    "search agents without a model": (["backend=litellm"], "backend.agents.mutators[0].llm.model: not set",
                                      "backend.model="),
    "search agents without their key": (["backend=litellm", "backend.model=openai/gpt-4o",
                                         "backend.api_key_env=MILO_RAY_UNSET_KEY_FOR_TESTS"],
                                        "backend.agents.mutators[0].llm.api_key_env=MILO_RAY_UNSET_KEY_FOR_TESTS",
                                        "is not set"),
    "a search model nobody uses": (["backend.model=openai/gpt-4o"], "backend.model=openai/gpt-4o", "backend=litellm"),
    "bad role model field": (["backend=litellm", "backend.model=openai/gpt-4o", "backend.api_key_env=HOME",
                              "+backend.agents.judge.llm.temprature=1"], "backend.agents.judge.llm: unknown key",
                             "temprature"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_combination_that_cannot_work_is_one_line_naming_the_key(case):
    argv, start, needle = BAD[case]
    with pytest.raises(UserError) as info:
        check_overrides(CONF_DIR, argv)
    message = str(info.value)
    assert message.startswith(start) and needle in message, message
    assert "\n" not in message and FAKE_KEY not in message


def _cli(tmp_path, *args: str) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-m", "milo_ray.run", *args], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["bad model field", "key in api_key_env", "model/executor mismatch",
                                  "missing role (ssr)", "unknown _target_", "bad agent field"])
def test_cli_refuses_it_with_exit_2_one_line_and_no_run_directory(tmp_path, case):
    argv, start, _needle = BAD[case]
    code, err = _cli(tmp_path, *argv, f"run.dir={tmp_path / 'r'}")
    assert code == 2, err[-5:]
    assert len(err) == 1 and err[0].startswith(f"error: {start}"), err
    assert FAKE_KEY not in err[0]
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


def test_a_benchmark_and_model_whose_ids_disagree_cannot_be_composed():
    """The model id has one source (model.id): a benchmark key for it does not exist."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            with pytest.raises(Exception, match="model_id"):
                compose("config", overrides=["model.id=model-a", "benchmark.model_id=model-b"])
    finally:
        GlobalHydra.instance().clear()
    with pytest.raises(UserError, match=r"^benchmark\.model_id: unknown config key"):
        check_overrides(CONF_DIR, ["model.id=model-a", "benchmark.model_id=model-b"])
    with pytest.raises(UserError, match=r"^benchmark\.model_id: SurrogateBenchmark has no parameter"):
        check_overrides(CONF_DIR, ["model.id=model-a", "+benchmark.model_id=model-b"])


def test_the_litellm_model_takes_its_id_from_the_solver_unless_given():
    assert model_config({"solver": "openai/gpt-4o-mini"}).id == "openai/gpt-4o-mini"
    assert model_config({"solver": "openai/gpt-4o-mini", "id": "gpt4o-mini-2024"}).id == "gpt4o-mini-2024"
    assert model_config(None).id == "offline-surrogate"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=["model=litellm", "model.solver=bedrock/anthropic.claude-x",
                                               "model.api_key_env=AWS_BEARER_TOKEN_BEDROCK"])
    finally:
        GlobalHydra.instance().clear()
    model = model_config(cfg.model)
    assert (model.id, model.solver, model.api_key_env, model.request_timeout_s) == \
        ("bedrock/anthropic.claude-x", "bedrock/anthropic.claude-x", "AWS_BEARER_TOKEN_BEDROCK", 600.0)


@pytest.mark.parametrize("value", ["sk-ant-api03-xyz", "AKIAIOSFODNN7EXAMPLE", "ghp_abcdefghijklmnop", "my key",
                                   "OPENAI-API-KEY"])
def test_api_key_env_refuses_anything_but_a_variable_name_without_echoing_it(value):
    with pytest.raises(ValueError) as info:
        ModelConfig(id="m", api_key_env=value).check()
    assert str(info.value).startswith("model.api_key_env:") and value not in str(info.value)


@pytest.mark.parametrize("field,value", [("max_output_tokens", 0), ("request_timeout_s", 0), ("temperature", -0.1),
                                         ("solver", "openai/gpt 4o"), ("extra_body", [1])])
def test_each_model_field_is_checked_naming_it(field, value):
    with pytest.raises(ValueError, match=rf"^model\.{field}"):
        ModelConfig(id="m", **{field: value}).check()


def test_the_offline_path_never_imports_litellm():
    code = ("import sys; from milo_ray.run import CONF_DIR; from milo_ray.config.validate import check_overrides; "
            "check_overrides(CONF_DIR, []); check_overrides(CONF_DIR, ['method=ssr']); "
            "print('litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_agent_specs_are_checked_without_being_built(monkeypatch):
    import milo_ray.agents.judges.offline as home

    built = []

    class Probe:
        def __init__(self, depth: int = 1) -> None:
            built.append(depth)

    monkeypatch.setattr(home, "Probe", Probe, raising=False)
    spec = {"_target_": "milo_ray.agents.judges.offline.Probe", "depth": 2}
    assert check_spec("backend.agents.judge", spec) is Probe
    with pytest.raises(CompositionError, match=r"^backend.agents.judge.width: Probe has no parameter 'width'"):
        check_spec("backend.agents.judge", {**spec, "width": 3})
    nested = {"_target_": "milo_ray.agents.judges.offline.Probe", "depth": {**spec, "width": 1}}
    with pytest.raises(CompositionError, match=r"^backend.agents.judge.depth.width:"):
        check_spec("backend.agents.judge", nested)
    assert built == []


def test_mutator_names_are_unique_and_every_declared_role_must_be_set():
    m = {"_target_": "milo_ray.agents.mutators.offline.OfflineMutator", "name": "a"}
    with pytest.raises(CompositionError, match=r"^backend.agents.mutators\[1\].name=a: already the name"):
        check_agents({"mutators": [m, {**m, "personality": "bold"}]}, (), "milo")
    check_agents({"mutators": [m, {**m, "name": "b"}]}, ("mutators",), "milo")
    with pytest.raises(CompositionError, match=r"^backend.agents.mutators: not set, and method milo needs it"):
        check_agents({"mutators": []}, ("mutators", "orchestrator"), "milo")
    check_agents({}, (), "eval")  # eval needs no agent


def test_a_run_stored_before_the_executor_group_resumes_with_the_same_executor_and_model_id(tmp_path):
    """Its benchmark carried model_id and named the executor; resuming it composes the
    surrogate executor from its benchmark and keeps model.id (the same cache keys)."""
    import json

    from omegaconf import OmegaConf

    from milo_ray.config.validate import check_composition
    from milo_ray.run import _resume_config

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            now = compose("config", overrides=["method=eval", "benchmark=surrogate_deepswe", "benchmark.seed=2"])
            argv = [f"run.resume={tmp_path}"]
            cfg = compose("config", overrides=argv)
    finally:
        GlobalHydra.instance().clear()
    old = OmegaConf.to_container(now, resolve=True)
    del old["executor"]
    old["benchmark"]["model_id"] = "offline-surrogate"
    del old["benchmark"]["calibrate_to"]
    (tmp_path / "manifest.json").write_text(json.dumps({"config": old}))
    resumed = _resume_config(cfg, argv)
    plan = check_composition(resumed)
    assert "model_id" not in resumed.benchmark and plan.model.id == "offline-surrogate"
    assert {k: plan.executor[k] for k in ("preset", "seed", "label_noise", "calibrate_to")} == \
        {"preset": "surrogate_deepswe", "seed": 2, "label_noise": 0.1, "calibrate_to": None}


@pytest.mark.parametrize("rung", ["milo_A", "milo_B", "milo_C", "milo_D"])
def test_rungs_without_an_orchestrator_do_not_need_one(rung):
    check_overrides(CONF_DIR, [f"method={rung}", "backend.agents.orchestrator=null"])  # accepted
    with pytest.raises(UserError, match="backend.agents.orchestrator:"):
        check_overrides(CONF_DIR, ["method=milo_E", "backend.agents.orchestrator=null"])


class Typed:
    """Parameters of each kind the composition check reads (annotations resolve at module level)."""

    def __init__(self, depth: int = 1, rate: Annotated[float, Bounds(0, 1)] = 0.5,
                 cap: Annotated[Optional[int], Bounds(1)] = None, name: str = "x", spec: object = None) -> None:
        pass


def test_a_spec_value_must_fit_its_parameter_type_and_declared_bounds(monkeypatch):
    import milo_ray.agents.judges.offline as home

    monkeypatch.setattr(home, "Typed", Typed, raising=False)
    base = {"_target_": "milo_ray.agents.judges.offline.Typed"}
    assert check_spec("benchmark", {**base, "depth": 3, "rate": 1, "cap": None, "name": "y", "spec": [1]}) is Typed
    for key, value, needle in [("depth", "3", "benchmark.depth='3': expected int"),
                               ("depth", True, "benchmark.depth=True: expected int"),
                               ("rate", "high", "benchmark.rate='high': expected float"),
                               ("rate", 1.5, "benchmark.rate=1.5: must be in [0, 1]"),
                               ("cap", 0, "benchmark.cap=0: must be >= 1"),
                               ("name", 7, "benchmark.name=7: expected str")]:
        with pytest.raises(CompositionError) as info:
            check_spec("benchmark", {**base, key: value})
        assert str(info.value).startswith(needle), str(info.value)
