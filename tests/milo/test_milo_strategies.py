"""MILO's strategies are objects chosen by config: a registered name maps to its object,
a ``_target_`` builds another object of the protocol (and the run uses it), anything else
is refused naming the key, the allowed values and the fix; orchestrator moves are typed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from milo_helpers import node
from milo_ray.config.schemas import register_configs
from milo_ray.milo.config import MiloConfig
from milo_ray.milo.island import Island
from milo_ray.milo.loop import MiloMethod
from milo_ray.milo.strategies import (MEMORIES, PARENT_SELECTIONS, BestAccuracySelection, FlatArchiveMemory,
                                      LineageMemory, SoftmaxSelection)

CONF = str(Path(__file__).resolve().parents[2] / "conf")


class YoungestAdmitted:
    """A custom parent selection: the most recently admitted harness; remembers every
    pool it chose from (node ids), in call order."""

    name = "youngest"

    def __init__(self, log: str | None = None) -> None:
        self.pools: list[list[str]] = []
        self.log = log  # a file each choice is appended to: in a run the island's actor chooses, in its own process

    def select(self, pool, rng) -> int:
        self.pools.append([n.node_id for n in pool.nodes])
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps(self.pools[-1]) + "\n")
        return len(pool.nodes) - 1

    def logged(self) -> list[list[str]]:
        return [json.loads(line) for line in Path(self.log).read_text().splitlines()] if self.log else self.pools


class NodeCountMemory:
    """A custom memory rendering: one line naming the island and its size."""

    name = "node_count"

    def render(self, lineage, *, mutator, stall, best_val) -> str:
        return f"# island {lineage.island}: {len(lineage)} harnesses (mutator {mutator})\n"


def _island() -> Island:
    isl = Island(0)
    isl.add_node(node("a", acc=0.6, behavior={"t1": 1.0, "t2": 0.2}))
    isl.add_node(node("b", parent="a", acc=0.3, tokens=5e4, behavior={"t1": 0.0, "t2": 0.6}))
    isl.add_node(node("c", parent="a", acc=0.2, tokens=4e4, seconds=300, behavior={"t1": 0.0, "t2": 0.4}))
    return isl


def _compose(*overrides):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_registered_names_map_to_their_objects():
    assert isinstance(PARENT_SELECTIONS.resolve("softmax", key="k"), SoftmaxSelection)
    assert isinstance(PARENT_SELECTIONS.resolve("best", key="k"), BestAccuracySelection)
    assert isinstance(MEMORIES.resolve("lineage", key="k"), LineageMemory)
    assert isinstance(MEMORIES.resolve("flat", key="k"), FlatArchiveMemory)
    cfg = MiloConfig(parent_selection="best", memory="flat")
    assert (cfg.parent_selection_strategy.name, cfg.memory_strategy.name) == ("best", "flat")


def test_a_name_and_its_object_choose_the_same_parent_for_every_seed():
    isl = _island()
    for mode, obj in (("softmax", SoftmaxSelection()), ("best", BestAccuracySelection())):
        assert [isl.select_parent(s, mode) for s in range(40)] == [isl.select_parent(s, obj) for s in range(40)]
    # Softmax draws only from the seeded generator it is handed.
    pool = isl.parent_pool()
    picks = {SoftmaxSelection().select(pool, np.random.default_rng(s)) for s in range(40)}
    assert len(picks) > 1


@pytest.mark.parametrize("field,value,allowed", [
    ("parent_selection", "worst", "'softmax', 'best'"),
    ("memory", "none", "'lineage', 'flat'"),
    ("mutator_mode", "telepathic", "'agentic', 'one_shot'"),
])
def test_an_unknown_name_is_refused_naming_the_key_the_allowed_values_and_the_fix(field, value, allowed):
    with pytest.raises(ValueError) as err:
        MiloMethod(**{field: value})
    msg = str(err.value)
    assert msg.startswith(f"method.{field}={value!r}: unknown "), msg
    assert f"allowed: {allowed}" in msg and f"fix: set method.{field}=" in msg, msg


def test_a_target_that_builds_no_parent_selection_is_refused_naming_what_it_lacks():
    with pytest.raises(ValueError, match=r"method\.parent_selection=.*OrderedDict is not a ParentSelection "
                                         r"\(it lacks name, select\)"):
        MiloMethod(parent_selection={"_target_": "collections.OrderedDict"})
    with pytest.raises(ValueError, match=r"method\.memory\._target_=no_such_module\.Memory: cannot be built"):
        MiloMethod(memory={"_target_": "no_such_module.Memory"})
    # A plain enumerated field takes names only.
    with pytest.raises(ValueError, match=r"method\.mutator_mode=.*a mutator mode is one of the names"):
        MiloMethod(mutator_mode={"_target_": "collections.OrderedDict"})


def test_a_parent_selection_given_by_target_in_the_config_is_built_and_used():
    cfg = _compose("method=milo_C", "method.parent_selection={_target_:test_milo_strategies.YoungestAdmitted}",
                   "method.memory={_target_:test_milo_strategies.NodeCountMemory}")
    method = instantiate(cfg.method, _convert_="all")  # as the entry point builds it
    selection, memory = method.cfg.parent_selection_strategy, method.cfg.memory_strategy
    assert isinstance(selection, YoungestAdmitted) and isinstance(memory, NodeCountMemory)
    isl = _island()
    assert isl.select_parent(0, selection) == "c"  # softmax and best would never agree on c every time
    assert isl.select_parent(0, "best") == "a"
    assert isl.render(memory=memory, mutator="bold") == "# island 0: 3 harnesses (mutator bold)\n"


# A whole in-process MILO run (about 20 s): the slow stage.
@pytest.mark.slow
def test_the_loop_selects_parents_and_renders_memory_with_the_configured_objects(tmp_path, ray_local):
    from test_loop import SMALL, events, make_ctx

    selection = YoungestAdmitted(log=str(tmp_path / "choices.jsonl"))
    ctx = make_ctx(tmp_path)
    try:
        MiloMethod(num_islands=1, orchestrator=False, max_rounds=2, parent_selection=selection,
                   memory={"_target_": "test_milo_strategies.NodeCountMemory"}, **SMALL).run(ctx)
    finally:
        ctx.scheduler.close()
    pools = selection.logged()
    assert len(pools) == 2  # one choice per round
    children = sorted((e["payload"]["node"] for e in events(ctx.store, "milo.node")
                       if e["payload"]["node"]["origin"] == "mutation"), key=lambda n: n["round"])
    assert [c["parent"] for c in children] == [pool[-1] for pool in pools]
    memos = sorted(Path(ctx.run_dir).rglob("round-*.memory.md"))
    assert len(memos) == 2 and all(m.read_text().startswith("# island 0: ") for m in memos)
    requests = sorted(Path(ctx.run_dir).rglob("round-*.request.json"))
    assert requests and all('"memory": "node_count"' in r.read_text() for r in requests)
