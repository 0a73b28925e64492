"""A driver whose one mutation's agent (a Ray task) calls the model through its gateway
until the driver is killed, for the search agents' journal kill test:
``python role_journal_driver.py RUN_DIR URL``.

The scripted server answers a few calls and then never answers again, so when the test
kills this process a known number of the mutator's calls were paid for and one is in
flight, and no outcome ever came back."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import ray

from milo_ray.agents.protocols import MutationRequest
from milo_ray.execution.budget import BudgetLedger
from milo_ray.boundary.gateway.role_journal import RoleJournal
from milo_ray.harness.model import Harness
from milo_ray.search.agent_calls import AgentCallLog
from milo_ray.search.mutation import ValidationOptions, run_mutations
from milo_ray.store.parquet import ParquetRunStore
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV

CALL_ID = "mutate:i0:r1"

if __name__ == "__main__":
    run_dir, url = Path(sys.argv[1]), sys.argv[2]
    store = ParquetRunStore(run_dir, run_id="role-journal")
    calls = AgentCallLog(store, budget=BudgetLedger(tokens=10**9), journal=RoleJournal(run_dir / "journal"))
    ray.init(num_cpus=2, include_dashboard=False)
    llm = {"model": "openai/scripted", "api_base": url, "api_key_env": SCRIPTED_KEY_ENV, "max_retries": 0,
           "request_timeout_s": 3600}
    spec = {"_target_": "milo_ray.testing.fake_agents.GatewayLoopMutator", "llm": llm, "calls": 10}
    parent = Harness.from_source("def build_agent(model, backend):\n    return None\n")
    request = MutationRequest(parent=parent, parent_dir=parent.write_to(run_dir / "parent"), evidence_dir=run_dir,
                              memory_markdown="", workdir=run_dir / "work", seed=1)
    ticket = calls.ticket(CALL_ID, "mutator", llm["model"])
    run_mutations(spec, [request], time_cap_s=3600, validation=ValidationOptions(enabled=False), use_ray=True,
                  env={SCRIPTED_KEY_ENV: os.environ[SCRIPTED_KEY_ENV]}, tickets=[ticket])
