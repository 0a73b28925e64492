"""Forwarding one OpenAI-format chat-completions request to the real provider through
litellm, with the model config's retries, shared rate limit and prices -- the same
policy :class:`~milo_ray.llm.client.SolverChatLiteLLM` applies in-process.

The caller chooses the messages and sampling parameters, never the model, the key, the
endpoint or the retry policy: the request is rebuilt from an allowlist of fields on top
of the config (:func:`request_kwargs`). Each attempt is one HTTP request to the provider
(litellm's own retries off), retried when :func:`~milo_ray.llm.client.retryable`, with
full-jitter backoff or the wait a 429's ``Retry-After`` names
(:class:`~milo_ray.llm.client.RetryWait`); each attempt takes a slot of the model's
shared rate limiter, and the answer's tokens are reported to it (a stream's when it
ends, however it ends).

Also the rules every route shares: which tools a request may carry (:func:`check_tools`:
an allow-list of the tools the client runs itself, so the provider never acts for the
caller outside the sandbox or the meter), the upper bound of a call's tokens that
admission reserves (:func:`call_bound`), and how a failed call is classed
(:func:`failure_class`: the gateway's view, never the caller's).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from milo_ray.llm.client import RetryWait, _field, price, retryable

# Request fields a harness may set; everything else comes from the model config.
ALLOWED_FIELDS = ("messages", "tools", "tool_choice", "temperature", "top_p", "stop", "response_format",
                  "parallel_tool_calls", "seed", "max_tokens", "max_completion_tokens", "presence_penalty",
                  "frequency_penalty", "logit_bias", "user")


# Tool types the client runs itself: the only ones a request may carry. Every other type
# (web search, file search, code interpreter, MCP, computer use, and any type added later)
# is one the provider would run for the caller -- outside the sandbox's network policy and
# billed apart from the tokens metered here -- so it is refused, never forwarded.
CLIENT_TOOL_TYPES = ("function", "custom")
# When neither the request nor the config bounds a call's output: the output assumed for
# the call's reservation (a call that passes it is still charged what the provider billed).
ASSUMED_OUTPUT_TOKENS = 32_768
# Request fields that make the provider act outside the sandbox without naming a tool.
PROVIDER_ACTION_FIELDS = ("web_search_options", "mcp_servers", "container")


class BadRequest(ValueError):
    """The request cannot be forwarded as sent (HTTP 400 to the caller)."""


def check_tools(tools: Any, *, field: str = "tools", untyped: bool = False, groups: tuple[str, ...] = ()) -> None:
    """Refuse (:class:`BadRequest`) a tool list holding anything but client-run tools
    (:data:`CLIENT_TOOL_TYPES`; ``untyped``: a tool without ``type`` is one too, as in the
    Messages API; ``groups``: types that only group tools, each checked in turn)."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise BadRequest(f"{field}: a list of tools is required")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise BadRequest(f"{field}[{i}]: a tool object is required")
        kind = tool.get("type")
        if kind in CLIENT_TOOL_TYPES or (untyped and kind is None):
            continue
        if kind in groups:
            check_tools(tool.get("tools"), field=f"{field}[{i}].tools", untyped=untyped, groups=groups)
            continue
        raise BadRequest(f"{field}[{i}]: type {kind!r} is a tool the provider would run for the caller, outside "
                         "the sandbox and the gateway's metering; only tools the client runs itself are served "
                         f"(type {' or '.join(repr(t) for t in CLIENT_TOOL_TYPES)}"
                         f"{', or no type' if untyped else ''}): run it as a function tool in the sandbox")


def check_tool_choice(choice: Any, *, words: tuple[str, ...], types: tuple[str, ...], untyped: bool = False) -> None:
    """Refuse a ``tool_choice`` that names a provider-run tool: a word of ``words``, an
    object of a type in ``types``, or an ``allowed_tools`` object whose tools are client-run."""
    if choice is None or (isinstance(choice, str) and choice in words):
        return
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind in types:
            return
        if kind == "allowed_tools":
            inner = choice.get("allowed_tools")
            check_tools(choice.get("tools", inner.get("tools") if isinstance(inner, Mapping) else None),
                        field="tool_choice.tools", untyped=untyped)
            return
    raise BadRequest(f"tool_choice={choice!r}: only {', '.join(words) or 'a tool'} the client runs itself may "
                     "be chosen")


def check_provider_actions(body: Mapping[str, Any]) -> None:
    for name in PROVIDER_ACTION_FIELDS:
        if body.get(name) is not None:  # even empty: `web_search_options: {}` turns search on
            raise BadRequest(f"{name}: the provider would act for the caller outside the sandbox and the gateway's "
                             "metering; leave it out and use function tools run in the sandbox")


def output_bound(kwargs: Mapping[str, Any]) -> int:
    """The output bound of a call's upstream arguments (:data:`ASSUMED_OUTPUT_TOKENS` when
    it has none). The bound of its prompt is the request's size in bytes: a prompt never
    has more tokens than bytes under a byte-level tokenizer, the JSON syntax is margin."""
    out = kwargs.get("max_tokens", kwargs.get("max_output_tokens"))
    return int(out) if isinstance(out, int) and not isinstance(out, bool) and out > 0 else ASSUMED_OUTPUT_TOKENS


# The request field that bounds a call's output, per route (where admission's bound goes).
OUTPUT_FIELD = "max_tokens"


def failure_class(exc: BaseException) -> tuple[str, int | None]:
    """How the gateway classes a forwarded call that failed past its retries, and the
    provider's HTTP status: ``infra`` when the endpoint failed (what :func:`retryable`
    retries: 429, 5xx, timeouts, dropped or refused connections), ``request`` when the
    provider refused the request as sent (any other 4xx: bad request, auth, unknown model,
    too large, unprocessable) or it failed in a way the endpoint cannot be blamed for."""
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and 100 <= status < 600 else None
    return ("infra" if retryable(exc) else "request"), status


# Links of a failed call's exception chain (matched by class name, on every class of each
# link) that show the provider billed nothing: the connection was never made, so the
# request was never sent ...
_NEVER_SENT = ("ConnectError", "ConnectTimeout", "ClientConnectorError", "ConnectionRefusedError")
# ... or the provider answered it with an error status (an error answer is not billed):
# the HTTP client's own exception for the answer it received, not litellm's or the SDK's
# status classes, which litellm also raises when no answer came.
_ANSWERED_WITH_ERROR = ("HTTPStatusError",)


def may_be_billed(exc: BaseException) -> bool:
    """Whether the provider may bill a call that failed with ``exc`` although the gateway
    never learnt its usage: true unless the exception's chain shows the request was never
    sent or was answered with an error status. A timeout, a connection dropped after the
    request went out, a truncated or empty body, an unknown failure: the provider may have
    generated, and billed, the answer. (litellm wraps every failure in its own exception,
    whose ``status_code`` is set even when no status came -- 500 for a dropped connection --
    so the chain is read, not that attribute.)"""
    seen, link = 0, exc
    while link is not None and seen < 16:
        names = {cls.__name__ for cls in type(link).__mro__}
        if names.intersection(_NEVER_SENT) or names.intersection(_ANSWERED_WITH_ERROR):
            return False
        link, seen = link.__cause__ or link.__context__, seen + 1
    return True


@dataclass
class Answer:
    """A provider's answer: the response as a dict (JSON-ready unless ``raw`` is set), its
    tokens and retries; ``raw``: the response as the JSON bytes to send the caller, when the
    route serialized it already."""

    body: dict[str, Any]
    input_tokens: int
    output_tokens: int
    retries: int
    raw: bytes | None = None


def request_kwargs(cfg: Any, key: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
    """litellm ``acompletion`` arguments for ``body`` under ``cfg`` (see the module
    docstring). ``max_tokens`` is clamped to the config's ``max_output_tokens``."""
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("messages: a non-empty list is required")
    kwargs: dict[str, Any] = {k: body[k] for k in ALLOWED_FIELDS if k in body and body[k] is not None}
    if body.get("n") not in (None, 1):
        raise BadRequest("n: only one choice per call is served")
    check_provider_actions(body)
    check_tools(body.get("tools"))
    check_tool_choice(body.get("tool_choice"), words=("none", "auto", "required"), types=CLIENT_TOOL_TYPES)
    with_endpoint(kwargs, cfg, key)
    cap = _field(cfg, "max_output_tokens")
    if cap is not None:
        asked = kwargs.pop("max_completion_tokens", None) or kwargs.get("max_tokens")
        kwargs["max_tokens"] = min(int(asked), int(cap)) if asked else int(cap)
    extra = dict(_field(cfg, "extra_body") or {})
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


# The litellm arguments a gateway's credentials may set on a call (a key, or AWS's).
CREDENTIAL_ARGS = ("api_key", "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_region_name")


def with_endpoint(kwargs: dict[str, Any], cfg: Any, key: str | Mapping[str, str] | None, *,
                  temperature_unless: tuple[str, ...] = ()) -> dict[str, Any]:
    """Put the config's endpoint on a request's allowed fields (every route): its model
    (never the client's), key (or credential arguments: a mapping of :data:`CREDENTIAL_ARGS`),
    base URL and request timeout, and its temperature unless
    the request sets one (or a field in ``temperature_unless``, which such models refuse
    a temperature beside). Retries are the gateway's, so litellm's own are off."""
    kwargs.update(model=str(_field(cfg, "solver")), max_retries=0, num_retries=0)
    if isinstance(key, Mapping):
        # Credential arguments (a bedrock/ model's AWS credentials, see
        # llm/client.py:gateway_credentials): only these names, whatever else it holds.
        kwargs.update({k: v for k, v in key.items() if k in CREDENTIAL_ARGS and v})
    elif key:
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
    # Serialized once, as sent to the caller (not to a JSON-ready dict first, then again).
    dump = response.model_dump() if hasattr(response, "model_dump") else dict(response)
    return Answer(dump, tin, tout, retries, json.dumps(dump, default=str).encode())


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
    ``input_tokens``, ``output_tokens``, ``retries`` and ``reported`` (whether a chunk
    carried the provider's usage: a stream cut before it did not)."""
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
                usage_out["reported"] = 1
            yield _as_dict(chunk)
    finally:
        # What the provider reported by the end (the gateway charges a stream that never
        # reported its usage its reservation instead).
        usage_out["input_tokens"], usage_out["output_tokens"] = tin, tout
        _report(limiter, tin + tout)


def _report(limiter: Any, tokens: int) -> None:
    report = getattr(limiter, "report_tokens", None)
    if report is not None and tokens:
        report(tokens)


# Per model litellm prices: (the cost map's identity and size when learnt, None (unpriced)
# or (USD per input token, USD per output token), or "litellm" when its price is not linear).
_RATES: dict[str, tuple[int, int, Any]] = {}
# Token counts the linear rates are checked at against litellm's own price (the last one
# past the context tiers litellm prices, 128k to 272k tokens).
_RATE_CHECKS = ((1, 0), (0, 1), (1234, 567), (300_000, 70_000))


def call_price(cfg: Any, input_tokens: int, output_tokens: int) -> float | None:
    """:func:`~milo_ray.llm.client.price`, without litellm's half a millisecond per call:
    a model whose litellm price is linear in its tokens (no context tiers, and equal to
    litellm's own at :data:`_RATE_CHECKS`) is priced from its two rates, learnt once per
    model and cost map; any other model, or the config's own prices, as ``price`` does."""
    solver = _field(cfg, "solver")
    if not solver or (_field(cfg, "usd_per_mtok_input") is not None
                      and _field(cfg, "usd_per_mtok_output") is not None):
        return price(cfg, input_tokens, output_tokens)
    import litellm

    costs = litellm.model_cost
    known = _RATES.get(str(solver))
    if known is None or known[:2] != (id(costs), len(costs)):
        known = _RATES[str(solver)] = (id(costs), len(costs), _linear_rates(cfg))
    rates = known[2]
    if rates == "litellm":
        return price(cfg, input_tokens, output_tokens)
    return None if rates is None else input_tokens * rates[0] + output_tokens * rates[1]


def _linear_rates(cfg: Any) -> Any:
    import litellm

    if price(cfg, 1, 1) is None:
        return None  # litellm does not know the model
    try:
        info = litellm.get_model_info(str(_field(cfg, "solver")))
    except Exception:
        return "litellm"
    tiered = any(v is not None and (k == "tiered_pricing" or ("_above_" in k and k.endswith("_tokens")))
                 for k, v in info.items())
    rates = (float(info.get("input_cost_per_token") or 0.0), float(info.get("output_cost_per_token") or 0.0))
    if tiered or not all(math.isclose(tin * rates[0] + tout * rates[1], price(cfg, tin, tout) or 0.0,
                                      rel_tol=1e-9, abs_tol=1e-15) for tin, tout in _RATE_CHECKS):
        return "litellm"
    return rates


def call_row(cfg: Any, *, started_at: float, started_mono: float, input_tokens: int, output_tokens: int,
             retries: int, error: str | None) -> dict[str, Any]:
    """The call as a ``SolverCall.as_dict()`` row (the trajectory's ``calls`` entry)."""
    return {"model": _field(cfg, "solver") or _field(cfg, "id"), "started_at": started_at,
            "finished_at": time.time(), "input_tokens": int(input_tokens), "output_tokens": int(output_tokens),
            "cost_usd": call_price(cfg, int(input_tokens), int(output_tokens)),
            "seconds": time.monotonic() - started_mono, "retries": int(retries), "error": error}
