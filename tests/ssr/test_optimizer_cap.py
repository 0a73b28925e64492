"""SSR's optimizer calls run under ``method.optimizer_time_cap_s``: a hung optimizer
fails its candidates with the reason, its spend is recorded as unknown, and the run
goes on to test its incumbent."""

from __future__ import annotations

import json
import time

from milo_ray.context import RunContext
from milo_ray.execution.budget import BudgetLedger
from ssr_slice import SliceBenchmark


def test_a_hung_optimizer_is_stopped_at_the_cap_and_the_run_ends_with_its_incumbent(tmp_path, ray_local):
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.ssr.loop import SSRMethod
    from milo_ray.store.memory import MemoryRunStore

    bench = SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0), {"train": 8, "val": 4, "test": 2})
    store = MemoryRunStore(run_id="cap")
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store, model_id="offline",
                             run_id="cap", budget=BudgetLedger(executions=60), slots_per_node=4, progress=False)
    hung = {"_target_": "milo_ray.testing.fake_agents.CountingMutator", "log": str(tmp_path / "calls"),
            "sleep_s": 300}
    ctx = RunContext(run_id="cap", run_dir=tmp_path / "run", seed=3, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline", agents={"judge": OfflineJudge(), "optimizer": hung,
                                                 "embedder": HashingEmbedder(dim=32)})
    t0 = time.monotonic()
    try:
        summary = SSRMethod(initial="minimal", scales=[0.5, 1.0], b_v=[2, 2], b_s=1, b_f=1, rollouts=1, stages=2,
                            patience=1, test_rollouts=1, evaluate_initial=False, max_concurrent_candidates=2,
                            duplicate_retries=0, optimizer_time_cap_s=2.0).run(ctx)
    finally:
        sched.close()
    assert time.monotonic() - t0 < 200  # two rounds of two hung calls, each stopped at ~2 s (+ grace)
    assert not summary["improved"] and summary["final_test"], summary
    calls = [r for r in store.read("agent_calls").to_pylist() if r["role"] == "optimizer"]
    assert calls and all(r["error"] == "timed out after 2s" and r["cost_usd"] is None for r in calls)
    generated = [g for e in store.read("events").to_pylist() if e["kind"] == "ssr.candidates"
                 for g in json.loads(e["payload"])["generated"]]
    assert generated and all("timed out after 2s" in (g.get("error") or "") for g in generated), generated
