"""SSR's strategies are objects chosen by config: evidence ordering, evidence sets and
the racing rule. A registered name maps to its object, a ``_target_`` builds another
object of the protocol (and the run uses it), anything else is refused naming the key,
the allowed values and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from milo_ray.config.schemas import register_configs
from milo_ray.ssr import evidence as ev
from milo_ray.ssr.config import SSRConfig
from milo_ray.ssr.racing import (RACING_RULES, GeometricHalving, NoElimination, PairedElimination, Race, RaceCandidate,
                                 RaceConfig, RuleDecision, SuccessiveHalving, UniformRace)
from milo_ray.ssr.strategies import (EVIDENCE_SETS, ORDERINGS, FixedN, MultiscalePrefixes, QualityOnlyOrdering,
                                     RandomOrdering, RerOrdering, TopKFixed, TopKResampling)
from test_ssr_evidence import _recs  # one way to build embedded records for both files

CONF = str(Path(__file__).resolve().parents[2] / "conf")
ORDER = [f"t{i}" for i in range(10)]
FR = [0.25, 0.5, 0.75, 1.0]


class ReverseOrdering:
    """A custom ordering: the judged records last to first; remembers the task ids of
    every call's records."""

    name = "reverse"

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def order(self, records, rng):
        self.seen.append([r.task_id for r in records])
        return list(range(len(records)))[::-1]


class FirstRecordOnly:
    """A custom evidence strategy: every candidate sees the first record only."""

    name = "first_only"

    def sets(self, order, sizes, m, rng):
        return [tuple(order[:1]) for _ in range(m)]


class KeepOne:
    """A custom racing rule: one child survives every intermediate stage."""

    name = "keep_one"

    def after_stage(self, view):
        return RuleDecision(view.ranked[:1])




def _race(rule=None, cls=Race, m=4):
    cands = [RaceCandidate(f"c{i}", i, tuple(ORDER[: i + 1])) for i in range(m)]
    return cls("parent", cands, order=ORDER, parent_success=ORDER[::2], parent_failure=ORDER[1::2],
               validation=[f"v{i}" for i in range(8)], config=RaceConfig(2, (2, 2), 1, 1, 1),
               rng=np.random.default_rng(0), **({} if rule is None else {"rule": rule}))


def _survivors(race):
    req = race.next_stage()
    return race.record([(h, t, i, int(h[1:]) / 10 if h != "parent" else 0.0) for h, t, i in req.runs]).survivors


def test_registered_names_map_to_their_objects():
    assert [type(ORDERINGS.resolve(n, key="k")) for n in ("rer", "random", "quality_only")] == \
        [RerOrdering, RandomOrdering, QualityOnlyOrdering]
    assert [type(EVIDENCE_SETS.resolve(n, key="k")) for n in ("rer", "topk_fixed", "topk_resampling", "fixed_n")] == \
        [MultiscalePrefixes, TopKFixed, TopKResampling, FixedN]
    assert [type(RACING_RULES.resolve(n, key="k")) for n in ("successive_halving", "uniform", "halving", "paired")] == \
        [SuccessiveHalving, NoElimination, GeometricHalving, PairedElimination]
    cfg = SSRConfig(evidence="fixed_n", ordering="random", racing="uniform")
    assert (cfg.evidence_strategy.name, cfg.ordering_strategy.name, cfg.racing_strategy.name) == \
        ("fixed_n", "random", "uniform")


@pytest.mark.parametrize("name", ["rer", "random", "quality_only"])
def test_an_ordering_name_and_its_object_give_the_same_order_for_the_same_seed(name):
    recs = _recs([0.2, 0.9, 0.4, 0.5, 0.1, 0.7])
    obj = ORDERINGS.resolve(name, key="k")
    assert ev.order_records(recs, name, np.random.default_rng(3)) == ev.order_records(recs, obj, np.random.default_rng(3))


@pytest.mark.parametrize("name", ["rer", "topk_fixed", "topk_resampling", "fixed_n"])
def test_an_evidence_name_and_its_object_give_the_same_sets_for_the_same_seed(name):
    obj = EVIDENCE_SETS.resolve(name, key="k")
    assert ev.evidence_sets(ORDER, FR, name, np.random.default_rng(4)) == \
        ev.evidence_sets(ORDER, FR, obj, np.random.default_rng(4))


def test_the_racing_rules_eliminate_as_their_races_did():
    assert _survivors(_race()) == ("c2", "c3")  # successive halving: n_1 = 4 - 2
    assert _survivors(_race(NoElimination())) == _survivors(_race(cls=UniformRace)) == ("c0", "c1", "c2", "c3")
    assert _survivors(_race(KeepOne())) == ("c3",)


@pytest.mark.parametrize("field,value,allowed", [
    ("evidence", "best", "'rer', 'topk_fixed', 'topk_resampling', 'fixed_n'"),
    ("ordering", "alphabetical", "'rer', 'random', 'quality_only'"),
    ("racing", "knockout", "'successive_halving', 'uniform', 'halving', 'paired', 'paired_rejects', 'bandit', 'lowrank'"),
])
def test_an_unknown_name_is_refused_naming_the_key_the_allowed_values_and_the_fix(field, value, allowed):
    with pytest.raises(ValueError) as err:
        SSRConfig(**{field: value})
    msg = str(err.value)
    assert msg.startswith(f"method.{field}={value!r}: unknown "), msg
    assert f"allowed: {allowed}, or a {{_target_: ...}}" in msg and f"fix: set method.{field}=" in msg, msg


def test_a_target_that_builds_no_racing_rule_is_refused_naming_what_it_lacks():
    with pytest.raises(ValueError, match=r"method\.racing=.*ReverseOrdering is not a RacingRule \(it lacks after_stage\)"):
        SSRConfig(racing={"_target_": "test_ssr_strategies.ReverseOrdering"})


def test_strategies_given_by_target_in_the_config_are_built_and_used():
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=ssr_swepro",
                                           "method.ordering={_target_:test_ssr_strategies.ReverseOrdering}",
                                           "method.evidence={_target_:test_ssr_strategies.FirstRecordOnly}",
                                           "method.racing={_target_:test_ssr_strategies.KeepOne}"])
    method = instantiate(cfg.method, _convert_="all")  # as the entry point builds it
    c = method.cfg
    assert isinstance(c.ordering_strategy, ReverseOrdering) and isinstance(c.evidence_strategy, FirstRecordOnly)
    assert isinstance(c.racing_strategy, KeepOne)
    assert ev.order_records(_recs([0.1, 0.9, 0.5]), c.ordering_strategy, np.random.default_rng(0)) == ["t2", "t1", "t0"]
    assert ev.evidence_sets(ORDER, FR, c.evidence_strategy, np.random.default_rng(0)) == [("t0",)] * 4


def test_the_loop_orders_evidence_draws_sets_and_races_with_the_configured_objects(tmp_path, ray_local):
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.ssr.loop import SSRMethod
    from milo_ray.store.memory import MemoryRunStore
    from ssr_slice import SliceBenchmark

    bench = SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0), {"train": 8, "val": 4, "test": 2})
    store = MemoryRunStore(run_id="strategies")
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    # One refresh (8) and one race of four children: stage 1 (4 tasks x 5 harnesses),
    # stage 2 (4 tasks x (1 survivor + the parent)).
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store, model_id="offline",
                             run_id="strategies", budget=BudgetLedger(executions=36), slots_per_node=4, progress=False)
    agents = {"judge": OfflineJudge(), "optimizer": OfflineCandidateOptimizer(), "embedder": HashingEmbedder(dim=32)}
    ctx = RunContext(run_id="strategies", run_dir=tmp_path, seed=3, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline", agents=agents)
    method = SSRMethod(initial="minimal", b_v=[2, 2], b_s=1, b_f=1, rollouts=1, stages=2, patience=1, test_rollouts=1,
                       evaluate_initial=False, max_concurrent_candidates=4, ordering=(ordering := ReverseOrdering()),
                       evidence={"_target_": "test_ssr_strategies.FirstRecordOnly"},
                       racing={"_target_": "test_ssr_strategies.KeepOne"})
    try:
        summary = method.run(ctx)
    finally:
        sched.close()
    events = [(r["kind"], json.loads(r["payload"])) for r in sorted(store.read("events").to_pylist(),
                                                                     key=lambda r: r["seq"])]
    (refresh,) = [p for k, p in events if k == "ssr.refresh"]
    assert len(ordering.seen) == 1 and len(ordering.seen[0]) > 1
    assert refresh["ordering"] == "reverse" and refresh["order"] == ordering.seen[0][::-1]
    (chosen,) = [p for k, p in events if k == "ssr.candidates"]
    assert chosen["evidence"] == "first_only" and [g["scale"] for g in chosen["generated"]] == [1, 1, 1, 1]
    first = [p for k, p in events if k == "ssr.stage_result"][0]
    assert len(chosen["racing"]) > 2  # successive halving would keep two of them
    assert len(first["survivors"]) == 1 and len(first["eliminated"]) == len(chosen["racing"]) - 1
    assert (summary["ordering"], summary["evidence"], summary["racing"]) == ("reverse", "first_only", "keep_one")
