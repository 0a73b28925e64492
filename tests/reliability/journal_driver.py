"""A driver whose one rollout calls the model through the gateway until it is killed, for
the call journal's kill test: ``python journal_driver.py RUN_DIR URL``.

The rollout's harness loop (``GatewayLoopExecutor``) calls the scripted server, which
answers a few calls and then never answers again, so when the test kills this process a
known number of calls were paid for and one is in flight."""

from __future__ import annotations

import sys

from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.tasks import Task
from milo_ray.execution.budget import BudgetLedger
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.harness.model import Harness
from milo_ray.search.agent_calls import AgentCallLog
from milo_ray.store.parquet import ParquetRunStore

KEY_ENV = "MILO_JOURNAL_TEST_KEY"
HARNESS = Harness.from_source("def build_agent(model, backend):\n    return None\n")
TASKS = {"t": Task("t", "search", "loop", 3600.0, 10**9, {})}
MODEL_ID = "openai/scripted"


def executor_config(url: str) -> dict:
    model = {"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 3600,
             "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, "max_retries": 0}
    return {"_target_": "milo_ray.testing.gateway_loop.GatewayLoopExecutor", "model": model, "most_calls": 1000}


def scheduler(run_dir: str, url: str, *, resumed: bool) -> RolloutScheduler:
    store = ParquetRunStore(run_dir, run_id="journal")
    sched = RolloutScheduler(executor_config(url), TASKS, store, MODEL_ID, "journal", budget=BudgetLedger(tokens=10**9),
                             progress=False, max_retries=0, worker_env={KEY_ENV: "sk-journal-test"})
    sched.agent_calls = AgentCallLog(store, budget=sched.budget, resumed=resumed)
    sched.add_harness(HARNESS)
    return sched


if __name__ == "__main__":
    run_dir, url = sys.argv[1], sys.argv[2]
    sched = scheduler(run_dir, url, resumed=False)
    sched.run([RolloutRequest(HARNESS.harness_id, "t", 0, seed=1)])
