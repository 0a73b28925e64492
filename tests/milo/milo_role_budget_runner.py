"""Runs the per-role cap scenarios of ``test_role_budget.py`` in their own process and
writes what each run stored as JSON (events, summary, agent_calls rows, final
rollouts).

A process of its own because the fake mutator (``milo_fakes.TokenMutator``, a known
token count per call) runs in Ray tasks, which import it by name: the tests' shared
Ray instance has no ``tests/milo`` on its workers' path; this process starts Ray with
it on ``PYTHONPATH`` (set by the test).

Usage: python milo_role_budget_runner.py OUT_JSON
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKENS = 1000  # output tokens the fake mutator reports per call
SMALL = dict(k_search=1, k_val=1, k_test=1, search_size=6, val_size=4, round_sync=True, num_islands=2)
SCENARIOS: dict[str, dict[str, Any]] = {
    # Two islands mutate per lock-step step: 2000 tokens after step 1 (< 2500: step 2
    # starts), 4000 after step 2 (>= 2500: refused before step 3).
    "mutator": {"caps": {"mutator": {"tokens": 2500}}, "orchestrator": False,
                "method": dict(max_rounds=10, orchestrator=False, **SMALL)},
    # Spent from the start; P=1 asks for the orchestrator after almost every round.
    "orchestrator": {"caps": {"orchestrator": {"tokens": 0}}, "orchestrator": True,
                     "method": dict(max_rounds=3, patience=1, **SMALL)},
}


def run_scenario(name: str) -> dict[str, Any]:
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.execution.budget import BudgetLedger
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.milo.config import MiloConfig
    from milo_ray.milo.loop import MiloRun
    from milo_ray.search.agent_calls import AgentCallLog, role_caps
    from milo_ray.store.memory import MemoryRunStore

    sc = SCENARIOS[name]
    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=0)
    store = MemoryRunStore(run_id=f"caps-{name}")
    tasks = {t.task_id: t for s in bench.splits().values() for t in s}
    sched = RolloutScheduler(executor_config=bench.executor_config(), tasks=tasks, store=store,
                             model_id="offline-surrogate", run_id=store.run_id, budget=BudgetLedger())
    mutators = [{"_target_": "milo_fakes.TokenMutator", "personality": "counted", "tokens": TOKENS}]
    orch = {"_target_": "milo_ray.agents.orchestrators.offline.OfflineOrchestrator"} if sc["orchestrator"] else None
    ctx = RunContext(run_id=store.run_id, run_dir=Path(tempfile.mkdtemp()), seed=0, store=store, benchmark=bench,
                     scheduler=sched, model_id="offline-surrogate", agents={"mutators": mutators, "orchestrator": orch},
                     agent_calls=AgentCallLog(store, budget=sched.budget, caps=role_caps(sc["caps"])))
    summary = asyncio.run(MiloRun(MiloConfig(**sc["method"]), ctx).main())
    rows = sorted(store.read("events").to_pylist(), key=lambda r: r["seq"])
    events = [{"seq": r["seq"], "kind": r["kind"],
               "payload": json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"]}
              for r in rows if str(r["kind"]).startswith("milo.")]
    calls = [{k: r[k] for k in ("call_id", "role", "agent", "output_tokens", "error")}
             for r in store.read("agent_calls").to_pylist()]
    finals = sum(1 for r in store.read("rollouts").to_pylist() if r["stage"] == "final")
    sched.close()
    return {"summary": summary, "events": events, "agent_calls": calls, "final_rollouts": finals}


def main() -> None:
    import ray

    from milo_ray.execution.cluster import quiet_token_auth_notice

    quiet_token_auth_notice()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, resources={"sandbox_slot": 8})
    out = {name: run_scenario(name) for name in SCENARIOS}
    ray.shutdown()
    Path(sys.argv[1]).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
