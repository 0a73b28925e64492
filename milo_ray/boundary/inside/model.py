"""The chat model a harness is given inside its sandbox: a LangChain chat model that
speaks OpenAI chat completions to the model gateway, and nothing else.

Why not :class:`~milo_ray.llm.client.SolverChatLiteLLM` (what harnesses got when they ran
in the worker): inside the sandbox the only endpoint is the gateway, which already does
everything litellm is for -- the provider's own format, retries, the shared rate limit,
prices. ``import litellm`` is most of a fresh harness process's start-up (seconds of CPU,
measured by ``scripts/bench_sandbox.py --only boundary``); this client needs only
langchain-core and httpx, which deepagents imports anyway.

It keeps the interface harnesses use: ``invoke``/``ainvoke``/``stream``/``astream``,
``bind_tools`` (tool_choice as ChatLiteLLM takes it: a name, ``"any"``/``True`` for
"required", a keyword or a dict), ``with_structured_output`` (``json_schema``, ``json_mode``
or ``function_calling``), ``bind(**request_fields)``, and the fields ``model``,
``model_name``, ``temperature``, ``max_tokens``, ``top_p``, ``request_timeout``,
``model_kwargs``, ``streaming``, ``api_base``, ``api_key`` (the rollout's gateway
token) and ``gateway_socket`` (the rollout's gateway socket: when set, every call goes over
it, a non-streaming one by :mod:`milo_ray.boundary.inside.gateway_http`). Answers come back as ChatLiteLLM returned them: an ``AIMessage`` with ``tool_calls``
(unparseable arguments as ``invalid_tool_calls``), ``usage_metadata``, the provider's
``reasoning_content`` / ``thinking_blocks`` in ``additional_kwargs`` (sent back on the next
turn), and ``response_metadata`` with ``model_name`` and ``finish_reason``. A gateway
refusal or upstream failure raises :class:`httpx.HTTPStatusError` carrying the gateway's
message (an endpoint error, not the harness's: see
:func:`milo_ray.core.failures.is_endpoint_error`).

A harness that wants litellm's own class can still import it (and pays its import).
"""

from __future__ import annotations

import json
import threading
from urllib.parse import urlsplit
from typing import Any, AsyncIterator, Iterator, Sequence

import httpx
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr

from milo_ray.boundary.inside.gateway_http import Answer, AsyncGatewayHTTP, GatewayHTTP

# tool_choice values passed on as they are (anything else that is a string names a tool).
_TOOL_CHOICE_KEYWORDS = ("auto", "none", "required")
# Assistant-message fields the provider returns that must go back to it on the next turn
# (Anthropic's signed thinking blocks, reasoning models' reasoning text).
_ECHOED_FIELDS = ("reasoning_content", "thinking_blocks")


class GatewayChatModel(BaseChatModel):
    """See the module docstring."""

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    model: str = "gateway"
    model_name: str | None = None
    api_base: str = ""
    api_key: str | None = Field(default=None, repr=False)
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    request_timeout: float | None = None
    streaming: bool = False
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    max_retries: int = 0
    """Accepted for ChatLiteLLM's signature; the gateway retries the provider."""
    gateway_socket: str | None = None
    """The rollout's gateway socket bound into the sandbox. When set, every request goes
    over it and nowhere else (``api_base`` then only gives the path): no loopback hop."""

    _sync: httpx.Client | None = PrivateAttr(default=None)
    _direct: Any = PrivateAttr(default=None)  # the socket's own exchange, (blocking, async)
    _async: dict[int, httpx.AsyncClient] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "milo-gateway"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens}

    # --- the request ------------------------------------------------------------------------
    def _body(self, messages: list[BaseMessage], stop: list[str] | None, stream: bool, **kwargs: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": _to_dicts(messages)}
        for name in ("temperature", "max_tokens", "top_p"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        body.update(self.model_kwargs)
        body.update({k: v for k, v in kwargs.items() if v is not None})
        if stop:
            body["stop"] = stop
        if stream:
            body["stream"] = True
        return body

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key or ''}", "Content-Type": "application/json"}

    def _url(self) -> str:
        return self.api_base.rstrip("/") + "/chat/completions"

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.request_timeout if self.request_timeout is not None else 600.0)

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._sync is None:
                transport = httpx.HTTPTransport(uds=self.gateway_socket) if self.gateway_socket else None
                self._sync = httpx.Client(timeout=self._timeout(), trust_env=False, transport=transport)
            return self._sync

    def _over_socket(self) -> tuple[GatewayHTTP, AsyncGatewayHTTP]:
        with self._lock:
            if self._direct is None:
                timeout = self.request_timeout if self.request_timeout is not None else 600.0
                self._direct = (GatewayHTTP(self.gateway_socket, timeout), AsyncGatewayHTTP(self.gateway_socket, timeout))
            return self._direct

    def _exchange(self, body: dict[str, Any]) -> tuple[str, str, dict[str, str], bytes]:
        """What a call over the socket sends: the path and host of ``api_base``, the headers
        and the body encoded as httpx encodes ``json=``."""
        url = urlsplit(self._url())
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        return url.path or "/", url.netloc or "gateway", self._headers(), data

    def _aclient(self) -> httpx.AsyncClient:
        import asyncio

        # An AsyncClient belongs to the loop it first ran on (its pooled connections do).
        loop = id(asyncio.get_running_loop())
        with self._lock:
            client = self._async.get(loop)
            if client is None:
                transport = httpx.AsyncHTTPTransport(uds=self.gateway_socket) if self.gateway_socket else None
                client = self._async[loop] = httpx.AsyncClient(timeout=self._timeout(), trust_env=False,
                                                               transport=transport)
            return client

    # --- BaseChatModel ----------------------------------------------------------------------
    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        if self.streaming:
            return _from_chunks(self._stream(messages, stop, run_manager, **kwargs))
        if self.gateway_socket:
            answer = self._over_socket()[0].post(*self._exchange(self._body(messages, stop, False, **kwargs)))
            return _result(_checked_answer(answer, self._url()))
        r = self._client().post(self._url(), json=self._body(messages, stop, False, **kwargs), headers=self._headers())
        return _result(_checked(r, r.content))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                         **kwargs: Any) -> ChatResult:
        if self.streaming:
            return _from_chunks([c async for c in self._astream(messages, stop, run_manager, **kwargs)])
        if self.gateway_socket:
            answer = await self._over_socket()[1].post(*self._exchange(self._body(messages, stop, False, **kwargs)))
            return _result(_checked_answer(answer, self._url()))
        r = await self._aclient().post(self._url(), json=self._body(messages, stop, False, **kwargs),
                                       headers=self._headers())
        return _result(_checked(r, r.content))

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        body = self._body(messages, stop, True, **kwargs)
        with self._client().stream("POST", self._url(), json=body, headers=self._headers()) as r:
            if r.status_code >= 400:
                _checked(r, r.read())
            for line in r.iter_lines():
                chunk = _sse_chunk(line)
                if chunk is not None:
                    if run_manager is not None and isinstance(chunk.message.content, str):
                        run_manager.on_llm_new_token(chunk.message.content, chunk=chunk)
                    yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        body = self._body(messages, stop, True, **kwargs)
        async with self._aclient().stream("POST", self._url(), json=body, headers=self._headers()) as r:
            if r.status_code >= 400:
                _checked(r, await r.aread())
            async for line in r.aiter_lines():
                chunk = _sse_chunk(line)
                if chunk is not None:
                    if run_manager is not None and isinstance(chunk.message.content, str):
                        await run_manager.on_llm_new_token(chunk.message.content, chunk=chunk)
                    yield chunk

    # --- tools and structured output (as ChatLiteLLM takes them) ----------------------------
    def bind_tools(self, tools: Sequence[Any], tool_choice: Any = None, **kwargs: Any) -> Any:
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is True or tool_choice == "any":
            tool_choice = "required"
        elif isinstance(tool_choice, str) and tool_choice not in _TOOL_CHOICE_KEYWORDS:
            tool_choice = {"type": "function", "function": {"name": tool_choice}}
        elif tool_choice is False:
            tool_choice = None
        if isinstance(tool_choice, dict) and "function" in tool_choice:
            names = [t["function"]["name"] for t in formatted if "function" in t]
            if tool_choice["function"]["name"] not in names:
                raise ValueError(f"tool_choice names {tool_choice['function']['name']!r}, "
                                 f"but the bound function tools are {names}.")
        return super().bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(self, schema: Any, *, method: str | None = "json_schema", include_raw: bool = False,
                               strict: bool | None = None, **kwargs: Any) -> Any:
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw, **kwargs)
        from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
        from langchain_core.runnables import RunnableMap, RunnablePassthrough
        from langchain_core.utils.pydantic import is_basemodel_subclass

        kwargs.pop("tools", None)
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        is_model = isinstance(schema, type) and is_basemodel_subclass(schema)
        parser: Any = PydanticOutputParser(pydantic_object=schema) if is_model else JsonOutputParser()
        if method == "json_mode":
            llm = self.bind(response_format={"type": "json_object"})
        elif method == "json_schema":
            tool = convert_to_openai_tool(schema)
            llm = self.bind(response_format={"type": "json_schema", "json_schema": {
                "name": getattr(schema, "__name__", tool["function"]["name"]),
                "schema": tool["function"]["parameters"], "strict": True if strict is None else strict}})
        else:
            raise ValueError(f"with_structured_output: method={method!r}; use json_schema, json_mode or "
                             "function_calling")
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=lambda x: parser.invoke(x["raw"]), parsing_error=lambda _: None)
        return RunnableMap(raw=llm) | parsed


def _to_dicts(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    out = convert_to_openai_messages(messages)
    for message, d in zip(messages, out):
        if isinstance(message, AIMessage):
            for name in _ECHOED_FIELDS:
                if message.additional_kwargs.get(name):
                    d[name] = message.additional_kwargs[name]
            # The calls whose arguments did not parse go back as the model sent them (as
            # ChatOpenAI sends them): langchain's agent answers each with an error tool
            # message, which a provider refuses unless the call it answers is there.
            echoed = [{"id": c.get("id"), "type": "function",
                       "function": {"name": c.get("name") or "", "arguments": c.get("args") or ""}}
                      for c in message.invalid_tool_calls if c.get("id")]
            if echoed:
                d["tool_calls"] = [*d.get("tool_calls", []), *echoed]
    return out


def _checked(r: httpx.Response, content: bytes) -> dict[str, Any]:
    if r.status_code >= 400:
        try:
            detail = json.loads(content)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = content[:500].decode("utf-8", errors="replace")
        raise httpx.HTTPStatusError(f"model gateway answered {r.status_code}: {detail}", request=r.request,
                                    response=r)
    return json.loads(content)


def _checked_answer(answer: Answer, url: str) -> dict[str, Any]:
    if answer.status >= 400:
        response = answer.response(url)
        return _checked(response, answer.content)
    return json.loads(answer.content)


def _usage(usage: Any) -> dict[str, int] | None:
    if not isinstance(usage, dict):
        return None
    tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"input_tokens": tin, "output_tokens": tout, "total_tokens": int(usage.get("total_tokens") or tin + tout)}


def _tool_calls(raw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    calls, invalid = [], []
    for tc in raw or []:
        func = tc.get("function") or {}
        args = func.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                # Kept with its raw text and the parser's reason: the agent cannot run it,
                # and the trajectory shows it (milo_ray.boundary.trajectory.invalid_call).
                invalid.append({"type": "invalid_tool_call", "name": func.get("name"), "args": args,
                                "id": tc.get("id"), "error": f"the arguments are not valid JSON: {exc}"})
                continue
        calls.append({"type": "tool_call", "name": func.get("name") or "",
                      "args": args if isinstance(args, dict) else {}, "id": tc.get("id") or ""})
    return calls, invalid


def _result(data: dict[str, Any]) -> ChatResult:
    choice = (data.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    calls, invalid = _tool_calls(msg.get("tool_calls"))
    extra: dict[str, Any] = {}
    if msg.get("tool_calls"):
        extra["tool_calls"] = msg["tool_calls"]
    for name in _ECHOED_FIELDS:
        if msg.get(name):
            extra[name] = msg[name]
    meta = {"model_name": data.get("model"), "finish_reason": choice.get("finish_reason")}
    message = AIMessage(content=msg.get("content") or "", additional_kwargs=extra, tool_calls=calls,
                        invalid_tool_calls=invalid, usage_metadata=_usage(data.get("usage")),
                        response_metadata=meta, id=data.get("id"))
    return ChatResult(generations=[ChatGeneration(message=message, generation_info={"finish_reason":
                                                                                    choice.get("finish_reason")})],
                      llm_output={"model_name": data.get("model"), "token_usage": data.get("usage")})


def _sse_chunk(line: str) -> ChatGenerationChunk | None:
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    data = json.loads(payload)
    choice = (data.get("choices") or [{}])[0]
    delta = choice.get("delta") or {}
    chunks = [{"name": (tc.get("function") or {}).get("name"), "args": (tc.get("function") or {}).get("arguments"),
               "id": tc.get("id"), "index": tc.get("index")} for tc in delta.get("tool_calls") or []]
    extra = {name: delta[name] for name in _ECHOED_FIELDS if delta.get(name)}
    meta = {"finish_reason": choice["finish_reason"], "model_name": data.get("model")} \
        if choice.get("finish_reason") else {}
    message = AIMessageChunk(content=delta.get("content") or "", tool_call_chunks=chunks, additional_kwargs=extra,
                             usage_metadata=_usage(data.get("usage")), response_metadata=meta, id=data.get("id"))
    return ChatGenerationChunk(message=message)


def _from_chunks(chunks: Any) -> ChatResult:
    total: ChatGenerationChunk | None = None
    for c in chunks:
        total = c if total is None else total + c
    if total is None:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=""))])
    m = total.message
    message = AIMessage(content=m.content, additional_kwargs=m.additional_kwargs, tool_calls=m.tool_calls,
                        invalid_tool_calls=m.invalid_tool_calls, usage_metadata=m.usage_metadata,
                        response_metadata=m.response_metadata, id=m.id)
    return ChatResult(generations=[ChatGeneration(message=message)])
