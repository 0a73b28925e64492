"""The harness's side of a rollout's tool channel (:mod:`.channel`): the scenario's app
tools as langchain ``StructuredTool`` objects, plus ``wait_for_notification`` for
multi-turn and time-based scenarios (the next user message or environment event).

Runs inside the harness's sandbox: imports the standard library and ``langchain_core``
only. Every tool is a request on the channel's socket; nothing of the environment is in
this process.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from milo_ray.benchmarks.are.channel import LINE_CAP

WAIT_TOOL = "wait_for_notification"


class ChannelClient:
    """One connection to the channel socket at ``path`` (reconnected if the host closed it)."""

    def __init__(self, path: str, timeout_s: float = 3700.0) -> None:
        self.path, self.timeout_s = path, timeout_s
        self._sock: socket.socket | None = None
        self._file: Any = None

    def request(self, **req: Any) -> dict[str, Any]:
        for attempt in (0, 1):
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.settimeout(self.timeout_s)
                self._sock.connect(self.path)
                self._file = self._sock.makefile("rb")
            try:
                self._sock.sendall(json.dumps(req).encode() + b"\n")
                line = self._file.readline(LINE_CAP * 2)
                if line:
                    return json.loads(line)
            except (BrokenPipeError, ConnectionResetError):
                if attempt:
                    raise
            self.close()
        raise ConnectionError(f"tool channel {self.path}: closed by the host")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None


def _text(reply: dict[str, Any], key: str) -> str:
    if not reply.get("ok"):
        return f"Error: {reply.get('error', 'refused')}"
    value = reply.get(key)
    return value if isinstance(value, str) else json.dumps(value)


def scenario_tools(path: str) -> list[Any]:
    """The scenario's tools served at ``path`` and the wait tool, as langchain tools."""
    from langchain_core.tools import StructuredTool

    client = ChannelClient(path)
    listed = client.request(op="tools")
    if not listed.get("ok"):
        raise RuntimeError(f"tool channel {path}: {listed.get('error')}")
    tools = []
    for spec in listed["tools"]:
        name = spec["name"]

        def call(_name: str = name, **kwargs: Any) -> str:
            return _text(client.request(op="call", name=_name, args=kwargs), "result")

        tools.append(StructuredTool.from_function(func=call, name=name, description=spec.get("description") or name,
                                                  args_schema=spec["parameters"]))

    def wait_for_notification(timeout_s: float = 60.0) -> str:
        reply = client.request(op="wait", timeout_s=timeout_s)
        if not reply.get("ok"):
            return f"Error: {reply.get('error')}"
        notes = reply.get("notifications") or []
        return "\n".join(notes) if notes else f"No notification within {timeout_s:g} seconds."

    tools.append(StructuredTool.from_function(
        func=wait_for_notification, name=WAIT_TOOL,
        description="Wait up to timeout_s seconds (simulated time) for the next user message or environment "
                    "notification and return it. Use it when the task says to wait for a reply or an event."))
    return tools
