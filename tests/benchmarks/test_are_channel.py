"""The per-rollout tool channel of benchmark=are (milo_ray/benchmarks/are/channel.py and
tools.py), with a provider of our own standing in for ARE's environment: the harness's
langchain tools reach the provider's tools and nothing else of it."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from milo_ray.benchmarks.are.channel import LINE_CAP, ToolChannel, answer
from milo_ray.benchmarks.are.tool_schema import parameters_schema, type_to_schema
from milo_ray.boundary.inside.task_tools import WAIT_TOOL, channel_tools


class Mailbox:
    """A stand-in environment: a private state, one tool that changes it, one that reads it."""

    def __init__(self) -> None:
        self.secret_oracle = "send to bob@x.org"  # never to be served
        self.sent: list[dict] = []
        self.pending = ["User: now also ask Carol"]

    def tools(self):
        return [{"name": "Email__send_email", "description": "Send an email",
                 "parameters": parameters_schema([{"name": "to", "type": "list[str]", "description": "recipients"},
                                                  {"name": "body", "type": "str"},
                                                  {"name": "cc", "type": "str | None", "has_default": True}])},
                {"name": "Email__count", "description": "How many sent", "parameters": parameters_schema([])}]

    def call(self, name, args):
        if name == "Email__send_email":
            if not args["to"]:
                raise ValueError("no recipient")
            self.sent.append(args)
            return "sent"
        return str(len(self.sent))

    def wait(self, timeout_s):
        out, self.pending = self.pending, []
        return out


@pytest.fixture
def served(tmp_path: Path):
    box = Mailbox()
    channel = ToolChannel(box, str(tmp_path / "tools.sock"))
    yield box, channel
    channel.close()


def test_argument_type_strings_map_to_json_schema():
    assert type_to_schema("list[str]") == {"type": "array", "items": {"type": "string"}}
    assert type_to_schema("str | None") == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert type_to_schema("Optional[int]") == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert type_to_schema("dict[str, Any]") == {"type": "object", "additionalProperties": {}}
    assert type_to_schema("float") == {"type": "number"}
    assert type_to_schema("SomeAppClass") == {}
    schema = parameters_schema([{"name": "a", "type": "int"}, {"name": "b", "type": "bool", "has_default": True}])
    assert schema["required"] == ["a"] and schema["properties"]["b"] == {"type": "boolean"}


def test_harness_tools_reach_the_scenario_tools_and_the_wait_tool(served):
    box, channel = served
    tools = {t.name: t for t in channel_tools(channel.path)}
    assert set(tools) == {"Email__send_email", "Email__count", WAIT_TOOL}
    assert tools["Email__send_email"].invoke({"to": ["bob@x.org"], "body": "hi"}) == "sent"
    assert box.sent == [{"to": ["bob@x.org"], "body": "hi"}]
    assert tools["Email__count"].invoke({}) == "1"
    assert "now also ask Carol" in tools[WAIT_TOOL].invoke({"timeout_s": 5})
    # A tool's own failure is an answer the agent reads, and the channel keeps serving.
    assert "raised ValueError: no recipient" in tools["Email__send_email"].invoke({"to": [], "body": "x"})
    assert tools["Email__count"].invoke({}) == "1"


def test_the_harness_cannot_reach_environment_state_except_through_its_tools(served):
    box, channel = served
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(channel.path)
        f = s.makefile("rb")

        def ask(obj) -> dict:
            s.sendall((obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n")
            return json.loads(f.readline())

        for name in ("secret_oracle", "call", "__class__", "tools", "Email__send_email.__globals__"):
            reply = ask({"op": "call", "name": name, "args": {}})
            assert not reply["ok"] and "no tool named" in reply["error"]
        reply = ask({"op": "call", "name": "Email__send_email", "args": {"to": ["a"], "body": "b", "__dict__": 1}})
        assert not reply["ok"] and "no parameter" in reply["error"]
        assert not ask({"op": "call", "name": "Email__send_email", "args": ["a"]})["ok"]
        assert not ask({"op": "call", "name": "Email__send_email", "args": {"to": ["a"]}})["ok"]
        assert not ask({"op": "getattr", "name": "secret_oracle"})["ok"]
        assert not ask({"op": "wait", "timeout_s": -1})["ok"]
        assert not ask(b"not json")["ok"]
        listed = ask({"op": "tools"})
        assert "send to bob" not in json.dumps(listed)
    assert box.sent == []
    assert not answer(box, b"x" * (LINE_CAP + 1))["ok"]


def test_channel_socket_is_private_to_its_owner(served):
    _, channel = served
    assert Path(channel.path).stat().st_mode & 0o777 == 0o600
