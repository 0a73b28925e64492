"""MILO configs compose with Hydra and every ladder rung differs in the intended field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from milo_ray.config import register_configs
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
