"""A real rollout's trajectory as the JSON the store, the evidence directory and the
search agents read (the same ``trace["trajectory"]`` shape the surrogate writes).

:class:`TrajectoryRecorder` watches an agent run message by message (it is fed the
agent's streamed state) so that a run stopped at its time cap still leaves every message
seen so far, each stamped with the time it first appeared. :func:`steps` turns LangChain
messages into plain dicts: role, content, tool calls with their arguments, the model's
tool calls whose arguments did not parse (``invalid_tool_calls``: the tool, the raw
argument text, the parse error; the agent never ran them, and an answer holding only
such calls ends the agent's loop), tool results (with the tool-call id they answer),
and, on the model's messages, the tokens of the call that produced them.

A harness process streams its steps out as JSON lines (:mod:`milo_ray.boundary.inside.harness_process`);
:func:`parse_message` checks each line against the message schema (kinds, types, sizes)
before anything of it is kept, and :class:`StepLog` assembles the steps.
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
    invalid = getattr(message, "invalid_tool_calls", None) or []
    if invalid:
        out["invalid_tool_calls"] = [invalid_call(c) for c in invalid if isinstance(c, dict)]
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


def invalid_call(call: dict[str, Any]) -> dict[str, Any]:
    """One of a message's ``invalid_tool_calls`` as a step keeps it: ``args`` the raw
    argument text as the model sent it (cut like any step text), ``error`` why it did not
    parse (the model client's reason, or the JSON parser's when the client gave none)."""
    raw = call.get("args")
    text = raw if isinstance(raw, str) else json.dumps(raw, default=str)
    return {"id": call.get("id"), "name": call.get("name"), "args": clip(text),
            "error": _short(call.get("error") or argument_error(text), MAX_ERROR_CHARS)}


def argument_error(text: str) -> str:
    """Why ``text`` is not a tool call's arguments (a JSON object)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the arguments are not valid JSON: {exc}"
    except RecursionError:  # untrusted text: nesting deeper than the parser goes
        return "the arguments are not valid JSON: nested too deeply to parse"
    if not isinstance(value, dict):
        return f"the arguments are JSON {type(value).__name__}, not an object"
    return "the model client refused the arguments"


def invalid_call_count(steps: Iterable[dict[str, Any]]) -> int:
    """The model's tool calls among ``steps`` whose arguments did not parse."""
    return sum(len(s.get("invalid_tool_calls") or ()) for s in steps)


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


class ProtocolError(ValueError):
    """A line from a harness process that is not a valid message."""


# Messages a harness process may send (see milo_ray.boundary.inside.harness_process).
MESSAGE_KINDS = ("ready", "started", "steps", "final")
FINAL_STATUSES = ("completed", "step_cap", "harness_error")
# Steps one trajectory keeps; a harness that produces more is cut (the rest is not graded
# anyway: the workspace is).
MAX_STEPS = 5_000
# Tool calls (valid or not) one step keeps; and the characters of an invalid call's error.
MAX_CALLS = 256
MAX_ERROR_CHARS = 500
_STEP_KEYS = {"role", "content", "name", "tool_calls", "invalid_tool_calls", "tool_call_id", "status", "usage",
              "step", "timestamp"}
_STEP_ROLES = set(_ROLES.values()) | {"message"}


def _short(value: Any, limit: int = 500) -> str:
    return clip(str(value), limit)


def check_step(obj: Any) -> dict[str, Any]:
    """One step from an untrusted process, as the JSON this module writes, or
    :class:`ProtocolError`. Strings are clipped, unknown keys dropped, types enforced."""
    if not isinstance(obj, dict):
        raise ProtocolError("a step is not an object")
    role = obj.get("role")
    if role not in _STEP_ROLES:
        raise ProtocolError(f"a step has role {_short(role, 40)!r}")
    content = obj.get("content", "")
    if not isinstance(content, str):
        raise ProtocolError("a step's content is not a string")
    out: dict[str, Any] = {"role": role, "content": clip(content)}
    if obj.get("name") is not None:
        out["name"] = _short(obj["name"], 200)
    calls = obj.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or len(calls) > MAX_CALLS:
            raise ProtocolError(f"a step's tool_calls is not a list of at most {MAX_CALLS} calls")
        checked = []
        for c in calls:
            if not isinstance(c, dict):
                raise ProtocolError("a tool call is not an object")
            args = c.get("args")
            text = json.dumps(args, default=str)
            if len(text) > MAX_CONTENT_CHARS:
                args = clip(text)
            checked.append({"id": None if c.get("id") is None else _short(c["id"], 200),
                            "name": None if c.get("name") is None else _short(c["name"], 200), "args": args})
        out["tool_calls"] = checked
    invalid = obj.get("invalid_tool_calls")
    if invalid is not None:
        if not isinstance(invalid, list) or len(invalid) > MAX_CALLS:
            raise ProtocolError(f"a step's invalid_tool_calls is not a list of at most {MAX_CALLS} calls")
        if not all(isinstance(c, dict) for c in invalid):
            raise ProtocolError("an invalid tool call is not an object")
        # Rebuilt by the same rule the process used: the raw text cut, the strings bounded,
        # whatever else the process put there dropped.
        out["invalid_tool_calls"] = [{**invalid_call(c),
                                      "id": None if c.get("id") is None else _short(c["id"], 200),
                                      "name": None if c.get("name") is None else _short(c["name"], 200)}
                                     for c in invalid]
    if role == "tool":
        tcid = obj.get("tool_call_id")
        out["tool_call_id"] = None if tcid is None else _short(tcid, 200)
        if obj.get("status") is not None:
            out["status"] = _short(obj["status"], 40)
    usage = obj.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            raise ProtocolError("a step's usage is not an object")
        try:
            out["usage"] = {"input_tokens": max(0, int(usage.get("input_tokens") or 0)),
                            "output_tokens": max(0, int(usage.get("output_tokens") or 0))}
        except (TypeError, ValueError):
            raise ProtocolError("a step's usage holds a non-integer") from None
    ts = obj.get("timestamp", 0.0)
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise ProtocolError("a step's timestamp is not a number")
    out["timestamp"] = float(ts)
    return out


def parse_message(line: bytes | str) -> dict[str, Any]:
    """One line from a harness process (``{"t": kind, ...}``), checked; see
    :data:`MESSAGE_KINDS`. Raises :class:`ProtocolError`."""
    try:
        msg = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("a line is not JSON") from None
    if not isinstance(msg, dict) or msg.get("t") not in MESSAGE_KINDS:
        raise ProtocolError("a line is not a message of a known kind")
    kind = msg["t"]
    if kind == "steps":
        start, steps = msg.get("start"), msg.get("steps")
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= MAX_STEPS \
                or not isinstance(steps, list):
            raise ProtocolError("a steps message needs an integer start and a list of steps")
        return {"t": kind, "start": start, "steps": [check_step(s) for s in steps[: MAX_STEPS - start]]}
    if kind == "final":
        status = msg.get("status")
        if status not in FINAL_STATUSES:
            raise ProtocolError(f"a final message has status {_short(status, 40)!r}")
        error = msg.get("error")
        return {"t": kind, "status": status, "error": None if error is None else clip(str(error), 4000),
                "endpoint_error": bool(msg.get("endpoint_error"))}
    return {"t": kind}


class StepLog:
    """The steps of a streamed trajectory: each update replaces the steps from its
    ``start`` on (the agent's message list can be rewritten, e.g. summarized)."""

    def __init__(self) -> None:
        self._steps: list[dict[str, Any]] = []

    def apply(self, start: int, steps: list[dict[str, Any]]) -> None:
        if start > len(self._steps):
            raise ProtocolError(f"a steps message starts at {start}, past the {len(self._steps)} steps so far")
        self._steps = (self._steps[:start] + list(steps))[:MAX_STEPS]

    def steps(self) -> list[dict[str, Any]]:
        return [{**s, "step": i} for i, s in enumerate(self._steps)]


def trajectory(recorder: TrajectoryRecorder | list[dict[str, Any]], *, task_id: str, harness_id: str,
               rollout_idx: int, model_id: str, status: str, agent_seconds: float,
               calls: Iterable[dict[str, Any]], error: str | None = None) -> dict[str, Any]:
    """The ``trace["trajectory"]`` of a real rollout: its steps, every model call
    (tokens, USD, start/end time) and how the run ended (``status``: completed, timeout,
    step_cap, token_cap, call_cap, harness_error, oracle), with ``invalid_tool_calls``: the
    model's tool calls among the steps whose arguments did not parse. ``recorder``: a
    recorder of an in-process run, or the checked steps a harness process streamed."""
    calls = list(calls)
    steps = recorder if isinstance(recorder, list) else recorder.steps()
    final: dict[str, Any] = {"status": status, "agent_seconds": round(agent_seconds, 3),
                             "input_tokens": sum(c["input_tokens"] for c in calls),
                             "output_tokens": sum(c["output_tokens"] for c in calls), "model_calls": len(calls),
                             "invalid_tool_calls": invalid_call_count(steps)}
    if error:
        final["error"] = error
    return {"schema": SCHEMA, "simulated": False, "task_id": task_id, "harness_id": harness_id,
            "rollout_idx": rollout_idx, "model_id": model_id, "steps": steps, "calls": calls, "final": final}
