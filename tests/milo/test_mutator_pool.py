"""Mutator pool bookkeeping, seats, accounts and the fair queue, and failure handling (no Ray)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from milo_ray.agents.protocols import MutationRequest
from milo_ray.harness.model import Harness
from milo_ray.milo.mutator_pool import FairSeats, MutatorPool, account_of, spec_names
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


# --------------------------------------------------------------------------- seats, accounts, fair queue
def test_a_key_with_fewer_seats_is_served_first_so_no_island_starves():
    seats = FairSeats()
    granted = []
    for i in range(5):  # island 0 queues five mutations first
        granted += seats.request(f"a{i}", 0, 2)
    granted += seats.request("b0", 1, 2)  # island 1 one, later
    assert granted == ["a0", "a1"]
    assert seats.release("a0") == ["b0"]  # island 1 holds none: it goes before island 0's third
    assert seats.release("a1") == ["a2"]


def test_seats_held_never_exceed_the_limit_and_every_request_is_served():
    rng = np.random.default_rng(7)
    seats, served, limit, n = FairSeats(), [], 3, 0
    for step in range(2000):
        if rng.random() < 0.55 and n < 400:
            served += seats.request(f"m{n}", int(rng.integers(4)), limit)
            n += 1
        elif seats.held:
            served += seats.release(str(rng.choice(sorted(seats.held))))
        assert len(seats.held) <= limit
    while seats.held:
        served += seats.release(sorted(seats.held)[0])
    assert sorted(served) == sorted(f"m{i}" for i in range(n))  # no request left waiting


def test_requests_are_idempotent_by_lease_id():
    seats = FairSeats()
    assert seats.request("x", 0, 1) == ["x"]
    assert seats.request("x", 0, 1) == []  # held already: no second seat
    assert seats.request("y", 0, 1) == [] and seats.request("y", 0, 1) == []
    assert seats.waiting() == ["y"] and list(seats.held) == ["x"]
    assert seats.release("x") == ["y"]


def test_an_adopted_seat_counts_and_an_expired_seat_is_taken_back():
    seats = FairSeats()
    seats.adopt("old", "dead-run", expires_at=10.0)
    assert seats.request("new", "live-run", 1) == []  # the adopted seat counts
    assert seats.expire(now=5.0) == []
    assert seats.expire(now=10.0) == ["new"] and seats.held["new"] == ("live-run", None)


def test_a_spec_without_seats_gets_the_per_run_limit_and_no_shared_account():
    pool = MutatorPool(SPECS, max_concurrent=5)
    assert pool.limits == {"bold": 5, "bold#2": 5, "Other": 5}
    assert set(pool.accounts.values()) == {None}


def test_declared_seats_are_the_limit_and_never_reach_the_mutator():
    specs = [{"_target_": "x.M", "name": "a", "seats": 2}, {"_target_": "x.M", "name": "b"}]
    pool = MutatorPool(specs, max_concurrent=8)
    assert pool.limits == {"a": 2, "b": 8}
    assert pool.accounts["a"] is not None and pool.accounts["b"] is None
    pool.assign(0, "a")
    assert "seats" not in pool.spec("a") and "seats" not in pool.lease("m", 0).spec


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_seats_are_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"mutators\[1\]\.seats"):
        MutatorPool([{"_target_": "x.M"}, {"_target_": "x.N", "seats": bad}])


def test_mutators_share_an_account_by_cli_binary_or_key_variable_and_api_base():
    cli = "milo_ray.agents.mutators.cli.CliMutator"
    dpa = "milo_ray.agents.mutators.deepagents.DeepAgentsMutator"
    assert account_of({"_target_": cli, "preset": "claude", "model": "x"}) == \
        account_of({"_target_": cli, "command": ["/usr/local/bin/claude", "-p", "{prompt}"]})
    assert account_of({"_target_": cli, "preset": "codex"}) != account_of({"_target_": cli, "preset": "claude"})
    llm = {"model": "openai/gpt-4o", "api_key_env": "OPENAI_API_KEY", "api_base": "https://u:secret@proxy"}
    a = account_of({"_target_": dpa, "name": "one", "llm": llm})
    assert a == account_of({"_target_": dpa, "name": "two", "llm": {**llm, "model": "openai/gpt-4o-mini"}})
    assert a != account_of({"_target_": dpa, "llm": {**llm, "api_base": "https://other"}})
    assert a != account_of({"_target_": dpa, "llm": {**llm, "api_key_env": "OTHER_KEY"}})
    # No variable named: the one litellm reads for the provider.
    assert account_of({"_target_": dpa, "llm": {"model": "openai/gpt-4o"}}) == \
        account_of({"_target_": dpa, "llm": {"model": "openai/o3", "api_key_env": "OPENAI_API_KEY"}})
    label, key = a
    assert "secret" not in label and "secret" not in key and label == "api:OPENAI_API_KEY"


def test_the_assignment_is_a_projection_of_the_runs_events():
    from milo_ray.milo.events import Init, IslandFounded, Reassign

    events = [Init([], [], [], [0, 1], {0: "bold", 1: "bold"}), Reassign(1, "Other", "d1"),
              IslandFounded(2, 0, "0-3", "bold#2", "d2", 0)]
    pool = MutatorPool(SPECS)
    for e in events:
        pool.apply(e)
    assert pool.assignment == {0: "bold", 1: "Other", 2: "bold#2"}
    assert pool.lease("i2", 2).mutator == "bold#2" and pool.lease("i2", 2).time_cap_s == pool.time_cap_s
