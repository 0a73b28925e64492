"""Forwarding one OpenAI Responses-API request (``POST /v1/responses``, what the Codex CLI
sends) to the configured model through litellm's Responses interface
(``litellm.aresponses``), bridged to a chat completion for every provider.

Why always the chat-completions bridge (``use_chat_completions_api``), even for OpenAI,
which serves the Responses API itself: it is the API every other route of the gateway
sends upstream and the one every OpenAI-compatible server serves, and it is stateless --
the provider stores nothing a later call could name (``store`` is always false and
``previous_response_id`` is refused: a Responses client keeps its conversation and sends
it whole, as Codex does). The cost: a model served only by the Responses API cannot be
reached through the gateway, and reasoning items are not carried from one call to the
next.

As for chat completions (:mod:`.upstream`) and Messages (:mod:`.messages`), the caller
chooses the conversation and the sampling, never the model, the key, the endpoint or the
retry policy: the request is rebuilt from an allowlist of fields on top of the model
config, ``max_output_tokens`` clamped to its ``max_output_tokens``; retries, the shared
rate limit and the token report are :mod:`.upstream`'s, and the tokens metered are the
upstream's usage as litellm reports it, never a figure from the client.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Mapping

from milo_ray.llm.client import _field
from milo_ray.boundary.gateway.upstream import (CLIENT_TOOL_TYPES, Answer, BadRequest, _report, call_retried,
                                                 check_provider_actions, check_tool_choice, check_tools, with_endpoint)

# Responses-API fields a client may set; everything else comes from the model config or is
# dropped (``include``, ``prompt_cache_key``, ``metadata``... ask for nothing the bridge
# can give). ``reasoning`` and ``text`` are translated by litellm where the provider takes
# them and dropped where it does not (``drop_params``).
ALLOWED_FIELDS = ("input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p",
                  "reasoning", "text", "user")
# Tool types that only group other tools (each grouped tool is checked like a top-level one).
TOOL_GROUP_TYPES = ("namespace",)
# Fields whose meaning the gateway cannot honour: refused rather than silently ignored.
REFUSED_FIELDS = {
    "previous_response_id": "the gateway keeps no conversations: send the whole conversation as `input` "
                            "(with store: false)",
    "background": "background responses are not served; send the request and wait for it",
    "conversation": "the gateway keeps no conversations: send the whole conversation as `input`",
}

# The request field that bounds a call's output (where admission's bound goes).
OUTPUT_FIELD = "max_output_tokens"


def request_kwargs(cfg: Any, key: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
    """``litellm.aresponses`` arguments for ``body`` under ``cfg`` (see the module docstring)."""
    given = body.get("input")
    if not (isinstance(given, str) and given) and not (isinstance(given, list) and given):
        raise BadRequest("input: a non-empty string or list of input items is required")
    for name, why in REFUSED_FIELDS.items():
        if body.get(name) not in (None, False):
            raise BadRequest(f"{name}: {why}")
    # A provider-run tool (web search, file search, code interpreter, MCP...) is refused,
    # not dropped: the caller learns at once that it is not served.
    check_provider_actions(body)
    check_tools(body.get("tools"), groups=TOOL_GROUP_TYPES)
    check_tool_choice(body.get("tool_choice"), words=("none", "auto", "required"), types=CLIENT_TOOL_TYPES)
    kwargs: dict[str, Any] = {k: body[k] for k in ALLOWED_FIELDS if k in body and body[k] is not None}
    with_endpoint(kwargs, cfg, key, temperature_unless=("reasoning",))
    kwargs.update(store=False, use_chat_completions_api=True, drop_params=True)
    asked, cap = body.get("max_output_tokens"), _field(cfg, "max_output_tokens")
    if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
        raise BadRequest(f"max_output_tokens={asked!r}: a positive integer is required")
    bound = [int(v) for v in (asked, cap) if v is not None]
    if bound:
        kwargs["max_output_tokens"] = min(bound)
    extra = dict(_field(cfg, "extra_body") or {})
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def _usage(obj: Mapping[str, Any]) -> tuple[int, int]:
    """(input, output) tokens of a Responses object. The Responses API's ``input_tokens``
    already counts cached tokens and ``output_tokens`` reasoning tokens: nothing is added."""
    usage = obj.get("usage")
    if not isinstance(usage, Mapping):
        return 0, 0
    return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)


def _as_dict(response: Any) -> dict[str, Any]:
    if isinstance(response, dict):
        return response
    if hasattr(response, "model_dump"):
        # None fields are left out: litellm's model carries many a client never reads.
        return json.loads(json.dumps(response.model_dump(exclude_none=True), default=str))
    return dict(response)


async def complete(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any) -> Answer:
    """One non-streamed Responses call, retried per the config."""
    import litellm

    response, retries = await call_retried(cfg, request_kwargs(cfg, key, body), limiter, litellm.aresponses)
    answer = _as_dict(response)
    tin, tout = _usage(answer)
    _report(limiter, tin + tout)
    return Answer(answer, tin, tout, retries)


async def stream(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any,
                 usage_out: dict[str, int]) -> AsyncIterator[bytes]:
    """A streamed Responses call, served from one non-streamed upstream call replayed as
    the Responses API's server-sent events -- for the reason :func:`.messages.stream`
    gives: the gateway's figures are the mutation's spend, and a replayed answer's usage
    is the provider's whole usage, where a translated stream's last event may carry none.
    ``usage_out`` receives ``input_tokens``, ``output_tokens`` and ``retries``."""
    answer = await complete(cfg, key, body, limiter)
    usage_out.update(input_tokens=answer.input_tokens, output_tokens=answer.output_tokens, retries=answer.retries,
                     reported=1)
    for event in replay(answer.body):
        yield event


class _Events:
    """Server-sent events numbered in order (``sequence_number``, as the API numbers them)."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def add(self, kind: str, **data: Any) -> None:
        payload = {"type": kind, "sequence_number": len(self.out), **data}
        self.out.append(f"event: {kind}\ndata: {json.dumps(payload, default=str)}\n\n".encode())


def replay(response: Mapping[str, Any]) -> list[bytes]:
    """The server-sent events of a stream that delivers ``response`` (a Responses object):
    ``response.created``, each output item added, its content as one delta, done, and
    the terminal event (``response.completed``, or ``.incomplete`` / ``.failed`` as the
    response's status says) carrying the whole response and its usage."""
    events = _Events()
    start = {k: v for k, v in response.items() if k not in ("output", "usage")}
    start.update(status="in_progress", output=[])
    events.add("response.created", response=start)
    events.add("response.in_progress", response=start)
    for index, raw in enumerate(response.get("output") or []):
        item = dict(raw)
        kind, item_id = item.get("type"), item.get("id")
        if kind == "message":
            events.add("response.output_item.added", output_index=index,
                       item={**item, "status": "in_progress", "content": []})
            for part_index, part in enumerate(item.get("content") or []):
                part = dict(part)
                where = {"item_id": item_id, "output_index": index, "content_index": part_index}
                if part.get("type") == "output_text":
                    events.add("response.content_part.added", **where, part={**part, "text": ""})
                    events.add("response.output_text.delta", **where, delta=part.get("text", ""))
                    events.add("response.output_text.done", **where, text=part.get("text", ""))
                else:  # a refusal or another part without text deltas comes whole
                    events.add("response.content_part.added", **where, part=part)
                events.add("response.content_part.done", **where, part=part)
        elif kind == "function_call":
            events.add("response.output_item.added", output_index=index,
                       item={**item, "status": "in_progress", "arguments": ""})
            where = {"item_id": item_id, "output_index": index}
            events.add("response.function_call_arguments.delta", **where, delta=item.get("arguments", ""))
            events.add("response.function_call_arguments.done", **where, arguments=item.get("arguments", ""))
        else:  # reasoning and other items start and end whole
            events.add("response.output_item.added", output_index=index, item=item)
        events.add("response.output_item.done", output_index=index, item=item)
    status = response.get("status") or "completed"
    terminal = status if status in ("completed", "incomplete", "failed") else "completed"
    events.add(f"response.{terminal}", response=dict(response))
    return events.out
