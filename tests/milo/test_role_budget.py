"""Per-role agent caps in a MILO run: a spent mutator cap stops new mutations (one
``milo.role_budget`` event, no mutation after it) and the run still ends normally with
its final evaluation; a spent orchestrator cap skips interventions while the islands
keep evolving. Every mutator call's spend reaches the ledger and the summary.

The runs happen in ``milo_role_budget_runner.py`` (its own process: see its docstring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from milo_role_budget_runner import TOKENS

# A cluster, containers or whole command-line runs: the slow suite (pytest -m slow; .ci/run runs it).
pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("milo_role_budget_runner.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("caps") / "runs.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(RUNNER.parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(RUNNER), str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_spent_mutator_cap_stops_new_mutations_and_the_run_still_finishes(runs):
    run = runs["mutator"]
    evs, summary = run["events"], run["summary"]
    caps = [e for e in evs if e["kind"] == "milo.role_budget"]
    assert [c["payload"]["role"] for c in caps] == ["mutator"]
    assert "run.budget.roles.mutator" in caps[0]["payload"]["reason"]
    children = [e for e in evs if e["kind"] == "milo.node" and e["payload"]["node"]["origin"] == "mutation"]
    assert len(children) == 4 and all(e["seq"] < caps[0]["seq"] for e in children)
    assert not [e for e in evs if e["kind"] == "milo.step" and e["seq"] > caps[0]["seq"]]
    assert all(isl["rounds"] == 2 for isl in summary["islands"].values())
    # The run ended normally: the stop reason names the role, the incumbents got their final test.
    assert summary["stop_reason"].startswith("mutator budget")
    assert [e["payload"]["reason"] for e in evs if e["kind"] == "milo.stop"] == [summary["stop_reason"]]
    assert summary["final_test"] and run["final_rollouts"] > 0
    spend = summary["spend_by_role"]["mutator"]
    assert (spend["calls"], spend["output_tokens"], spend["errors"]) == (4, 4 * TOKENS, 0)
    calls = run["agent_calls"]
    assert sorted(c["call_id"] for c in calls) == ["mutate:i0:r1", "mutate:i0:r2", "mutate:i1:r1", "mutate:i1:r2"]
    assert {(c["role"], c["agent"], c["output_tokens"]) for c in calls} == {("mutator", "counted", TOKENS)}


def test_a_spent_orchestrator_cap_skips_interventions_but_not_rounds(runs):
    run = runs["orchestrator"]
    evs, summary = run["events"], run["summary"]
    caps = [e["payload"]["role"] for e in evs if e["kind"] == "milo.role_budget"]
    assert caps == ["orchestrator"], "recorded once, however many stalls asked for the orchestrator"
    assert any(e["kind"] == "milo.progress" and e["payload"]["stall"] >= 1 for e in evs), "P=1 must stall"
    assert not [e for e in evs if e["kind"] in ("milo.decision", "milo.decision_invalid")]
    assert summary["stop_reason"] == "finished" and summary["interventions"] == 0
    assert all(isl["rounds"] == 3 for isl in summary["islands"].values())
    assert "orchestrator" not in summary["spend_by_role"]
    assert summary["spend_by_role"]["mutator"]["calls"] == 6
