"""The offline judge fills the verdict schema; the schema rejects bad answers."""

from __future__ import annotations

import json

import pytest

from milo_ray.agents.judges.offline import OfflineJudge
from milo_ray.agents.judges.schema import JudgeOutputError, parse_verdict
from milo_ray.harness.mechanisms import MECHANISMS

POOL = {"tasks": 10, "resolved_rate": 0.4, "timeout_rate": 0.3, "mean_score": 0.5}


def _fb(score=0.0, timed_out=False, error_kind=None, ctrf=None):
    return {"score": score, "resolved": score >= 1.0, "timed_out": timed_out, "error_kind": error_kind,
            "ctrf": ctrf or {}, "pool": POOL}


def test_timed_out_failure_is_a_deadline_overrun_with_an_addressing_mechanism():
    raw = OfflineJudge().judge({"steps": [{"text": "working"}]}, _fb(timed_out=True), "t1").output
    v = parse_verdict(raw)
    assert "deadline_overrun" in raw["failure_modes"]
    assert raw["mechanisms"] and all("deadline_overrun" in MECHANISMS[m].addresses for m in raw["mechanisms"])
    assert any(raw["mechanisms"][0] in s for s in v.suggestions)
    assert 0 <= v.w <= 1 and 0 <= v.a <= 1 and 0 <= v.u <= 1


def test_explicit_tag_and_test_messages_are_read():
    ctrf = {"results": {"tests": [{"name": "test_x", "status": "failed", "message": "edge case returns wrong value"}]}}
    raw = OfflineJudge().judge({"events": [{"kind": "lax_verification"}]}, _fb(ctrf=ctrf), "t2").output
    assert raw["failure_modes"][0] == "lax_verification"


def test_an_ending_on_an_unparseable_tool_call_is_tool_misuse():
    cut = {"id": "c1", "name": "write_file", "args": '{"content": "4', "error": "Unterminated string"}
    steps = [{"role": "user", "content": "write 42"}, {"role": "assistant", "content": "", "invalid_tool_calls": [cut]}]
    raw = OfflineJudge().judge({"steps": steps, "final": {"status": "completed"}}, _fb(), "t3").output
    assert raw["failure_modes"][0] == "tool_misuse"


def test_confidence_drops_when_the_ending_is_ambiguous():
    j = OfflineJudge()
    clear = j.verdict({"events": [{"kind": "premature_completion"}]}, _fb(score=0.0), "a")
    noisy = j.verdict({"events": [{"kind": "premature_completion"}], "note": "invalid arguments; context length exceeded"},
                      _fb(score=0.5, error_kind="harness"), "b")
    unknown = j.verdict({"steps": ["did some work"]}, _fb(score=0.0), "c")
    assert noisy["u"] < clear["u"]
    assert unknown["u"] < clear["u"] and unknown["a"] < clear["a"]


def test_success_is_less_important_than_a_general_failure():
    j = OfflineJudge()
    ok = j.verdict({"steps": []}, _fb(score=1.0), "s")
    bad = j.verdict({"events": [{"kind": "premature_completion"}]}, _fb(score=0.0), "f")
    assert ok["w"] < bad["w"]


def test_malformed_rate_produces_rejectable_answers_deterministically():
    j1, j2 = OfflineJudge(malformed_rate=1.0, seed=3), OfflineJudge(malformed_rate=1.0, seed=3)
    a = [j1.judge({}, _fb(), f"t{i}").output for i in range(12)]
    b = [j2.judge({}, _fb(), f"t{i}").output for i in range(12)]
    assert [json.dumps(x, sort_keys=True, default=str) for x in a] == [json.dumps(x, sort_keys=True, default=str) for x in b]
    for raw in a:
        with pytest.raises(JudgeOutputError):
            parse_verdict(raw)
    assert all(parse_verdict(OfflineJudge(malformed_rate=0.0).judge({}, _fb(), f"t{i}").output) for i in range(5))


@pytest.mark.parametrize("raw,needle", [
    ({"w": 1.2, "a": 0.5, "u": 0.5, "summary": "s", "suggestions": []}, "'w'"),
    ({"w": 0.2, "a": -0.1, "u": 0.5, "summary": "s", "suggestions": []}, "'a'"),
    ({"w": 0.2, "a": 0.1, "u": float("nan"), "summary": "s", "suggestions": []}, "'u'"),
    ({"w": 0.2, "a": 0.1, "u": 0.5, "suggestions": []}, "summary"),
    ({"w": 0.2, "a": 0.1, "u": 0.5, "summary": "", "suggestions": []}, "summary"),
    ({"w": "high", "a": 0.1, "u": 0.5, "summary": "s", "suggestions": []}, "'w'"),
    ("not json at all", "not JSON"),
    ("[1, 2]", "JSON object"),
])
def test_parse_verdict_rejects_bad_answers_naming_the_field(raw, needle):
    with pytest.raises(JudgeOutputError, match=needle):
        parse_verdict(raw)


def test_parse_verdict_accepts_fenced_json_and_keeps_values_unclipped():
    text = 'Here you go:\n```json\n{"w": 1.0, "a": 0.0, "u": 0.37, "summary": "x", "suggestions": ["y"]}\n```'
    v = parse_verdict(text)
    assert (v.w, v.a, v.u, v.suggestions) == (1.0, 0.0, 0.37, ["y"])
