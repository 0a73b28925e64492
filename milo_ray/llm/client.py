"""Chat models through litellm: the solver a harness wraps (``model=litellm``) and,
later, the search's own LLM agents.

Owns :func:`api_key` (credentials come only from the environment variable the config
names; a missing one is a one-line error naming it), :func:`build_chat_model` (a
``SolverChatLiteLLM``, the LangChain ``ChatLiteLLM`` with the config's retries, backoff,
request timeout and shared rate limit), :func:`gateway_chat_model` (the same class
pointed at a model gateway with a per-call token instead of a key), :func:`retryable`
(which failures are retried) and :func:`usage_of` / :func:`price` (an answer's :class:`AgentUsage`: tokens from
``usage_metadata``, USD from the config's prices, else litellm's local price map, else
unknown). Per-call records for the trajectory and ``agent_calls`` come from
:mod:`milo_ray.llm.solver_calls`; the limiter from :mod:`milo_ray.llm.rate_limit`.

``import litellm`` takes seconds and must never happen on the offline path: this
module imports it only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Iterator, Mapping

from milo_ray.llm.accounts import key_env  # noqa: F401 (part of this module's API)
from milo_ray.llm.usage import AgentUsage

# litellm must read its bundled price map, never fetch one: the value must be the word True.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _field(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, Mapping) else getattr(cfg, name, default)


# The AWS credential variables a ``bedrock/`` model authenticates with, each with the
# litellm argument it becomes (``AWS_REGION`` before ``AWS_DEFAULT_REGION``, as boto reads
# them). Ray's processes never hold the credentials (they are scrubbed from every Ray
# environment, see execution/cluster.py), so the driver hands them over like a key and the
# gateway passes them to litellm per call. ``AWS_PROFILE`` names a section of a credentials
# file and is not handed over: a profile works only where that file is.
AWS_CREDENTIAL_ENV = (("AWS_ACCESS_KEY_ID", "aws_access_key_id"), ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
                      ("AWS_SESSION_TOKEN", "aws_session_token"), ("AWS_REGION", "aws_region_name"),
                      ("AWS_DEFAULT_REGION", "aws_region_name"))


def credential_envs(cfg: Any) -> list[str]:
    """Every variable ``cfg``'s model may authenticate with: :func:`key_env`'s, and for a
    ``bedrock/`` model the AWS credential variables (:data:`AWS_CREDENTIAL_ENV`)."""
    names = [n for n in [key_env(cfg)] if n]
    if str(_field(cfg, "solver") or "").startswith("bedrock/"):
        names += [n for n, _ in AWS_CREDENTIAL_ENV if n not in names]
    return names


def aws_credentials(cfg: Any, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The litellm arguments (``aws_access_key_id``...) of the AWS credential variables set
    in ``env`` (default: the secrets of :func:`use_secrets`, else this process's
    environment) for a ``bedrock/`` model; empty for any other model."""
    if not str(_field(cfg, "solver") or "").startswith("bedrock/"):
        return {}
    if env is None:
        with _SECRETS_LOCK:
            env = {**os.environ, **_SECRETS}
    out: dict[str, str] = {}
    for name, arg in AWS_CREDENTIAL_ENV:
        if env.get(name) and arg not in out:
            out[arg] = env[name]
    return out


def gateway_credentials(cfg: Any, key: str | None, env: Mapping[str, str] | None = None) -> str | dict[str, str] | None:
    """What a model gateway is given to authenticate ``cfg``'s calls: the key alone, or,
    for a ``bedrock/`` model with AWS credentials in ``env`` (see :func:`aws_credentials`),
    the litellm arguments {``api_key``?, ``aws_...``} it passes on every call."""
    aws = aws_credentials(cfg, env)
    if not aws:
        return key
    return {**({"api_key": key} if key else {}), **aws}


_SECRETS: dict[str, str] = {}
_SECRETS_LOCK = threading.Lock()


@contextlib.contextmanager
def use_secrets(secrets: Mapping[str, str] | None) -> Iterator[None]:
    """Make the driver's key variables (name -> value, handed over as an argument) what
    :func:`api_key` reads first in this process, for the duration of the block -- without
    putting them into the process's environment, where subprocesses and logs would see
    them."""
    with _SECRETS_LOCK:
        before = dict(_SECRETS)
        _SECRETS.update(dict(secrets or {}))
    try:
        yield
    finally:
        with _SECRETS_LOCK:
            _SECRETS.clear()
            _SECRETS.update(before)


def secret(name: str) -> str | None:
    """The value of key variable ``name`` as an agent of this process reads it: among the
    secrets of :func:`use_secrets`, else in the environment (None: neither has it)."""
    with _SECRETS_LOCK:
        if name in _SECRETS:
            return _SECRETS[name]
    return os.environ.get(name)


def api_key(cfg: Any, env: Mapping[str, str] | None = None, *, where: str = "model") -> str | None:
    """The key for ``cfg`` (a ModelConfig or its dict) from the variable :func:`key_env`
    names -- in ``env`` when given, else among the secrets of :func:`use_secrets`, else in
    this process's environment; ``ValueError`` names the variable, and the config node
    ``where`` that names it, when it is unset."""
    if env is None:
        with _SECRETS_LOCK:
            env = {**os.environ, **_SECRETS} if _SECRETS else os.environ
    name = key_env(cfg)
    if name is None:
        return None
    value = env.get(name)
    if not value:
        field = f"{where}.api_key_env={name}" if _field(cfg, "api_key_env") else \
            f"{where}.api_key_env (unset: {str(_field(cfg, 'solver')).split('/')[0]}/ models read {name})"
        raise ValueError(f"{field}: the environment variable {name} is not set; export it before the run "
                         "(any non-empty value for a local server)")
    return value


def check_credentials(cfg: Any, env: Mapping[str, str] | None = None) -> None:
    """Refuse a model whose credentials are missing, before any work starts."""
    if _field(cfg, "solver"):
        api_key(cfg, env)


def build_chat_model(cfg: Any, *, rate_limiter: Any = "config", callbacks: list[Any] | None = None) -> Any:
    """A LangChain chat model for ``cfg.solver`` through langchain-litellm
    (:class:`SolverChatLiteLLM`): ``cfg.max_retries`` retries with full-jitter backoff,
    ``cfg.request_timeout_s`` per request, and the run-wide rate limit of ``cfg.rpm`` /
    ``cfg.tpm``.

    ``rate_limiter``: "config" (the default) takes the model's shared limiter from
    :func:`~milo_ray.llm.rate_limit.rate_limiter_for`; None turns limiting off; a
    :class:`~milo_ray.llm.rate_limit.SharedRateLimiter` or any LangChain
    ``BaseRateLimiter`` replaces it. ``callbacks``: LangChain callback handlers of every
    call (e.g. a :class:`~milo_ray.llm.solver_calls.SolverCallRecorder`)."""
    solver = _field(cfg, "solver")
    if not solver:
        raise ValueError("model.solver: not set; give a litellm model string such as openai/NAME (model=litellm)")
    if rate_limiter == "config":
        from milo_ray.llm.rate_limit import rate_limiter_for

        rate_limiter = rate_limiter_for(cfg)
    kwargs: dict[str, Any] = {"model": solver, "api_key": api_key(cfg), "temperature": _field(cfg, "temperature"),
                              "max_retries": int(_field(cfg, "max_retries", 3)),
                              "retry_base_s": float(_field(cfg, "retry_base_s", 1.0)),
                              "retry_max_s": float(_field(cfg, "retry_max_s", 60.0)),
                              "request_limiter": rate_limiter}
    if _field(cfg, "api_base"):
        kwargs["api_base"] = _field(cfg, "api_base")
    if _field(cfg, "max_output_tokens") is not None:
        kwargs["max_tokens"] = int(_field(cfg, "max_output_tokens"))
    if _field(cfg, "request_timeout_s") is not None:
        kwargs["request_timeout"] = float(_field(cfg, "request_timeout_s"))
    extra = dict(_field(cfg, "extra_body") or {})
    if extra:
        kwargs["model_kwargs"] = {"extra_body": extra}
    # A Ray process has no AWS credentials in its environment: those handed over
    # (use_secrets) go to litellm as arguments of every call.
    aws = aws_credentials(cfg)
    if aws:
        kwargs["model_kwargs"] = {**kwargs.get("model_kwargs", {}), **aws}
    if callbacks:
        kwargs["callbacks"] = list(callbacks)
    return _solver_class()(**kwargs)


def gateway_chat_model(cfg: Any, *, base_url: str, token: str) -> Any:
    """A :class:`SolverChatLiteLLM` for ``cfg``'s model that reaches it only through a
    model gateway: ``base_url`` (the gateway's OpenAI-compatible ``.../v1``) and ``token``
    (the gateway's per-call grant) as its key, never the provider's key or endpoint. The
    gateway holds those, retries and rate-limits the provider and meters every call, so
    this client does neither: no retries (each would multiply the gateway's), no limiter,
    and a request timeout that covers the gateway's own retries inside one request."""
    solver = _field(cfg, "solver")
    if not solver:
        raise ValueError("model.solver: not set; give a litellm model string such as openai/NAME")
    kwargs: dict[str, Any] = {"model": str(solver), "custom_llm_provider": "openai", "api_base": base_url,
                              "api_key": token, "temperature": _field(cfg, "temperature"),
                              "max_retries": 0, "request_limiter": None}
    if _field(cfg, "max_output_tokens") is not None:
        kwargs["max_tokens"] = int(_field(cfg, "max_output_tokens"))
    timeout = gateway_client_timeout(cfg)
    if timeout is not None:
        kwargs["request_timeout"] = timeout
    return _solver_class()(**kwargs)


def gateway_client_timeout(cfg: Any) -> float | None:
    """The request timeout of a client that reaches ``cfg``'s model through a gateway:
    the gateway's own attempts (each up to ``request_timeout_s``) and the waits between
    them (each up to ``retry_max_s``) run inside one request of that client, plus a
    minute of slack. None when ``cfg`` sets no request timeout."""
    timeout = _field(cfg, "request_timeout_s")
    if timeout is None:
        return None
    retries = int(_field(cfg, "max_retries", 3))
    return float(timeout) * (retries + 1) + retries * float(_field(cfg, "retry_max_s", 60.0)) + 60.0


def retry_after_s(exc: BaseException | None) -> float | None:
    """The wait a failed request's answer asked for: its ``Retry-After-Ms`` or
    ``Retry-After`` header (seconds, or an HTTP date), None when it names none. litellm's
    errors carry the provider's headers as ``litellm_response_headers`` and on
    ``response`` (an httpx response); the openai client's on ``response``."""
    import email.utils

    if exc is None:
        return None
    for headers in (getattr(exc, "litellm_response_headers", None), getattr(getattr(exc, "response", None),
                                                                              "headers", None)):
        if not headers:
            continue
        for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
            value = headers.get(name)
            if value is None:
                continue
            try:
                seconds = float(value) / divisor
            except ValueError:
                parsed = email.utils.parsedate_tz(str(value))
                if parsed is None:
                    continue
                seconds = email.utils.mktime_tz(parsed) - time.time()
            if seconds == seconds:  # not NaN
                return max(0.0, seconds)
    return None


class RetryWait:
    """The wait before a retry: full-jitter exponential backoff (``base_s`` doubling, at
    most ``max_s``), or, when the failed answer names a ``Retry-After``, that wait --
    a provider that says when to come back rejects an earlier retry again, so jitter
    under it only spends an attempt. It is capped at ``max_s`` (the config's longest
    wait between retries, ``retry_max_s``): a provider asking for more gets the retry
    at ``max_s`` and, if still limited, the next ``Retry-After``. A tenacity ``wait``."""

    def __init__(self, base_s: float, max_s: float) -> None:
        from tenacity import wait_random_exponential

        self.max_s = float(max_s)
        self._backoff = wait_random_exponential(multiplier=float(base_s), max=float(max_s))

    def __call__(self, retry_state: Any) -> float:
        outcome = retry_state.outcome
        asked = retry_after_s(outcome.exception() if outcome is not None and outcome.failed else None)
        if asked is not None:
            return min(asked, self.max_s)
        return float(self._backoff(retry_state))


def retryable(exc: BaseException) -> bool:
    """Whether a failed request is worth repeating: no answer arrived (timeout, dropped or
    refused connection), or the server said so (429, 5xx). Other 4xx answers (bad
    request, auth, unknown model, context too long) fail the same way every time."""
    import openai

    if isinstance(exc, openai.APIConnectionError):  # litellm's Timeout and APIConnectionError included
        return True
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status == 429 or status >= 500
    return isinstance(exc, (ConnectionError, TimeoutError))


_SOLVER_CLASS: Any = None


def _solver_class() -> Any:
    """:class:`SolverChatLiteLLM`, defined on first use so that importing this module
    never imports litellm (the module's ``__getattr__`` makes it importable by name)."""
    global _SOLVER_CLASS
    if _SOLVER_CLASS is None:
        _SOLVER_CLASS = _define_solver_class()
    return _SOLVER_CLASS


def __getattr__(name: str) -> Any:
    if name == "SolverChatLiteLLM":
        return _solver_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _define_solver_class() -> Any:
    import litellm
    from langchain_litellm import ChatLiteLLM
    from pydantic import Field
    from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt

    class SolverChatLiteLLM(ChatLiteLLM):
        """ChatLiteLLM whose retries are exactly the config's.

        ChatLiteLLM retries through tenacity with a fixed 4-10 s wait, and the openai
        client under litellm retries twice more inside every attempt, so one call could
        send three times the requests it was allowed. Here each attempt is one HTTP
        request (``max_retries=0`` for the client, ``num_retries=0`` for litellm), retried
        only when :func:`retryable`, ``max_retries`` times, after :class:`RetryWait`
        (full-jitter backoff, or the answer's ``Retry-After``); each retry is announced
        to the callbacks (``on_retry``), which is how a call's retries are counted. Each
        attempt takes a slot of ``request_limiter`` (retries are requests the provider
        counts too) and reports its tokens to it -- a streamed answer's from the usage
        of its last chunk, as the stream is consumed."""

        max_retries: int = 3
        """Retries after the first attempt (not ChatLiteLLM's attempts)."""
        retry_base_s: float = 1.0
        retry_max_s: float = 60.0
        request_limiter: Any = Field(default=None, exclude=True)

        def _retrying(self, cls: Any, run_manager: Any) -> Any:
            def before_sleep(state: Any) -> None:
                if run_manager is not None:
                    run_manager.on_retry(state)

            async def abefore_sleep(state: Any) -> None:
                if run_manager is not None:
                    await run_manager.on_retry(state)

            return cls(stop=stop_after_attempt(int(self.max_retries) + 1),
                       wait=RetryWait(float(self.retry_base_s), float(self.retry_max_s)),
                       retry=retry_if_exception(retryable), reraise=True,
                       before_sleep=abefore_sleep if cls is AsyncRetrying else before_sleep)

        @staticmethod
        def _single_request(kwargs: dict[str, Any]) -> dict[str, Any]:
            return {**kwargs, "max_retries": 0, "num_retries": 0}

        def _report(self, response: Any, *, is_async: bool = False) -> Any:
            """Count an answer's tokens against the limiter's tpm. A stream's usage comes
            in its last chunk (``include_usage``, which ChatLiteLLM asks for): the stream
            is returned wrapped, and reports when it ends -- also when it is cut short,
            with the usage seen by then (none, if the provider never sent it)."""
            report = getattr(self.request_limiter, "report_tokens", None)
            if report is None:
                return response
            if hasattr(response, "get"):  # a whole answer (litellm's ModelResponse)
                report(_usage_tokens(response.get("usage")))
                return response
            # litellm's stream wrapper iterates both ways; the caller's path says which.
            if is_async and hasattr(response, "__aiter__"):
                return _counted_astream(response, report)
            if not is_async and hasattr(response, "__iter__"):
                return _counted_stream(response, report)
            return response

        def completion_with_retry(self, run_manager: Any = None, **kwargs: Any) -> Any:
            kwargs = self._single_request(kwargs)
            attempts = 0
            try:
                for attempt in self._retrying(Retrying, run_manager):
                    with attempt:
                        attempts += 1
                        if self.request_limiter is not None:
                            self.request_limiter.acquire()
                        response = self.client.completion(**kwargs)
            except BaseException as exc:
                exc.add_note(f"{self.model}: failed after {attempts} request(s)")
                raise
            return self._report(response)

        async def acompletion_with_retry(self, run_manager: Any = None, **kwargs: Any) -> Any:
            kwargs = self._single_request(kwargs)
            attempts = 0
            try:
                async for attempt in self._retrying(AsyncRetrying, run_manager):
                    with attempt:
                        attempts += 1
                        if self.request_limiter is not None:
                            await self.request_limiter.aacquire()
                        response = await self.client.acompletion(**kwargs)
            except BaseException as exc:
                exc.add_note(f"{self.model}: failed after {attempts} request(s)")
                raise
            return self._report(response, is_async=True)

    # litellm prints a feedback banner to stdout on every failed request, retried or not;
    # the error itself still propagates and is recorded.
    litellm.suppress_debug_info = True
    # Named as importable: ``from milo_ray.llm.client import SolverChatLiteLLM`` (module __getattr__).
    SolverChatLiteLLM.__module__, SolverChatLiteLLM.__qualname__ = __name__, "SolverChatLiteLLM"
    return SolverChatLiteLLM


def _usage_tokens(usage: Any) -> int:
    """Input + output tokens of a response's or chunk's ``usage`` (a dict or an object)."""
    if not usage:
        return 0
    get = usage.get if hasattr(usage, "get") else (lambda k: getattr(usage, k, None))
    return int(get("prompt_tokens") or 0) + int(get("completion_tokens") or 0)


def _chunk_tokens(chunk: Any) -> int:
    return _usage_tokens(chunk.get("usage") if isinstance(chunk, Mapping) else getattr(chunk, "usage", None))


def _counted_stream(chunks: Any, report: Any) -> Iterator[Any]:
    """``chunks`` passed through; the last usage seen is reported when the stream ends,
    however it ends (a provider bills a stream the caller stopped reading)."""
    tokens = 0
    try:
        for chunk in chunks:
            tokens = _chunk_tokens(chunk) or tokens
            yield chunk
    finally:
        if tokens:
            report(tokens)


async def _counted_astream(chunks: Any, report: Any) -> Any:
    tokens = 0
    try:
        async for chunk in chunks:
            tokens = _chunk_tokens(chunk) or tokens
            yield chunk
    finally:
        if tokens:
            report(tokens)


def usage_of(message: Any, cfg: Any, *, seconds: float = 0.0, retries: int = 0) -> AgentUsage:
    """What one answer cost. Tokens from the message's ``usage_metadata``; USD from the
    config's prices when given, else from litellm's local price map, else None (an
    unpriced model is never recorded as free)."""
    meta = getattr(message, "usage_metadata", None) or {}
    tin, tout = int(meta.get("input_tokens") or 0), int(meta.get("output_tokens") or 0)
    return AgentUsage(tin, tout, price(cfg, tin, tout), seconds=seconds, retries=retries)


def price(cfg: Any, input_tokens: int, output_tokens: int) -> float | None:
    """USD of a call: the config's ``usd_per_mtok_input/output`` when set, else
    litellm's price for ``solver``, else None."""
    pin, pout = _field(cfg, "usd_per_mtok_input"), _field(cfg, "usd_per_mtok_output")
    if pin is not None and pout is not None:
        return (input_tokens * float(pin) + output_tokens * float(pout)) / 1e6
    solver = _field(cfg, "solver")
    if not solver:
        return None
    import litellm

    try:
        cin, cout = litellm.cost_per_token(model=str(solver), prompt_tokens=input_tokens,
                                           completion_tokens=output_tokens)
    except Exception:  # litellm does not know the model: unpriced
        return None
    return float(cin) + float(cout)
