"""Forwarding one Anthropic Messages request (``POST /v1/messages``, what Claude Code
sends) to the configured model through litellm's Anthropic-messages interface
(``litellm.anthropic.messages.acreate``), which speaks the Messages API to Anthropic and
translates it to chat completions for every other provider.

As for chat completions (:mod:`.upstream`), the caller chooses the conversation and the
sampling, never the model, the key, the endpoint or the retry policy: the request is
rebuilt from an allowlist of fields on top of the model config, ``max_tokens`` clamped
to its ``max_output_tokens``; retries, the shared rate limit and the token report are
:mod:`.upstream`'s.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Mapping

from milo_ray.agents.llm import _field
from milo_ray.execution.gateway.upstream import Answer, BadRequest, _report, _retrying

# Messages-API fields a client may set; everything else comes from the model config.
ALLOWED_FIELDS = ("messages", "system", "tools", "tool_choice", "temperature", "top_p", "top_k",
                  "stop_sequences", "thinking")
# When neither the request nor the config bounds the answer (the Messages API requires it).
DEFAULT_MAX_TOKENS = 4096


def request_kwargs(cfg: Any, key: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
    """``litellm.anthropic.messages.acreate`` arguments for ``body`` under ``cfg``."""
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("messages: a non-empty list is required")
    kwargs: dict[str, Any] = {k: body[k] for k in ALLOWED_FIELDS if k in body and body[k] is not None}
    kwargs.update(model=str(_field(cfg, "solver")), max_retries=0, num_retries=0)
    if key:
        kwargs["api_key"] = key
    if _field(cfg, "api_base"):
        kwargs["api_base"] = _field(cfg, "api_base")
    if _field(cfg, "temperature") is not None and "temperature" not in kwargs and "thinking" not in kwargs:
        kwargs["temperature"] = _field(cfg, "temperature")
    asked, cap = body.get("max_tokens"), _field(cfg, "max_output_tokens")
    if asked is not None and (not isinstance(asked, int) or asked < 1):
        raise BadRequest(f"max_tokens={asked!r}: a positive integer is required")
    bound = [int(v) for v in (asked, cap) if v is not None]
    kwargs["max_tokens"] = min(bound) if bound else DEFAULT_MAX_TOKENS
    if _field(cfg, "request_timeout_s") is not None:
        kwargs["timeout"] = float(_field(cfg, "request_timeout_s"))
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


async def _open(cfg: Any, kwargs: dict[str, Any], limiter: Any, retries: list[int]) -> Any:
    import litellm

    try:
        async for attempt in _retrying(cfg, retries):
            with attempt:
                if limiter is not None:
                    await limiter.aacquire()
                return await litellm.anthropic.messages.acreate(**kwargs)
    except BaseException as exc:
        exc._gateway_retries = retries[0]  # type: ignore[attr-defined]
        raise


async def complete(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any) -> Answer:
    """One non-streamed Messages call, retried per the config."""
    retries = [0]
    response = await _open(cfg, request_kwargs(cfg, key, body), limiter, retries)
    answer = response if isinstance(response, dict) else json.loads(json.dumps(
        response.model_dump() if hasattr(response, "model_dump") else dict(response), default=str))
    tin, tout = _usage(answer)
    _report(limiter, tin + tout)
    return Answer(answer, tin, tout, retries[0])


async def stream(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any,
                 usage_out: dict[str, int]) -> AsyncIterator[bytes]:
    """A streamed Messages call: yields the server-sent-event bytes as they come (retried
    only until the stream opens). Usage is read from the ``message_start`` and
    ``message_delta`` events into ``usage_out`` (``input_tokens``, ``output_tokens``,
    ``retries``): the largest figure each reports, as Anthropic's are running totals."""
    retries = [0]
    kwargs = request_kwargs(cfg, key, body)
    kwargs["stream"] = True
    response = await _open(cfg, kwargs, limiter, retries)
    usage_out["retries"] = retries[0]
    tin = tout = 0
    pending = b""
    async for chunk in response:
        data = chunk if isinstance(chunk, bytes) else str(chunk).encode()
        pending += data
        *events, pending = pending.split(b"\n\n")
        for event in events:
            for line in event.splitlines():
                if line.startswith(b"data:"):
                    try:
                        cin, cout = _usage(json.loads(line[5:]))
                    except ValueError:
                        continue
                    tin, tout = max(tin, cin), max(tout, cout)
        yield data
    usage_out["input_tokens"], usage_out["output_tokens"] = tin, tout
    _report(limiter, tin + tout)
