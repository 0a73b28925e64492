"""The judge's condensation rule: deterministic, within budget, the opening and the
ending kept whole, a tool call never separated from its result, short input untouched."""

from __future__ import annotations

import copy
import json

import pytest

from milo_ray.agents.judges.condense import (FIRST_UNITS, LAST_UNITS, condense, estimate_tokens, render)


def long_trajectory(n_units: int = 60, body: int = 3000) -> dict:
    """An instruction, then ``n_units`` assistant steps each calling a tool whose result is long."""
    steps = [{"role": "user", "content": "Fix the parser so that the tests pass. " * 5, "step": 0}]
    for k in range(n_units):
        call = f"call_{k}"
        steps.append({"role": "assistant", "content": f"step {k}: running a command",
                      "tool_calls": [{"id": call, "name": "execute", "args": {"command": f"pytest -k case{k}"}}]})
        steps.append({"role": "tool", "tool_call_id": call, "content": f"output {k} " + "x" * body + f" END{k}"})
    for i, s in enumerate(steps):
        s["step"] = i
    calls = [{"input_tokens": 100, "output_tokens": 10, "start": i} for i in range(n_units)]
    return {"task_id": "t", "steps": steps, "calls": calls, "final": {"status": "completed", "model_calls": n_units}}


def test_a_short_trajectory_is_returned_untouched():
    t = long_trajectory(3, 50)
    out, info = condense(t, 100_000)
    assert out is t and not info.condensed and info.tokens == estimate_tokens(render(t))
    assert info.describe() == "The trajectory is shown whole."


@pytest.mark.parametrize("budget", [3000, 8000, 20_000])
def test_result_is_within_budget_deterministic_and_input_unchanged(budget):
    t = long_trajectory()
    before = copy.deepcopy(t)
    a, info = condense(t, budget)
    b, _ = condense(copy.deepcopy(t), budget)
    assert t == before  # never mutated
    assert json.dumps(a) == json.dumps(b)
    assert info.condensed and info.fits and info.tokens <= budget
    assert estimate_tokens(render(a)) == info.tokens <= budget
    assert info.tokens_before > budget


def test_first_and_last_units_are_kept_whole():
    t = long_trajectory()
    out, info = condense(t, 8000)
    assert info.steps_omitted > 0
    whole = {json.dumps(s) for s in t["steps"]}
    kept_head = t["steps"][: 1 + 2 * (FIRST_UNITS - 1)]
    kept_tail = t["steps"][-2 * LAST_UNITS:]
    assert out["steps"][: len(kept_head)] == kept_head
    assert out["steps"][-len(kept_tail):] == kept_tail
    assert all(json.dumps(s) in whole for s in kept_head + kept_tail)
    marker = [s for s in out["steps"] if "omitted" in s]
    assert len(marker) == 1 and f"[... {info.steps_omitted} steps omitted ...]" == marker[0]["omitted"]
    assert (marker[0]["from_step"], marker[0]["to_step"]) == info.omitted_range
    # the oldest middle steps go first: the omitted run starts right after the opening
    assert info.omitted_range[0] == len(kept_head)
    assert out["steps"][out["steps"].index(marker[0]) + 1]["step"] == info.omitted_range[1] + 1
    assert "calls" not in out and out["calls_omitted"] == 60


def test_middle_fields_are_cut_to_head_and_tail_before_steps_are_dropped():
    t = long_trajectory(20, 3000)
    out, info = condense(t, 12_000)
    assert info.fields_shortened > 0 and info.steps_omitted == 0
    middle = out["steps"][4]  # the first middle unit: step 3 calls, step 4 is its result
    assert middle["content"].startswith("output") and middle["content"].endswith("END1")
    assert "chars omitted ...]" in middle["content"]


@pytest.mark.parametrize("budget", [2500, 5000, 9000, 30_000])
def test_a_tool_call_is_never_separated_from_its_result(budget):
    out, _ = condense(long_trajectory(), budget)
    steps = out["steps"]
    for i, s in enumerate(steps):
        if s.get("role") == "tool":
            prev = steps[i - 1]
            assert prev.get("role") == "assistant" and prev["tool_calls"][0]["id"] == s["tool_call_id"]
        if s.get("tool_calls"):
            assert steps[i + 1].get("tool_call_id") == s["tool_calls"][0]["id"]


def test_a_tiny_budget_keeps_the_instruction_and_the_last_step_longest():
    t = long_trajectory(10, 20_000)
    out, info = condense(t, 900)
    assert info.fits and info.tokens <= 900
    assert out["steps"][0]["role"] == "user"
    assert out["steps"][-1]["tool_call_id"] == "call_9" and out["steps"][-1]["content"].endswith("END9")


def test_an_impossible_budget_is_reported_not_hidden():
    out, info = condense(long_trajectory(3, 50), 5)
    assert not info.fits and info.tokens > 5


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="trajectory"):
        condense([], 10)
    with pytest.raises(ValueError, match="budget_tokens"):
        condense({}, 0)
