"""Local ARE scenario suites (a folder of *.json or one .jsonl) read into facts without
ARE installed (milo_ray/benchmarks/are/scenarios.py), on this project's fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from milo_ray.benchmarks.are.scenarios import looks_like_suite, parse_scenario, read_suite

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "are"


def test_folder_and_jsonl_suites_read_the_same_scenarios(tmp_path):
    found, bad = read_suite(FIXTURES)
    assert bad == {} and set(found) == {"forward_greg_email", "ask_ana_then_forward"}
    single, multi = found["forward_greg_email"], found["ask_ana_then_forward"]
    assert single.user_turns == 1 and single.oracle_actions == 2
    assert multi.user_turns == 2 and multi.oracle_actions == 4
    assert single.first_message.startswith("Forward Greg's email") and "EmailClientV2" in single.apps
    jsonl = tmp_path / "suite.jsonl"
    jsonl.write_text("".join(json.dumps(json.loads(p.read_text())) + "\n" for p in sorted(FIXTURES.glob("*.json"))))
    again, _ = read_suite(jsonl)
    assert {k: (v.first_message, v.user_turns) for k, v in again.items()} == \
        {k: (v.first_message, v.user_turns) for k, v in found.items()}
    assert looks_like_suite(FIXTURES) and looks_like_suite(jsonl) and not looks_like_suite(tmp_path)


def test_a_bad_scenario_is_named_with_its_field_and_the_rest_still_read(tmp_path):
    good = json.loads((FIXTURES / "single_turn.json").read_text())
    (tmp_path / "a.json").write_text(json.dumps(good))
    no_id = dict(good, metadata={"definition": {}})
    (tmp_path / "b.json").write_text(json.dumps(no_id))
    no_user = dict(good, events=[e for e in good["events"] if e["class_name"] == "OracleEvent"])
    no_user["metadata"] = {"definition": {"scenario_id": "x"}}
    (tmp_path / "c.json").write_text(json.dumps(no_user))
    (tmp_path / "d.json").write_text("{not json")
    found, bad = read_suite(tmp_path)
    assert list(found) == ["forward_greg_email"]
    assert "metadata.definition.scenario_id" in bad["b.json"]
    assert "no user message" in bad["c.json"]
    assert "not valid JSON" in bad["d.json"]
    with pytest.raises(ValueError, match="apps"):
        parse_scenario(json.dumps(dict(good, apps="EmailClientV2")), "e.json")
    (tmp_path / "f.json").write_text(json.dumps(good))
    with pytest.raises(ValueError, match="appears twice"):
        read_suite(tmp_path)
    with pytest.raises(ValueError, match="directory of ARE scenario"):
        read_suite(tmp_path / "a.json")
