"""`+experiment=milo_einstein_agent` from the command line, as a user runs it: MILO
evolves agents that write optimizer programs (MILO App. E, LLM variant). One local
OpenAI-compatible server plays the solver (it writes an optimizer into the task's
workspace) and the mutators; the tasks are real (bubblewrap, the graded program runs
and is scored exactly). A program the agent breaks is a 0, never a crashed run, and the
records command reads the constructions the agents' programs found."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from milo_ray.benchmarks.einstein import score
from milo_ray.benchmarks.einstein.benchmark import SEEDS_DIR
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply, tool_call
from milo_ray.testing.scripted_agents import instructions, mutator_policy, tool_results
from milo_ray.testing.scripted_roles import by_model

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # a whole command-line MILO run with real agent rollouts (~2 min)

# The scripted solver's answer: the lse_adam seed program (marked), except on tasks whose
# parent is the subgradient program, where it leaves a program that cannot import.
GOOD = (SEEDS_DIR / "lse_adam" / "harness.py").read_text() + "\n# revised by the scripted agent\n"
BROKEN = "this is not a python program\n"


def solver_policy(body):
    if not tool_results(body):
        content = BROKEN if "`subgradient` program" in instructions(body) else GOOD
        return tool_call("write_file", {"file_path": "/app/optimizer.py", "content": content},
                         prompt_tokens=300, completion_tokens=200)
    return reply("The optimizer is written.", prompt_tokens=320, completion_tokens=8)


def _rows(run_dir: Path, table: str) -> list[dict]:
    return [r for f in sorted((run_dir / table).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_milo_evolves_optimizer_writing_agents_and_the_records_come_from_their_programs(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "records"
    env = {**os.environ, "SCRIPTED_KEY": "local", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    starts = "[{base: random, n: 300, seed: 0}, {base: random, n: 300, seed: 1}, {base: random, n: 300, seed: 2}]"
    with ScriptedOpenAIServer(by_model({"solver": solver_policy, "mutator": mutator_policy})) as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "milo_ray.run", "+experiment=milo_einstein_agent",
             f"model.solver=openai/solver", f"model.api_base={srv.url}", "model.api_key_env=SCRIPTED_KEY",
             "backend.model=openai/mutator", f"backend.api_base={srv.url}", "backend.api_key_env=SCRIPTED_KEY",
             "benchmark.problem=first_autocorrelation", f"benchmark.starts={starts}",
             "benchmark.parents=[lse_adam,subgradient]", "benchmark.budget_s=3", "benchmark.grace_s=1",
             "benchmark.splits={search: 1, val: 1, test: 1}", "method.seeds=[minimal]", "method.num_islands=1",
             "method.search_size=2", "method.val_size=2", "method.max_rounds=1", f"run.dir={run_dir}",
             "run.progress=false", "run.report=false", "execution.num_cpus=2"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["summary"]["final_test"]

    rollouts = _rows(run_dir, "rollouts")
    good = [r for r in rollouts if r["task_id"].endswith("-lse_adam")]
    broken = [r for r in rollouts if r["task_id"].endswith("-subgradient")]
    assert good and broken
    assert all(r["score"] > 0 and r["error_kind"] is None for r in good), good
    # The broken program is the harness's 0, not an error of the run or the task.
    assert all(r["score"] == 0 and r["error_kind"] is None for r in broken), broken
    mutations = [n for n in _rows(run_dir, "harnesses") if n["origin"] == "mutation"]
    assert mutations, "the island never mutated its agent harness"
    roles = {c["role"] for c in _rows(run_dir, "agent_calls")}
    assert {"solver", "mutator"} <= roles

    rec = subprocess.run([sys.executable, "-m", "milo_ray.einstein", "best", str(run_dir), "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert rec.returncode == 0, rec.stderr[-3000:]
    record = json.loads((out / "first_autocorrelation.json").read_text())
    h = np.asarray(record["values"])
    assert record["score"] == pytest.approx(score("first_autocorrelation", h), rel=1e-9)
    assert record["score"] < 1.6  # far below the random starts (about 2.0)
    assert "first_autocorrelation" in rec.stdout
