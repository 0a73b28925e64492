"""A real rollout's trajectory as the JSON the store, the evidence directory and the
search agents read (the same ``trace["trajectory"]`` shape the surrogate writes).

:class:`TrajectoryRecorder` watches an agent run message by message (it is fed the
agent's streamed state) so that a run stopped at its time cap still leaves every message
seen so far, each stamped with the time it first appeared. :func:`steps` turns LangChain
messages into plain dicts: role, content, tool calls with their arguments, tool results
(with the tool-call id they answer), and, on the model's messages, the tokens of the
call that produced them.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

SCHEMA = "milo_ray.trajectory/1"
# One tool result or message body kept in a trace; longer ones are cut in the middle so
# the start (the command's header) and the end (its error) both survive.
MAX_CONTENT_CHARS = 20_000

_ROLES = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        parts = []
        for block in content:
            if isinstance(block, dict):
                parts.append(str(block.get("text") or block.get("content") or json.dumps(block, default=str)))
            else:
                parts.append(str(block))
        return "\n".join(parts)
    return "" if content is None else str(content)


def clip(text: str, limit: int = MAX_CONTENT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


def step(message: Any) -> dict[str, Any]:
    """One message as a JSON-ready dict."""
    role = _ROLES.get(getattr(message, "type", ""), getattr(message, "type", "message"))
    out: dict[str, Any] = {"role": role, "content": clip(_text(getattr(message, "content", "")))}
    name = getattr(message, "name", None)
    if name:
        out["name"] = name
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        out["tool_calls"] = [{"id": c.get("id"), "name": c.get("name"), "args": c.get("args")} for c in calls]
    if role == "tool":
        out["tool_call_id"] = getattr(message, "tool_call_id", None)
        status = getattr(message, "status", None)
        if status and status != "success":
            out["status"] = status
    usage = getattr(message, "usage_metadata", None)
    if usage:
        out["usage"] = {"input_tokens": int(usage.get("input_tokens") or 0),
                        "output_tokens": int(usage.get("output_tokens") or 0)}
    return out


class TrajectoryRecorder:
    """Keeps the latest message list of a running agent and when each message first
    appeared (seconds since the recorder started)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.messages: list[Any] = []
        self._seen: dict[str, float] = {}

    def observe(self, state: Any) -> None:
        """Take one streamed state (``stream_mode="values"``: a dict with ``messages``)."""
        messages = state.get("messages") if isinstance(state, dict) else None
        if not isinstance(messages, list):
            return
        now = round(time.time() - self.started, 3)
        for i, m in enumerate(messages):
            self._seen.setdefault(self._key(i, m), now)
        self.messages = list(messages)

    @staticmethod
    def _key(index: int, message: Any) -> str:
        return getattr(message, "id", None) or f"#{index}"

    def steps(self) -> list[dict[str, Any]]:
        out = []
        for i, m in enumerate(self.messages):
            s = step(m)
            s["step"] = i
            s["timestamp"] = self._seen.get(self._key(i, m), 0.0)
            out.append(s)
        return out


def trajectory(recorder: TrajectoryRecorder, *, task_id: str, harness_id: str, rollout_idx: int, model_id: str,
               status: str, agent_seconds: float, calls: Iterable[dict[str, Any]], error: str | None = None
               ) -> dict[str, Any]:
    """The ``trace["trajectory"]`` of a real rollout: its steps, every model call
    (tokens, USD, start/end time) and how the run ended (``status``: completed, timeout,
    step_cap, token_cap, harness_error, oracle)."""
    calls = list(calls)
    final: dict[str, Any] = {"status": status, "agent_seconds": round(agent_seconds, 3),
                             "input_tokens": sum(c["input_tokens"] for c in calls),
                             "output_tokens": sum(c["output_tokens"] for c in calls), "model_calls": len(calls)}
    if error:
        final["error"] = error
    return {"schema": SCHEMA, "simulated": False, "task_id": task_id, "harness_id": harness_id,
            "rollout_idx": rollout_idx, "model_id": model_id, "steps": recorder.steps(), "calls": calls,
            "final": final}
