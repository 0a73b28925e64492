"""The validator's entry option: optimizer programs (``optimize(values, *, seed,
deadline)``) are validated for their own entry, agent harnesses for ``build_agent``,
and neither passes as the other."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from milo_ray.harness.model import Harness
from milo_ray.harness.validate import validate, validate_many
from milo_ray.search.mutation import ValidationOptions, _validate

SEEDS_DIR = Path(__file__).resolve().parents[2] / "milo_ray" / "benchmarks" / "einstein" / "seeds"
SEEDS = sorted(p.parent.name for p in SEEDS_DIR.glob("*/harness.py"))
AGENT = "def build_agent(model, backend):\n    return {'model': model, 'backend': backend}\n"


def seed(name: str) -> Harness:
    return Harness({"harness.py": (SEEDS_DIR / name / "harness.py").read_text()})


def src(text: str) -> Harness:
    return Harness.from_source(textwrap.dedent(text))


def test_every_einstein_seed_validates_as_an_optimizer_program():
    assert len(SEEDS) >= 4
    results = validate_many([seed(n) for n in SEEDS], entry="optimize", max_workers=2)
    assert [(r.ok, r.reason) for r in results] == [(True, None)] * len(SEEDS)


def test_an_agent_harness_is_not_an_optimizer_program_and_vice_versa():
    r_agent, r_seed = validate_many([src(AGENT), seed(SEEDS[0])], entry="optimize"), validate(seed(SEEDS[0]))
    assert (r_agent[0].ok, r_agent[0].check) == (False, "entry")
    assert "optimize(values, *, seed, deadline)" in r_agent[0].reason
    assert (r_seed.ok, r_seed.check) == (False, "entry")
    assert "build_agent(model, backend)" in r_seed.reason


@pytest.mark.parametrize(
    ("signature", "ok"),
    [
        ("values, *, seed, deadline", True),
        ("values, *, seed, deadline, restarts=3", True),
        ("values, extra=None, *, seed, deadline", True),
        ("values, seed, deadline", False),  # positional seed/deadline: the runner passes keywords only
        ("values, *, seed", False),
        ("*, seed, deadline", False),
        ("values, other, *, seed, deadline", False),
        ("values, *, seed, deadline, budget", False),
    ],
)
def test_optimize_signature_must_accept_the_runners_call(signature, ok):
    r = validate(src(f"def optimize({signature}):\n    return values\n"), entry="optimize")
    assert r.ok is ok, r.reason
    if not ok:
        assert r.check == "signature" and "keyword-only parameters seed and deadline" in r.reason


def test_unknown_entry_raises_naming_the_field():
    with pytest.raises(ValueError, match="entry"):
        validate(src(AGENT), entry="run")


def test_mutation_validation_options_pass_the_entry_and_key_the_verdict_cache_on_it():
    parent, child = src(AGENT), seed(SEEDS[0])
    assert _validate(child, parent, ValidationOptions(entry="optimize")) is None
    # Same child, same other options: the cached "optimize" verdict must not answer for build_agent.
    reason = _validate(child, parent, ValidationOptions())
    assert reason is not None and "build_agent(model, backend)" in reason
