"""The offline mutators' reading of trajectory endings (agents/mutators/diagnosis.py)."""

from __future__ import annotations

from milo_ray.agents.mutators.diagnosis import classify_ending


def _ending(**last) -> dict:
    return {"steps": [{"role": "user", "content": "write 42 into /app/answer.txt"},
                      {"role": "assistant", "content": "", **last}], "final": {"status": "completed"}}


def test_an_ending_on_an_unparseable_tool_call_is_tool_misuse():
    # The agent's loop ends on such an answer with no text at all: only the step's
    # structure says what went wrong.
    cut = {"id": "c1", "name": "write_file", "args": '{"content": "4', "error": "the arguments are not valid JSON"}
    assert classify_ending(_ending(invalid_tool_calls=[cut])) == "tool_misuse"


def test_an_empty_ending_without_invalid_calls_names_no_mode():
    assert classify_ending(_ending()) is None
    assert classify_ending(_ending(invalid_tool_calls=[])) is None
