"""method.task_draw: a race draws the tasks the current population passes at an
intermediate rate first; the uniform draw is the paper's permutation; the test split is
never drawn; the rates follow the population."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.config import SSRConfig
from milo_ray.ssr.racing import Race, RaceCandidate, RaceConfig
from milo_ray.ssr.task_draw import DiscriminativeDraw, UniformDraw, population_rates

VAL = [f"v{i}" for i in range(20)]
BAND = {"v3", "v7", "v11", "v15"}  # the population passes these about half the time


def _rates() -> dict[str, tuple[float, int]]:
    return {t: ((0.5, 6) if t in BAND else (1.0 if i % 2 else 0.0, 6)) for i, t in enumerate(VAL)}


def _race(draw, rates, *, b_v=(4, 4), success=(), failure=(), order=(), seed=0):
    cands = [RaceCandidate(f"c{i}", i, ()) for i in range(2)]
    return Race("p", cands, order=list(order), parent_success=list(success), parent_failure=list(failure),
                validation=VAL, config=RaceConfig(2, b_v, len(success) and 2, len(failure) and 2, 1),
                rng=np.random.default_rng(seed), task_draw=draw, rates=rates)


def test_intermediate_band_tasks_are_drawn_first():
    for seed in range(5):
        req = _race(DiscriminativeDraw(), _rates(), seed=seed).next_stage()
        assert set(req.batch.validation) == BAND


def test_unobserved_tasks_come_before_tasks_outside_the_band():
    rates = {t: r for t, r in _rates().items() if t not in BAND}
    rates.update({"v3": (0.5, 6)})
    req = _race(DiscriminativeDraw(), rates, b_v=(4, 4)).next_stage()
    assert req.batch.validation[0] == "v3" and set(req.batch.validation[1:]) == {"v7", "v11", "v15"}


def test_training_classes_prefer_the_band_and_keep_rer_order_within_it():
    success = ["s0", "s1", "s2", "s3"]
    rates = {"s0": (1.0, 4), "s1": (1.0, 4), "s2": (0.5, 4), "s3": (0.6, 4)}
    race = _race(DiscriminativeDraw(), rates, success=success, order=success)
    assert race.next_stage().batch.success == ("s2", "s3")
    assert _race(UniformDraw(), rates, success=success, order=success).next_stage().batch.success == ("s0", "s1")


def test_uniform_draw_is_the_papers_permutation_whatever_the_rates():
    perm = [VAL[i] for i in np.random.default_rng(7).permutation(len(VAL))]
    for draw in (None, UniformDraw()):
        req = _race(draw, _rates(), seed=7).next_stage()
        assert list(req.batch.validation) == perm[:4]


def test_rates_count_only_the_current_population():
    cells = [("a", "t1", 1.0), ("a", "t1", 0.0), ("b", "t1", 1.0), ("gone", "t1", 0.0), ("gone", "t2", 1.0)]
    assert population_rates(cells, {"a", "b"}) == {"t1": (2 / 3, 3)}
    assert population_rates(cells, {"gone"}) == {"t1": (0.0, 1), "t2": (1.0, 1)}


def test_draw_is_refreshed_when_the_population_changes():
    # Two populations: the first passes v3 half the time, the second passes v5 half the time.
    cells = [("old", "v3", 1.0), ("old", "v3", 0.0)] + [("new", "v5", 1.0), ("new", "v5", 0.0)]
    cells += [(h, t, 1.0) for h in ("old", "new") for t in VAL if t not in ("v3", "v5") for _ in range(2)]
    cells += [("old", "v5", 1.0)] * 2 + [("new", "v3", 0.0)] * 2
    first = _race(DiscriminativeDraw(), population_rates(cells, {"old"}), b_v=(1, 1)).next_stage()
    second = _race(DiscriminativeDraw(), population_rates(cells, {"new"}), b_v=(1, 1)).next_stage()
    assert first.batch.validation == ("v3",) and second.batch.validation == ("v5",)


def test_bad_task_draw_names_the_field():
    with pytest.raises(ValueError, match="method.task_draw"):
        SSRConfig(task_draw="by_vibes")
    with pytest.raises(ValueError, match="band"):
        DiscriminativeDraw(band=(0.8, 0.2))
    assert SSRConfig(task_draw="discriminative").task_draw_strategy.name == "discriminative"


def test_ssr_run_draws_from_the_population_of_each_round_and_never_from_the_test_split(tmp_path, monkeypatch):
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.ssr import loop
    from milo_ray.store.memory import MemoryRunStore
    from ssr_inprocess import InProcessScheduler, RuleOptimizer
    from ssr_slice import SliceBenchmark

    monkeypatch.setattr("milo_ray.ssr.candidates.use_ray", lambda: False)  # the optimizer stand-in is local
    seen: list[dict] = []

    class Recording(Race):
        def __init__(self, *args, **kwargs):
            seen.append({"parent": args[0], "rates": dict(kwargs["rates"]), "draw": kwargs["task_draw"].name,
                         "validation": list(kwargs["validation"])})
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(loop, "Race", Recording)
    bench = SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0), {"train": 12, "val": 6, "test": 6})
    store = MemoryRunStore(run_id="t")
    sched = InProcessScheduler(bench, store, BudgetLedger(executions=400))
    ctx = RunContext(run_id="t", run_dir=tmp_path, seed=3, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline", agents={"judge": OfflineJudge(), "optimizer": RuleOptimizer(),
                                                 "embedder": HashingEmbedder(64)})
    summary = loop.SSRMethod(initial="minimal", b_v=[2, 2], b_s=2, b_f=2, rollouts=2, test_rollouts=1,
                             task_draw="discriminative").run(ctx)
    assert summary["task_draw"] == "discriminative" and len(seen) >= 2
    test_ids = {t.task_id for t in bench.tasks("test")}
    searched = [r for r in store.read("rollouts").to_pylist() if r["stage"] != "test"]
    assert searched and not {r["task_id"] for r in searched} & test_ids
    assert all(not set(s["validation"]) & test_ids for s in seen)
    # Round 0: only the parent's refresh (training tasks) is known; round 1 adds every
    # runner of the last race (not the parent alone: R = 2 executions) on the tasks raced.
    val_ids = {t.task_id for t in bench.tasks("val")}
    assert not set(seen[0]["rates"]) & val_ids
    assert max(n for t, (_, n) in seen[1]["rates"].items() if t in val_ids) > 2
