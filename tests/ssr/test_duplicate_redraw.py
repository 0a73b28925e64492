"""A child identical to the parent or to an earlier candidate is re-drawn with a fresh
seed, so every evidence strategy races M distinct children when the optimizer can
write them (under topk_fixed every candidate gets the same evidence)."""

from __future__ import annotations

import json

import pytest

from milo_ray.context import RunContext
from milo_ray.execution.budget import BudgetLedger
from milo_ray.harness.model import Harness
from ssr_slice import SliceBenchmark


def _run(tmp_path, retries: int) -> list[dict]:
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.ssr.loop import SSRMethod
    from milo_ray.store.memory import MemoryRunStore

    bench = SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0), {"train": 8, "val": 4, "test": 2})
    store = MemoryRunStore(run_id="dup")
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    # One refresh and the first stage of one race: 8 + (4 + 1) * 4.
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store, model_id="offline",
                             run_id="dup", budget=BudgetLedger(executions=28), slots_per_node=4, progress=False)
    agents = {"judge": OfflineJudge(), "optimizer": {"_target_": "milo_ray.testing.fake_agents.SameEditFirstOptimizer"}, "embedder": HashingEmbedder(dim=32)}
    ctx = RunContext(run_id="dup", run_dir=tmp_path / f"r{retries}", seed=3, store=store, benchmark=bench,
                     scheduler=sched, model_id="offline", agents=agents)
    try:
        SSRMethod(initial="minimal", evidence="topk_fixed", b_v=[2, 2], b_s=1, b_f=1, rollouts=1, stages=2,
                  patience=1, test_rollouts=1, evaluate_initial=False, max_concurrent_candidates=4,
                  duplicate_retries=retries).run(ctx)
    finally:
        sched.close()
    return [json.loads(r["payload"]) for r in store.read("events").to_pylist() if r["kind"] == "ssr.candidates"]


def test_duplicate_children_are_redrawn_so_all_m_candidates_race(tmp_path, ray_local):
    (event,) = _run(tmp_path, retries=2)
    assert len(event["racing"]) == 4 and len(set(event["racing"])) == 4, event["generated"]
    assert [g["redraws"] for g in event["generated"]] == [0, 1, 1, 1]


def test_without_redraws_duplicates_are_dropped(tmp_path, ray_local):
    (event,) = _run(tmp_path, retries=0)
    assert len(event["racing"]) == 1
    assert [g["redraws"] for g in event["generated"]] == [0, 0, 0, 0]
    # The event says why the dropped ones do not race.
    assert [g["error"] is not None and g["error"].startswith("duplicate") for g in event["generated"]] == \
        [False, True, True, True]


def test_duplicates_are_found_against_the_parent_and_earlier_candidates():
    from milo_ray.ssr.candidates import CandidateOutcome
    from milo_ray.ssr.children import duplicates

    parent = Harness.from_source("def build_agent(model, backend):\n    return 0\n")
    a = Harness.from_source("def build_agent(model, backend):\n    return 1\n")
    out = [CandidateOutcome(0, 1, 0, a, None), CandidateOutcome(1, 1, 0, parent, None),
           CandidateOutcome(2, 1, 0, a, None), CandidateOutcome(3, 1, 0, a, "invalid child"),
           CandidateOutcome(4, 1, 0, None, "no child")]
    assert duplicates(parent, out) == [1, 2]
