"""Forwarding one OpenAI-format chat-completions request to the real provider through
litellm, with the model config's retries, shared rate limit and prices -- the same
policy :class:`~milo_ray.agents.llm.SolverChatLiteLLM` applies in-process.

The caller chooses the messages and sampling parameters, never the model, the key, the
endpoint or the retry policy: the request is rebuilt from an allowlist of fields on top
of the config (:func:`request_kwargs`). Each attempt is one HTTP request to the provider
(litellm's own retries off), retried when :func:`~milo_ray.agents.llm.retryable`, with
full-jitter backoff or the wait a 429's ``Retry-After`` names
(:class:`~milo_ray.agents.llm.RetryWait`); each attempt takes a slot of the model's
shared rate limiter, and the answer's tokens are reported to it (a stream's when it
ends, however it ends).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from milo_ray.agents.llm import RetryWait, _field, price, retryable

# Request fields a harness may set; everything else comes from the model config.
ALLOWED_FIELDS = ("messages", "tools", "tool_choice", "temperature", "top_p", "stop", "response_format",
                  "parallel_tool_calls", "seed", "max_tokens", "max_completion_tokens", "presence_penalty",
                  "frequency_penalty", "logit_bias", "user")


class BadRequest(ValueError):
    """The request cannot be forwarded as sent (HTTP 400 to the caller)."""


@dataclass
class Answer:
    """A provider's answer: the response as a JSON-ready dict, its tokens and retries."""

    body: dict[str, Any]
    input_tokens: int
    output_tokens: int
    retries: int


def request_kwargs(cfg: Any, key: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
    """litellm ``acompletion`` arguments for ``body`` under ``cfg`` (see the module
    docstring). ``max_tokens`` is clamped to the config's ``max_output_tokens``."""
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("messages: a non-empty list is required")
    kwargs: dict[str, Any] = {k: body[k] for k in ALLOWED_FIELDS if k in body and body[k] is not None}
    if body.get("n") not in (None, 1):
        raise BadRequest("n: only one choice per call is served")
    with_endpoint(kwargs, cfg, key)
    cap = _field(cfg, "max_output_tokens")
    if cap is not None:
        asked = kwargs.pop("max_completion_tokens", None) or kwargs.get("max_tokens")
        kwargs["max_tokens"] = min(int(asked), int(cap)) if asked else int(cap)
    extra = dict(_field(cfg, "extra_body") or {})
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def with_endpoint(kwargs: dict[str, Any], cfg: Any, key: str | None, *,
                  temperature_unless: tuple[str, ...] = ()) -> dict[str, Any]:
    """Put the config's endpoint on a request's allowed fields (every route): its model
    (never the client's), key, base URL and request timeout, and its temperature unless
    the request sets one (or a field in ``temperature_unless``, which such models refuse
    a temperature beside). Retries are the gateway's, so litellm's own are off."""
    kwargs.update(model=str(_field(cfg, "solver")), max_retries=0, num_retries=0)
    if key:
        kwargs["api_key"] = key
    if _field(cfg, "api_base"):
        kwargs["api_base"] = _field(cfg, "api_base")
    if (_field(cfg, "temperature") is not None and "temperature" not in kwargs
            and not any(f in kwargs for f in temperature_unless)):
        kwargs["temperature"] = _field(cfg, "temperature")
    if _field(cfg, "request_timeout_s") is not None:
        kwargs["timeout"] = float(_field(cfg, "request_timeout_s"))
    return kwargs


def _retrying(cfg: Any, counter: list[int]) -> Any:
    from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

    async def count(_state: Any) -> None:
        counter[0] += 1

    return AsyncRetrying(stop=stop_after_attempt(int(_field(cfg, "max_retries", 3)) + 1),
                         wait=RetryWait(float(_field(cfg, "retry_base_s", 1.0)), float(_field(cfg, "retry_max_s", 60.0))),
                         retry=retry_if_exception(retryable), reraise=True, before_sleep=count)


def _usage(obj: Any) -> tuple[int, int]:
    usage = obj.get("usage") if isinstance(obj, Mapping) else getattr(obj, "usage", None)
    if not usage:
        return 0, 0
    get = usage.get if isinstance(usage, Mapping) else (lambda k: getattr(usage, k, None))
    return int(get("prompt_tokens") or 0), int(get("completion_tokens") or 0)


def _as_dict(response: Any) -> dict[str, Any]:
    if hasattr(response, "model_dump"):
        return json.loads(json.dumps(response.model_dump(), default=str))
    return dict(response)


async def complete(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any) -> Answer:
    """One non-streamed call, retried per the config."""
    import litellm

    response, retries = await call_retried(cfg, request_kwargs(cfg, key, body), limiter, litellm.acompletion)
    tin, tout = _usage(response)
    _report(limiter, tin + tout)
    return Answer(_as_dict(response), tin, tout, retries)


async def call_retried(cfg: Any, kwargs: dict[str, Any], limiter: Any, fn: Any) -> tuple[Any, int]:
    """``fn(**kwargs)`` retried per the config, each attempt behind the rate limiter;
    returns its answer and the retries it took. A final failure carries the retry count
    (``_gateway_retries``) so the call's record can say how hard it was tried."""
    retries = [0]
    try:
        async for attempt in _retrying(cfg, retries):
            with attempt:
                if limiter is not None:
                    await limiter.aacquire()
                response = await fn(**kwargs)
    except BaseException as exc:
        exc._gateway_retries = retries[0]  # type: ignore[attr-defined]
        raise
    return response, retries[0]


async def stream(cfg: Any, key: str | None, body: Mapping[str, Any], limiter: Any,
                 usage_out: dict[str, int]) -> AsyncIterator[dict[str, Any]]:
    """A streamed call: yields each chunk as a dict. The stream is retried only until it
    opens (a retry after the first chunk would repeat text already delivered). The
    provider is asked to include usage in the last chunk; ``usage_out`` receives
    ``input_tokens``, ``output_tokens`` and ``retries``."""
    import litellm

    kwargs = request_kwargs(cfg, key, body)
    kwargs.update(stream=True, stream_options={"include_usage": True})
    response, usage_out["retries"] = await call_retried(cfg, kwargs, limiter, litellm.acompletion)
    tin = tout = 0
    try:
        async for chunk in response:
            cin, cout = _usage(chunk)
            if cin or cout:
                tin, tout = cin, cout
            yield _as_dict(chunk)
    finally:
        # A stream cut midway was billed for what the provider reported by then.
        usage_out["input_tokens"], usage_out["output_tokens"] = tin, tout
        _report(limiter, tin + tout)


def _report(limiter: Any, tokens: int) -> None:
    report = getattr(limiter, "report_tokens", None)
    if report is not None and tokens:
        report(tokens)


def call_row(cfg: Any, *, started_at: float, started_mono: float, input_tokens: int, output_tokens: int,
             retries: int, error: str | None) -> dict[str, Any]:
    """The call as a ``SolverCall.as_dict()`` row (the trajectory's ``calls`` entry)."""
    return {"model": _field(cfg, "solver") or _field(cfg, "id"), "started_at": started_at,
            "finished_at": time.time(), "input_tokens": int(input_tokens), "output_tokens": int(output_tokens),
            "cost_usd": price(cfg, int(input_tokens), int(output_tokens)),
            "seconds": time.monotonic() - started_mono, "retries": int(retries), "error": error}
