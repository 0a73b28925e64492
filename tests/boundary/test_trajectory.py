"""The trajectory's steps keep what went wrong: a model's tool call whose arguments do
not parse is a step field (the tool, the raw text, the parse error), crosses the harness
process's protocol bounded like any step text, and is counted in the trajectory's
summary."""

from __future__ import annotations

import io
import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from milo_ray.boundary.inside.harness_process import StepStreamer, _Out
from milo_ray.boundary.trajectory import (MAX_CALLS, MAX_CONTENT_CHARS, MAX_ERROR_CHARS, ProtocolError, StepLog,
                                           check_step, parse_message, step, trajectory)

RAW = '{"file_path": "/app/answer.txt", "content": "4'


def _cut_call(call_id: str = "c1", error: str | None = None) -> dict:
    return {"type": "invalid_tool_call", "name": "write_file", "args": RAW, "id": call_id, "error": error}


def test_an_unparseable_tool_call_keeps_its_tool_raw_text_and_parse_error():
    s = step(AIMessage(content="", invalid_tool_calls=[_cut_call()]))
    assert "tool_calls" not in s
    (call,) = s["invalid_tool_calls"]
    assert (call["id"], call["name"], call["args"]) == ("c1", "write_file", RAW)
    # langchain leaves ``error`` None on calls it could not parse: the parser's reason stands in.
    assert call["error"].startswith("the arguments are not valid JSON: Unterminated string")


def test_the_model_clients_own_reason_is_kept():
    (call,) = step(AIMessage(content="", invalid_tool_calls=[_cut_call(error="cut at max_tokens")]))[
        "invalid_tool_calls"]
    assert call["error"] == "cut at max_tokens"


def test_invalid_tool_calls_cross_the_process_protocol_into_the_step_log():
    sink = io.StringIO()
    streamer = StepStreamer(_Out(sink))
    streamer.observe({"messages": [HumanMessage("write 42", id="m0"),
                                   AIMessage(content="", id="m1", invalid_tool_calls=[_cut_call()])]})
    log = StepLog()
    for line in sink.getvalue().splitlines():
        msg = parse_message(line)
        log.apply(msg["start"], msg["steps"])
    last = log.steps()[-1]
    assert last["invalid_tool_calls"][0]["args"] == RAW and last["invalid_tool_calls"][0]["name"] == "write_file"


def test_invalid_tool_calls_from_a_process_are_bounded_and_rebuilt():
    hostile = {"id": "i" * 10_000, "name": "n" * 10_000, "args": "{" * (3 * MAX_CONTENT_CHARS),
               "error": "e" * 10_000, "smuggled": "x" * 10_000}
    (call,) = check_step({"role": "assistant", "content": "", "invalid_tool_calls": [hostile]})["invalid_tool_calls"]
    assert set(call) == {"id", "name", "args", "error"}
    assert len(call["args"]) < MAX_CONTENT_CHARS + 100 and "characters cut" in call["args"]
    assert len(call["id"]) < 300 and len(call["name"]) < 300 and len(call["error"]) < MAX_ERROR_CHARS + 100
    # Arguments that are not text (a process may send anything) are kept as their JSON text.
    (call,) = check_step({"role": "assistant", "content": "",
                          "invalid_tool_calls": [{"name": "bash", "args": ["ls"]}]})["invalid_tool_calls"]
    assert call["args"] == '["ls"]' and call["error"] == "the arguments are JSON list, not an object"
    # Text nested past the parser's depth is a reason like any other, not a failure of the reader.
    (call,) = check_step({"role": "assistant", "content": "",
                          "invalid_tool_calls": [{"name": "bash", "args": "[" * 100_000}]})["invalid_tool_calls"]
    assert call["error"] == "the arguments are not valid JSON: nested too deeply to parse"


@pytest.mark.parametrize("bad", ["not a list", [1], [{}] * (MAX_CALLS + 1)])
def test_a_malformed_invalid_tool_calls_field_is_a_protocol_error(bad):
    with pytest.raises(ProtocolError, match="invalid.tool.call"):
        check_step({"role": "assistant", "content": "", "invalid_tool_calls": bad})


def test_the_trajectory_summary_counts_every_invalid_tool_call():
    steps = [check_step(step(AIMessage(content="", invalid_tool_calls=[_cut_call("a")]))),
             check_step(step(AIMessage(content="", invalid_tool_calls=[_cut_call("b"), _cut_call("c")]))),
             check_step(step(AIMessage(content="done")))]
    traj = trajectory(steps, task_id="t", harness_id="h", rollout_idx=0, model_id="m", status="completed",
                      agent_seconds=1.0, calls=[])
    assert traj["final"]["invalid_tool_calls"] == 3
    assert json.loads(json.dumps(traj)) == traj  # the trace stays plain JSON
