"""The harness's side of a task's tool channel: a task whose world lives on the host (an
ARE scenario, served by :mod:`milo_ray.benchmarks.are.channel` in the rollout's episode)
gives the harness its own tools as langchain ``StructuredTool`` objects -- the ones the
channel lists, plus ``wait_for_notification`` for multi-turn and time-based tasks (the
next user message or environment event). The harness process hands them to the harness
as ``backend.task_tools``.

Runs inside the harness's sandbox: imports the standard library and ``langchain_core``
only. Every tool is a request on the channel's socket (one JSON line each way, the
protocol in the channel's module); nothing of the task's world is in this process.
"""

from __future__ import annotations

import json
import socket
from typing import Any

WAIT_TOOL = "wait_for_notification"
# The longest answer line read: the channel caps its lines at 1 MiB, with room for escaping.
REPLY_CAP = 2 << 20


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
                line = self._file.readline(REPLY_CAP)
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


def channel_tools(path: str) -> list[Any]:
    """The tools served at ``path`` and the wait tool, as langchain tools."""
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
