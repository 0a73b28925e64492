"""MILO configs compose with Hydra and every ladder rung differs in the intended field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from milo_ray.config.schemas import register_configs
from milo_ray.milo.config import MiloConfig
from milo_ray.milo.loop import MiloMethod

CONF = str(Path(__file__).resolve().parents[2] / "conf")
LADDER = {  # rung: (mutator_mode, memory, parent_selection, num_islands, orchestrator)
    "A": ("one_shot", "flat", "best", 1, False),
    "B": ("agentic", "flat", "best", 1, False),
    "C": ("agentic", "lineage", "softmax", 1, False),
    "D": ("agentic", "lineage", "softmax", 3, False),
    "E": ("agentic", "lineage", "softmax", 3, True),
}


def _compose(*overrides):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("rung", sorted(LADDER))
def test_ladder_rungs_add_one_mechanism_each(rung):
    m = _compose(f"method=milo_{rung}").method
    assert (m.mutator_mode, m.memory, m.parent_selection, m.num_islands, m.orchestrator) == LADDER[rung]
    assert m._target_ == "milo_ray.milo.loop.MiloMethod"


def test_full_milo_defaults_follow_the_paper():
    m = _compose("method=milo").method
    assert (m.num_islands, m.patience, m.temperature, m.k_search, m.eps, m.max_moves) == (3, 3, 1.0, 3, 0.02, 2)
    assert (m.token_cap, m.seconds_cap, m.island_concurrency, m.pool_size) == (20_000_000, 7200, 8, None)
    assert m.mutation_time_cap_s == 45 * 60 and m.search_split is None


@pytest.mark.parametrize("exp", ["milo_tb21", "milo_deepswe", "milo_swepro"])
def test_experiments_compose(exp):
    c = _compose(f"+experiment={exp}")
    assert c.method._target_ == "milo_ray.milo.loop.MiloMethod"
    assert c.benchmark.preset.startswith("surrogate_")


@pytest.mark.parametrize("field,value", [("mutator_mode", "telepathic"), ("memory", "none"), ("patience", 0),
                                         ("temperature", 0.0), ("parent_selection", "worst")])
def test_bad_fields_are_rejected_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"method.{field}"):
        MiloMethod(**{field: value})
    MiloConfig().check()


OFFLINE_POOL = [{"_target_": "milo_ray.agents.mutators.offline.OfflineMutator", "personality": p}
                for p in ("conservative", "bold", "sloppy")]
EXPERT = ["division_of_labor", "plan_and_solve", "reproduce_first"]


def _surrogate():
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark

    return SurrogateBenchmark(preset="surrogate_tb21", seed=0)


def _initial_assignment(method_cfg) -> dict[int, str]:
    """m^(1) a run with this method config would draw (the loop's own call)."""
    import numpy as np

    from milo_ray.milo.mutator_pool import MutatorPool

    fields = {k: v for k, v in dict(method_cfg).items() if k != "_target_"}
    cfg = MiloConfig(**fields).for_run(_surrogate(), {"mutators": OFFLINE_POOL, "orchestrator": {"_target_": "x"}})
    return MutatorPool(OFFLINE_POOL).assign_initial(range(cfg.num_islands), np.random.default_rng(0),
                                                    cfg.default_mutator)


@pytest.mark.parametrize("exp", ["milo_tb21", "milo_deepswe", "milo_swepro"])
def test_paper_experiments_start_from_the_expert_seeds_with_one_mutator_in_lockstep(exp):
    m = _compose(f"+experiment={exp}").method
    assert list(m.seeds) == EXPERT
    assert m.round_sync is True
    assert set(_initial_assignment(m).values()) == {"conservative"}  # the pool's first spec on every island
    assert m.max_rounds is None or m.max_rounds >= 30  # the paper's dynamics need 30 rounds


@pytest.mark.parametrize("rung", sorted(LADDER))
def test_every_ladder_rung_starts_from_the_expert_seeds(rung):
    m = _compose(f"method=milo_{rung}").method
    assert list(m.seeds) == EXPERT and m.default_mutator == "first" and m.round_sync is True


def test_quick_milo_keeps_all_seeds_random_mutators_and_free_islands():
    m = _compose("method=milo_quick").method
    assert list(m.seeds) == [] and m.default_mutator is None and m.round_sync is False
    bench = _surrogate()
    assert len(MiloConfig(seeds=[]).seed_harnesses(bench)) == len(bench.seed_harnesses())


def test_the_schema_defaults_are_the_papers():
    c = MiloConfig()
    assert (c.seeds, c.default_mutator, c.round_sync) == (EXPERT, "first", True)
    assert [h.name for h in c.seed_harnesses(_surrogate())] == EXPERT


def test_an_unknown_seed_is_refused_in_preflight_naming_the_field_and_the_seeds(tmp_path):
    method = MiloMethod(seeds=["plan_and_solve", "telepathy"])
    with pytest.raises(ValueError, match=r"method\.seeds.*'telepathy'.*division_of_labor.*minimal"):
        method.preflight(_surrogate(), {"mutators": OFFLINE_POOL, "orchestrator": {"_target_": "x"}})
    with pytest.raises(ValueError, match=r"method\.seeds"):
        MiloMethod(seeds=["stock", "stock"])


def test_first_spec_names_the_pools_first_spec_and_refuses_ambiguity():
    agents = {"mutators": OFFLINE_POOL, "orchestrator": {"_target_": "x"}}
    assert MiloConfig().for_run(_surrogate(), agents).default_mutator == "conservative"
    pool = OFFLINE_POOL + [{"_target_": "milo_ray.agents.mutators.offline.OfflineMutator", "name": "first"}]
    with pytest.raises(ValueError, match="method.default_mutator='first' is ambiguous"):
        MiloConfig().for_run(_surrogate(), {**agents, "mutators": pool})
    with pytest.raises(ValueError, match="method.default_mutator='nobody'"):
        MiloConfig(default_mutator="nobody").for_run(_surrogate(), agents)


@pytest.mark.parametrize("exp", ["milo_tb21", "milo_deepswe", "milo_swepro"])
def test_paper_experiment_budgets_fit_thirty_rounds_per_island(exp):
    """The paper's dynamics (grafts at rounds 15 and 21, its best harness at round 27)
    need 30 rounds per founding island: the execution budget covers the seeds and 30
    rounds of every island whose every child is evaluated and admitted."""
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark

    c = _compose(f"+experiment={exp}")
    m = c.method
    bench = SurrogateBenchmark(preset=c.benchmark.preset, seed=0)
    cfg = MiloConfig(**{k: v for k, v in dict(m).items() if k != "_target_"}).for_run(
        bench, {"mutators": OFFLINE_POOL, "orchestrator": {"_target_": "x"}})
    b_search = m.search_size or len(bench.tasks(cfg.search_split))
    b_val = m.val_size or len(bench.tasks(cfg.val_split))
    child, admitted = b_search * m.k_search, b_val * m.k_val
    seeds, K = len(cfg.seed_harnesses(bench)), min(m.num_islands, len(m.seeds))
    need = seeds * child + K * admitted + K * 30 * (child + admitted)
    budget = c.run.budget.executions
    assert budget is not None and budget >= need, (exp, budget, need)


def test_a_mutator_spec_may_declare_seats_and_bad_seats_are_refused_naming_the_key():
    """``seats`` is the pool's key: accepted beside the constructor's keywords, checked
    before the run writes anything, by the composition check and by MILO's preflight."""
    from milo_ray.config.targets import CompositionError, check_agents

    seated = [{**OFFLINE_POOL[0], "seats": 2}] + OFFLINE_POOL[1:]
    check_agents({"mutators": seated}, ("mutators",), "milo")
    agents = {"mutators": seated, "orchestrator": {"_target_": "x"}}
    MiloConfig().for_run(_surrogate(), agents)
    bad = [OFFLINE_POOL[0], {**OFFLINE_POOL[1], "seats": 0}]
    with pytest.raises(CompositionError, match=r"backend\.agents\.mutators\[1\]\.seats=0"):
        check_agents({"mutators": bad}, ("mutators",), "milo")
    with pytest.raises(ValueError, match=r"backend\.agents\.mutators\[1\]\.seats=0"):
        MiloConfig().for_run(_surrogate(), {**agents, "mutators": bad})
