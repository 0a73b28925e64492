"""End to end: SSR on a small slice of the surrogate through the real scheduler,
store and Ray. Resume (after a finished run and after kills at several points) is
tested in ``test_ssr_resume.py``."""

from __future__ import annotations

from milo_ray.context import RunContext
from milo_ray.execution.budget import BudgetLedger
from ssr_slice import SliceBenchmark

BUDGET = 140


def _ctx(tmp_path, store, bench):
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
    from milo_ray.execution.scheduler import RolloutScheduler

    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store, model_id="offline",
                             run_id="ssr-test", budget=BudgetLedger(executions=BUDGET), slots_per_node=4)
    agents = {"judge": OfflineJudge(malformed_rate=0.1), "optimizer": OfflineCandidateOptimizer(),
              "embedder": HashingEmbedder(dim=64)}
    return RunContext(run_id="ssr-test", run_dir=tmp_path, seed=7, store=store, benchmark=bench, scheduler=sched,
                      model_id="offline", agents=agents)


def test_ssr_end_to_end_within_budget(tmp_path, ray_local):
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.loop import SSRMethod
    from milo_ray.store.memory import MemoryRunStore

    bench = SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0),
                           {"train": 12, "val": 6, "test": 10})
    method = SSRMethod(initial="minimal", b_v=[3, 3], b_s=2, b_f=2, rollouts=2, stages=2, patience=2,
                       test_rollouts=3, max_concurrent_candidates=2)
    store = MemoryRunStore(run_id="ssr-test")
    ctx = _ctx(tmp_path, store, bench)
    try:
        summary = method.run(ctx)
    finally:
        ctx.scheduler.close()

    rollouts = store.read("rollouts").to_pylist()
    searched = [r for r in rollouts if r["stage"] != "test"]
    assert summary["executions_used"] == len(searched) <= BUDGET
    assert len({r["cache_key"] for r in rollouts}) == len(rollouts)  # nothing ran twice
    assert summary["rounds"] >= 1 and summary["stop_reason"] in ("budget", "patience")
    # test evaluation: 3 per test task for the final (and initial) harness, outside the budget
    tested = [r for r in rollouts if r["stage"] == "test"]
    assert len(tested) == 3 * 10 * (2 if summary["improved"] else 1)
    assert {"pass_at_k", "rr_at_k", "pr_at_k", "rr_ci", "pr_ci"} <= set(summary["test_final"])
    assert [r["harness_id"] for r in summary["final_test"]][0] == summary["final_harness"]
    assert all(r["k"] == 3 and r["n_tasks"] == 10 and r["true_score"] is not None for r in summary["final_test"])
    assert "final_true_quality" in summary and "initial_true_quality" in summary

    harnesses = store.read("harnesses").to_pylist()
    assert [h["origin"] for h in harnesses].count("seed") == 1
    cands = [h for h in harnesses if h["origin"] == "ssr_candidate"]
    assert cands and all(h["evidence_scale"] >= 1 and h["parent_id"] for h in cands)
    experience = store.read("experience").to_pylist()
    assert len([e for e in experience if e["round"] == 0]) == 12
    assert all(e["judge_error"] or 0 <= e["w"] <= 1 for e in experience)
    # Each embedded record names the model that embedded it.
    from milo_ray.agents.embedder import HashingEmbedder

    assert {e["embedder"] for e in experience if e["embedding"] is not None} == {HashingEmbedder(dim=64).model_name}
    kinds = [e["kind"] for e in store.read("events").to_pylist()]
    for k in ("ssr.refresh", "ssr.candidates", "ssr.stage", "ssr.stage_result", "ssr.selection", "ssr.stop"):
        assert k in kinds
    for sel in [e for e in store.read("events").to_pylist() if e["kind"] == "ssr.selection"]:
        import json

        p = json.loads(sel["payload"])
        if p["replaced"]:
            assert p["best_child_score"] > p["parent_score"]
