"""MILO and SSR with every role a real LLM agent (`backend=litellm model=litellm
benchmark=harbor`), run from the command line as a user runs them, against one local
OpenAI-compatible server that answers each role by its model name: the solver, the
deepagents mutators, the orchestrator (decisions and graft), the judge and SSR's
optimizer all speak the real protocols over HTTP through litellm and langchain, on the
bundled Harbor suite in bubblewrap. The spend each role recorded in `agent_calls` must
equal what the server billed that role, and a USD cap on the mutators stops them while
the run still ends with its incumbent tested."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from milo_ray.testing.openai_server import ScriptedOpenAIServer
from milo_ray.testing.scripted_agents import mutator_policy
from milo_ray.testing.scripted_roles import by_model, judge_policy, orchestrator_policy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "execution"))
from real_tasks import solving_policy  # noqa: E402

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # cold harness processes / whole runs / a cluster: see .ci/run

# Role -> the model name it is given, and so the name the server bills it under.
MODELS = {"solver": "solver", "mutator": "mutator", "orchestrator": "orchestrator", "judge": "judge",
          "optimizer": "optimizer"}
PRICE = 1.0  # USD per million tokens, input and output, for every search role


def _orchestrator_or_graft(body):
    # The orchestrator's model also runs its graft coding agent, which calls tools.
    return mutator_policy(body) if body.get("tools") else orchestrator_policy(body)


SCRIPT = by_model({"solver": solving_policy, "mutator": mutator_policy, "orchestrator": _orchestrator_or_graft,
                   "judge": judge_policy, "optimizer": mutator_policy})


def _run(tmp_path: Path, srv: ScriptedOpenAIServer, *args: str, backend: str = "litellm",
         path_prefix: str = "") -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "run"
    env = {**os.environ, "SCRIPTED_KEY": "local", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1",
           "PATH": path_prefix + os.environ.get("PATH", "")}
    argv = [sys.executable, "-m", "milo_ray.run", *args,
            "model=litellm", f"model.solver=openai/{MODELS['solver']}", f"model.api_base={srv.url}",
            "model.api_key_env=SCRIPTED_KEY",
            f"backend={backend}", f"backend.model=openai/{MODELS['mutator']}", f"backend.api_base={srv.url}",
            "backend.api_key_env=SCRIPTED_KEY", f"backend.usd_per_mtok_input={PRICE}",
            f"backend.usd_per_mtok_output={PRICE}", "backend.retry_base_s=0.05",
            f"backend.agents.orchestrator.llm.model=openai/{MODELS['orchestrator']}",
            f"backend.agents.judge.llm.model=openai/{MODELS['judge']}",
            f"backend.agents.optimizer.llm.model=openai/{MODELS['optimizer']}",
            "benchmark=harbor", f"run.dir={run_dir}", "run.progress=false", "run.report=false", "execution.num_cpus=2"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    return proc, run_dir


def _rows(run_dir: Path, table: str) -> list[dict]:
    return [r for f in sorted((run_dir / table).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _spend_by_role(run_dir: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in _rows(run_dir, "agent_calls"):
        out[c["role"]][0] += int(c["input_tokens"] or 0)
        out[c["role"]][1] += int(c["output_tokens"] or 0)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _assert_spend_reconciles(run_dir: Path, srv: ScriptedOpenAIServer, roles: list[str]) -> None:
    billed, spent = srv.billed_by_model(), _spend_by_role(run_dir)
    for role in roles:
        assert billed.get(MODELS[role]), f"the server never answered the {role}"
        assert spent.get(role) == billed[MODELS[role]], (role, spent.get(role), billed[MODELS[role]])
    # Every search role's row names its model, and its USD is its tokens at the configured price.
    for c in _rows(run_dir, "agent_calls"):
        if c["role"] in ("mutator", "orchestrator", "judge", "optimizer"):
            assert c["model"] == f"openai/{MODELS[c['role']]}", c
            if c["error"] is None:
                assert c["cost_usd"] == pytest.approx((c["input_tokens"] + c["output_tokens"]) * PRICE / 1e6)


def test_milo_runs_with_every_role_real_and_a_usd_cap_stops_the_mutators(tmp_path):
    # One mutation costs 2,780 tokens = $0.00278 at $1/Mtok: the two islands' first
    # mutations (started together) pass the $0.004 cap, so no island mutates again.
    with ScriptedOpenAIServer(SCRIPT) as srv:
        proc, run_dir = _run(
            tmp_path, srv, "method=milo_quick", "method.seeds=[minimal,stock]", "method.num_islands=2",
            "method.search_size=2", "method.val_size=1", "method.k_search=1", "method.k_val=1", "method.k_test=1",
            "method.max_rounds=3", "method.patience=1", "method.round_sync=true",
            "benchmark.splits={search: 2, val: 1, test: 1}", "run.budget.roles.mutator.cost_usd=0.004")
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    calls = _rows(run_dir, "agent_calls")
    mutations = [c for c in calls if c["role"] == "mutator"]
    assert len(mutations) == 2 and all(c["error"] is None for c in mutations)
    events = _rows(run_dir, "events")
    kinds = [e["kind"] for e in events]
    # The orchestrator decided (a reassignment and a graft), and its graft child was judged.
    assert any("decision" in k and "invalid" not in k for k in kinds), sorted(set(kinds))
    harnesses = _rows(run_dir, "harnesses")
    origins = {h["origin"] for h in harnesses}
    assert {"seed", "mutation", "graft"} <= origins, origins
    # The mutators' cap stopped them (one event), and the incumbent was still tested.
    assert any("budget" in k for k in kinds), sorted(set(kinds))
    rollouts = _rows(run_dir, "rollouts")
    assert any(r["split"] == "test" for r in rollouts)
    assert all(r["error_kind"] is None for r in rollouts)
    _assert_spend_reconciles(run_dir, srv, ["solver", "mutator", "orchestrator"])


def test_ssr_runs_with_every_role_real(tmp_path):
    with ScriptedOpenAIServer(SCRIPT) as srv:
        proc, run_dir = _run(
            tmp_path, srv, "+experiment=ssr_swepro", "method.scales=[0.5,1.0]", "method.b_v=[1,1]", "method.b_s=1",
            "method.b_f=1", "method.rollouts=1", "method.test_rollouts=1", "run.budget.executions=24",
            "benchmark.splits={train: 3, val: 2, test: 1}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
    experience = _rows(run_dir, "experience")
    assert experience and all(r["judge_error"] is None and r["embedding"] for r in experience)
    harnesses = _rows(run_dir, "harnesses")
    assert any(h["origin"] == "ssr_candidate" and h["validation_error"] is None for h in harnesses), \
        [(h["origin"], h["validation_error"]) for h in harnesses]
    assert all(r["error_kind"] is None for r in _rows(run_dir, "rollouts"))
    _assert_spend_reconciles(run_dir, srv, ["solver", "judge", "optimizer"])


# A stand-in for Claude Code: like the real CLI it gets only the prompt, asks its model
# through ANTHROPIC_BASE_URL (the mutation's gateway, from inside its sandbox), finds the
# paths in the prompt, writes the child and prints its JSON result with usage and cost --
# figures of its own, which the gateway's metering replaces.
FAKE_CLAUDE = f"""#!{sys.executable}
import hashlib, json, os, re, sys, urllib.request
prompt = sys.argv[sys.argv.index("-p") + 1]
req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", method="POST",
                             data=json.dumps({{"model": "claude", "max_tokens": 1000,
                                              "messages": [{{"role": "user", "content": prompt}}]}}).encode(),
                             headers={{"Authorization": "Bearer " + os.environ["ANTHROPIC_AUTH_TOKEN"],
                                       "Content-Type": "application/json"}})
urllib.request.urlopen(req, timeout=60).read()
out = re.search(r"Write the complete child harness to `([^`]+)`", prompt).group(1)
parent = re.search(r"The parent harness: `([^`]+)`", prompt).group(1)
tag = hashlib.sha256(prompt.encode()).hexdigest()[:12]
open(out, "w").write(open(parent).read() + f"\\n# claude's edit {{tag}}\\n")
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False, "num_turns": 3,
                  "result": "Added a check before finishing", "total_cost_usd": 0.0421,
                  "usage": {{"input_tokens": 1200, "cache_creation_input_tokens": 300,
                            "cache_read_input_tokens": 500, "output_tokens": 250}}}}))
"""


def test_milo_with_a_sandboxed_cli_mutator_records_the_usage_its_gateway_metered(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text(FAKE_CLAUDE)
    (bin_dir / "claude").chmod(0o755)
    with ScriptedOpenAIServer(SCRIPT) as srv:
        proc, run_dir = _run(
            tmp_path, srv, "method=milo_quick", "method.seeds=[minimal]", "method.num_islands=1", "method.pool_size=1",
            "method.orchestrator=false", "method.search_size=2", "method.val_size=1", "method.k_search=1",
            "method.k_val=1", "method.k_test=1", "method.max_rounds=2", "method.round_sync=true",
            "benchmark.splits={search: 2, val: 1, test: 1}", backend="litellm_mixed", path_prefix=f"{bin_dir}:")
    assert proc.returncode == 0, proc.stderr[-4000:]
    mutations = [c for c in _rows(run_dir, "agent_calls") if c["role"] == "mutator"]
    assert len(mutations) == 2
    # Claude Code ran sandboxed against its mutation's gateway: its spend is what the
    # server billed, at the backend's price, not the figures it printed.
    for c in mutations:
        assert (c["agent"], c["error"]) == ("claude-code", None) and c["input_tokens"] != 2000
        assert c["cost_usd"] == pytest.approx((c["input_tokens"] + c["output_tokens"]) * PRICE / 1e6)
    assert _spend_by_role(run_dir)["mutator"] == srv.billed_by_model()[MODELS["mutator"]]
    children = [h for h in _rows(run_dir, "harnesses") if h["origin"] == "mutation"]
    assert len(children) == 2 and all(h["mutator"] == "claude-code" and h["validation_error"] is None
                                      for h in children)
