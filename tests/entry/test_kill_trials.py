"""Random-kill resume trials (scripts/kill_trials.py): each check of the trials catches
the damage it names, and a short CI run of the trials passes."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kill_trials.py"
_spec = importlib.util.spec_from_file_location("kill_trials", SCRIPT)
kt = importlib.util.module_from_spec(_spec)
sys.modules["kill_trials"] = kt  # dataclasses look their module up while the class is built
_spec.loader.exec_module(kt)


def _rollout(key: str, score: float, budgeted: bool = True) -> dict:
    return {"cache_key": key, "score": score, "budgeted": budgeted, "harness_id": "h", "task_id": key,
            "started_at": 1.0, "node": "n1"}


def _run() -> dict:
    return {
        "manifest": {"status": "finished", "config": {"run": {"budget": {"executions": 2}}}},
        "rollouts": [_rollout("a", 1.0), _rollout("b", 0.0), _rollout("c", 0.5, budgeted=False)],
        "harnesses": [{"harness_id": "p", "parent_id": None, "co_parent_id": None, "island": 0},
                      {"harness_id": "c", "parent_id": "p", "co_parent_id": None, "island": 0}],
        "agent_calls": [{"call_id": "mutate:i0:r1", "input_tokens": 5, "output_tokens": 7, "time": 10.0}],
        "events": [{"seq": 0, "time": 3.0, "kind": "milo.init", "payload": "{}"}],
    }


def _before() -> dict:
    run = _run()
    return {**run, "rollouts": run["rollouts"][:2], "harnesses": run["harnesses"][:1]}


def test_an_intact_resumed_run_passes_every_check():
    final = _run()
    moved = copy.deepcopy(final)
    for r in moved["rollouts"]:
        r["started_at"], r["node"] = 99.0, "n2"  # times and nodes are ignored
    assert kt.check(final, [_before()], moved) == []


@pytest.mark.parametrize("damage, reason", [
    (lambda f: f["rollouts"].pop(0), "lost_rollout"),
    (lambda f: f["rollouts"][0].update(score=0.0), "lost_rollout"),
    (lambda f: f["rollouts"].append(_rollout("c", 0.5, budgeted=False)), "duplicate_key"),
    (lambda f: f["agent_calls"][0].update(time=11.0, output_tokens=9), "repeated_call"),
    (lambda f: f["agent_calls"].append(dict(f["agent_calls"][0])), "repeated_call"),
    (lambda f: f["rollouts"].append(_rollout("d", 1.0)), "budget"),
    (lambda f: f["harnesses"][1].update(parent_id="ghost"), "lineage"),
    (lambda f: f["harnesses"].pop(0), "lineage"),
    (lambda f: f["manifest"].update(status="running"), "finished"),
])
def test_each_check_catches_its_damage(damage, reason):
    final = _run()
    damage(final)
    reasons = [r.split(":")[0] for r in kt.check(final, [_before()], None)]
    assert reason in reasons, reasons


def test_a_deterministic_run_must_equal_the_uninterrupted_one():
    final, reference = _run(), _run()
    reference["events"].append({"seq": 1, "time": 4.0, "kind": "milo.stop", "payload": "{}"})
    assert [r.split(":")[0] for r in kt.check(final, [], reference)] == ["equal_tables"]
    assert kt.check(final, [], None) == []  # not compared for a method that is not deterministic


@pytest.mark.parametrize("brk", kt.BREAKS)
def test_each_break_switch_silences_its_check(brk):
    # --break exists to show the trials fail when a check is disabled; each must disable one.
    final = _run()
    final["rollouts"].append(_rollout("c", 0.5, budgeted=False))  # duplicate
    final["rollouts"][0]["score"] = 0.3  # changed
    final["rollouts"].append(_rollout("e", 1.0))
    final["rollouts"].append(_rollout("f", 1.0))  # over budget
    final["agent_calls"][0]["time"] = 12.0  # made again
    final["harnesses"][1]["parent_id"] = "ghost"
    reference = _run()
    names = {"ignore-duplicates": "duplicate_key", "ignore-lost": "lost_rollout", "ignore-calls": "repeated_call",
             "ignore-budget": "budget", "ignore-lineage": "lineage", "ignore-tables": "equal_tables"}
    on = {r.split(":")[0] for r in kt.check(final, [_before()], reference)}
    off = {r.split(":")[0] for r in kt.check(final, [_before()], reference, frozenset([brk]))}
    assert names[brk] in on and on - off == {names[brk]}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_killed_and_resumed_runs_match_their_uninterrupted_runs(tmp_path):
    # One trial each of a deterministic method per family (eval, lock-step MILO, SSR), up
    # to two kills each, the three at once (each driver has its own Ray): the CI-sized
    # version of the >= 20-trial runs in the README.
    code = kt.main(["--trials", "1", "--max-kills", "2", "--methods", "eval,milo_lockstep,ssr", "--jobs", "3",
                    "--out", str(tmp_path), "--seed", "1"])
    results = (tmp_path / "results.json").read_text()
    assert code == 0, results
