"""Forwarding one Anthropic Messages request (``POST /v1/messages``, what Claude Code
sends) to the configured model through litellm's Anthropic-messages interface
(``litellm.anthropic.messages.acreate``), which speaks the Messages API to Anthropic and
translates it to chat completions for every other provider.

As for chat completions (:mod:`.upstream`), the caller chooses the conversation and the
sampling, never the model, the key, the endpoint or the retry policy: the request is
rebuilt from an allowlist of fields on top of the model config, ``max_tokens`` clamped
to its ``max_output_tokens``; retries, the shared rate limit and the token report are
:mod:`.upstream`'s. Tools are the client's own (no ``type``, or ``custom``): Anthropic's
server tools (``web_search_*``, ``web_fetch_*``, ``code_execution_*``...) and its
Anthropic-defined ones are refused, as is the MCP connector (``mcp_servers``).
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Mapping

from milo_ray.llm.client import _field
from milo_ray.boundary.gateway.upstream import (Answer, BadRequest, _report, call_retried, check_provider_actions,
                                                 check_tool_choice, check_tools, with_endpoint)

# Messages-API fields a client may set; everything else comes from the model config.
ALLOWED_FIELDS = ("messages", "system", "tools", "tool_choice", "temperature", "top_p", "top_k",
                  "stop_sequences", "thinking")
# When neither the request nor the config bounds the answer (the Messages API requires it).
DEFAULT_MAX_TOKENS = 4096

# The request field that bounds a call's output (where admission's bound goes).
OUTPUT_FIELD = "max_tokens"


def request_kwargs(cfg: Any, key: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
    """``litellm.anthropic.messages.acreate`` arguments for ``body`` under ``cfg``."""
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("messages: a non-empty list is required")
    check_provider_actions(body)
    check_tools(body.get("tools"), untyped=True)
    check_tool_choice(body.get("tool_choice"), words=(), types=("auto", "any", "tool", "none"))
    kwargs: dict[str, Any] = {k: body[k] for k in ALLOWED_FIELDS if k in body and body[k] is not None}
    with_endpoint(kwargs, cfg, key, temperature_unless=("thinking",))
    asked, cap = body.get("max_tokens"), _field(cfg, "max_output_tokens")
    if asked is not None and (not isinstance(asked, int) or asked < 1):
        raise BadRequest(f"max_tokens={asked!r}: a positive integer is required")
    bound = [int(v) for v in (asked, cap) if v is not None]
    kwargs["max_tokens"] = min(bound) if bound else DEFAULT_MAX_TOKENS
    return kwargs


def _usage(obj: Any) -> tuple[int, int]:
    """(input, output) tokens of a Messages response or stream event. Input counts cache
    reads and writes too: tokens the model processed (Anthropic's ``input_tokens``
    excludes them)."""
    usage = obj.get("usage") if isinstance(obj, Mapping) else None
    if usage is None and isinstance(obj, Mapping) and isinstance(obj.get("message"), Mapping):
        usage = obj["message"].get("usage")
    if not isinstance(usage, Mapping):
        return 0, 0
    tin = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                              "cache_read_input_tokens"))
    return tin, int(usage.get("output_tokens") or 0)


async def complete(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any) -> Answer:
    """One non-streamed Messages call, retried per the config."""
    import litellm

    response, retries = await call_retried(cfg, request_kwargs(cfg, key, body), limiter,
                                           litellm.anthropic.messages.acreate)
    answer = response if isinstance(response, dict) else json.loads(json.dumps(
        response.model_dump() if hasattr(response, "model_dump") else dict(response), default=str))
    tin, tout = _usage(answer)
    _report(limiter, tin + tout)
    return Answer(answer, tin, tout, retries)


async def stream(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any,
                 usage_out: dict[str, int]) -> AsyncIterator[bytes]:
    """A streamed Messages call, served from one non-streamed upstream call replayed as
    the Messages API's server-sent events. Why not stream upstream: a stream's usage is
    only as good as the provider's and litellm's translation of its last events (an
    OpenAI-style stream carries none unless asked), and the gateway's figures are the
    mutation's spend; a CLI mutator loses only the time to its first token.
    ``usage_out`` receives ``input_tokens``, ``output_tokens`` and ``retries``."""
    answer = await complete(cfg, key, body, limiter)
    usage_out.update(input_tokens=answer.input_tokens, output_tokens=answer.output_tokens, retries=answer.retries,
                     reported=1)
    for event in replay(answer.body):
        yield event


def _event(kind: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, default=str)}\n\n".encode()


def replay(message: Mapping[str, Any]) -> list[bytes]:
    """The server-sent events of a stream that delivers ``message`` (a Messages response)."""
    usage = dict(message.get("usage") or {})
    start = {k: v for k, v in message.items() if k not in ("content", "stop_reason", "stop_sequence")}
    start.update(content=[], stop_reason=None, stop_sequence=None, usage={**usage, "output_tokens": 0})
    events = [_event("message_start", {"message": start})]
    for index, block in enumerate(message.get("content") or []):
        block = dict(block)
        kind = block.get("type")
        if kind == "text":
            events.append(_event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}))
            events.append(_event("content_block_delta", {"index": index, "delta": {"type": "text_delta",
                                                                                    "text": block.get("text", "")}}))
        elif kind == "tool_use":
            events.append(_event("content_block_start", {"index": index, "content_block": {**block, "input": {}}}))
            events.append(_event("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}}))
        elif kind == "thinking":
            events.append(_event("content_block_start", {"index": index, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}))
            events.append(_event("content_block_delta", {"index": index, "delta": {
                "type": "thinking_delta", "thinking": block.get("thinking", "")}}))
            if block.get("signature"):
                events.append(_event("content_block_delta", {"index": index, "delta": {
                    "type": "signature_delta", "signature": block["signature"]}}))
        else:  # a block without deltas (e.g. redacted thinking) starts whole
            events.append(_event("content_block_start", {"index": index, "content_block": block}))
        events.append(_event("content_block_stop", {"index": index}))
    events.append(_event("message_delta", {"delta": {"stop_reason": message.get("stop_reason"),
                                                     "stop_sequence": message.get("stop_sequence")},
                                           "usage": {"output_tokens": int(usage.get("output_tokens") or 0)}}))
    events.append(_event("message_stop", {}))
    return events
