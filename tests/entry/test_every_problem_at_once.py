"""One validation pass reports every problem of a command line: unknown options, mistyped
values, misspelt keys (each with the closest key or option), missing paths, missing keys
and settings that cannot work -- all at once, each naming its key."""

from __future__ import annotations

import pytest

from milo_ray.config.errors import ConfigError
from milo_ray.config.paths import conf_dir
from milo_ray.config.schemas import register_configs
from milo_ray.config.validate import check_overrides

CONF = conf_dir()
register_configs()


def _problems(argv: list[str]) -> dict[str, str]:
    """Key -> its problem lines (one key may have several)."""
    with pytest.raises(ConfigError) as info:
        check_overrides(CONF, argv)
    found: dict[str, str] = {}
    for p in info.value.problems:
        found[p.key] = "\n".join(filter(None, [found.get(p.key), p.line()]))
    return found


def test_an_unknown_option_and_a_mistyped_value_are_reported_together_with_a_suggestion():
    found = _problems(["method=mio", "run.seed=abc", "method.max_round=5"])
    assert set(found) == {"method=mio", "run.seed"}, found
    assert "did you mean 'method=milo'?" in found["method=mio"]
    # method.max_round belongs to a method that does not exist: it is not judged against another one.


def test_every_misspelt_key_gets_the_closest_key_beside_it():
    found = _problems(["method.max_round=5", "run.sed=3", "execution.num_cpu=2", "model.temprature=0.5"])
    assert found.keys() == {"method.max_round", "run.sed", "execution.num_cpu", "model.temprature"}, found
    for key, meant in (("method.max_round", "method.max_rounds"), ("run.sed", "run.seed"),
                       ("execution.num_cpu", "execution.num_cpus"), ("model.temprature", "model.temperature")):
        assert f"did you mean '{meant}'?" in found[key], found[key]


def test_a_missing_path_a_missing_key_and_an_unpriced_cap_are_reported_in_one_pass(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    missing = str(tmp_path / "nowhere")
    found = _problems(["benchmark=harbor", f"benchmark.path={missing}", "model=litellm", "model.solver=openai/gpt-4o",
                       "run.budget.cost_usd=2"])
    assert f"benchmark.path={missing!r}" in found and "no such directory" in found[f"benchmark.path={missing!r}"]
    assert any("OPENAI_API_KEY" in line for line in found.values()), found
    assert any(k.startswith("run.budget.cost_usd") for k in found), found


@pytest.mark.parametrize("key", ["executions", "tokens", "cost_usd"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_zero_or_negative_budget_is_refused(key, value):
    found = _problems([f"run.budget.{key}={value}"])
    assert list(found) == [f"run.budget.{key}={float(value) if key == 'cost_usd' else int(value)}"], found
    assert "must be > 0" in next(iter(found.values()))
