"""Mutator pool bookkeeping and failure handling (no Ray)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from milo_ray.agents.protocols import MutationRequest
from milo_ray.harness.model import Harness
from milo_ray.milo.mutator_pool import MutatorPool, spec_names
from milo_ray.search.mutation import run_mutation

SPECS = [{"_target_": "x.M", "personality": "bold"}, {"_target_": "x.M", "personality": "bold"},
         {"_target_": "pkg.Other"}]


def test_spec_names_are_unique_and_readable():
    assert spec_names(SPECS) == ["bold", "bold#2", "Other"]


def test_initial_assignment_is_uniform_random_and_seeded():
    pool = MutatorPool(SPECS)
    a = pool.assign_initial(range(300), np.random.default_rng(0))
    b = MutatorPool(SPECS).assign_initial(range(300), np.random.default_rng(0))
    assert a == b
    counts = np.bincount([pool.names.index(m) for m in a.values()], minlength=3)
    assert counts.min() > 70  # every mutator gets a share


def test_default_mutator_and_reassign():
    pool = MutatorPool(SPECS)
    assert set(pool.assign_initial([0, 1], np.random.default_rng(0), default="Other").values()) == {"Other"}
    pool.assign(1, "bold")
    assert pool.mutator_for(1) == "bold"
    with pytest.raises(ValueError, match="not in the pool"):
        pool.assign(0, "nope")
    with pytest.raises(ValueError, match="no mutator specs"):
        MutatorPool([])


def test_crashing_mutator_becomes_an_error_result(tmp_path: Path):
    req = MutationRequest(parent=Harness.from_source("def build_agent(model, backend):\n    return None\n"),
                          parent_dir=tmp_path, evidence_dir=tmp_path, memory_markdown="", workdir=tmp_path, seed=0)
    res = run_mutation({"_target_": "no.such.module.Mutator"}, req, time_cap_s=30)
    assert res.child is None and res.error.startswith("mutator crashed")
