"""Chat models through litellm: the solver a harness wraps (``model=litellm``) and,
later, the search's own LLM agents.

Owns :func:`api_key` (credentials come only from the environment variable the config
names; a missing one is a one-line error naming it), :func:`build_chat_model` (a
LangChain ``ChatLiteLLM`` from a :class:`~milo_ray.config.ModelConfig`) and
:func:`usage_of` (an answer's :class:`AgentUsage`: tokens from ``usage_metadata``,
USD from the config's prices, else litellm's local price map, else unknown).

``import litellm`` takes seconds and must never happen on the offline path: this
module imports it only inside the functions that need it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from milo_ray.agents.usage import AgentUsage

# litellm must read its bundled price map, never fetch one: the value must be the word True.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Providers litellm refuses to call without some key, even for a local server.
_KEYED_PROVIDERS = ("openai/", "hosted_vllm/", "anthropic/", "azure/", "groq/", "mistral/", "together_ai/",
                    "openrouter/", "deepseek/", "gemini/")


def _field(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, Mapping) else getattr(cfg, name, default)


def api_key(cfg: Any, env: Mapping[str, str] | None = None) -> str | None:
    """The key for ``cfg`` (a ModelConfig or its dict) from the environment variable
    named by ``api_key_env``; ``ValueError`` names the variable when it is unset and the
    provider needs one. Providers that authenticate otherwise (``bedrock/`` through
    AWS credentials) need no ``api_key_env``."""
    env = os.environ if env is None else env
    name, solver = _field(cfg, "api_key_env"), str(_field(cfg, "solver") or "")
    if name:
        value = env.get(name)
        if not value:
            raise ValueError(f"model.api_key_env={name}: the environment variable {name} is not set; "
                             f"export it before the run (any non-empty value for a local server)")
        return value
    if solver.startswith(_KEYED_PROVIDERS):
        raise ValueError(f"model.api_key_env: {solver.split('/')[0]}/ models need an API key, even on a local "
                         "server; export one (e.g. OPENAI_API_KEY=local) and set model.api_key_env to its name")
    return None


def check_credentials(cfg: Any, env: Mapping[str, str] | None = None) -> None:
    """Refuse a model whose credentials are missing, before any work starts."""
    if _field(cfg, "solver"):
        api_key(cfg, env)


def build_chat_model(cfg: Any, *, max_retries: int = 3, rate_limiter: Any = None) -> Any:
    """A LangChain chat model for ``cfg.solver`` through langchain-litellm.

    ``max_retries``: retries of a failed call (429, 5xx, dropped connections) with
    exponential backoff; each one repeats the HTTP client's own two quick retries. ``rate_limiter``: a LangChain rate limiter shared by
    the callers of this model."""
    solver = _field(cfg, "solver")
    if not solver:
        raise ValueError("model.solver: not set; give a litellm model string such as openai/NAME (model=litellm)")
    from langchain_litellm import ChatLiteLLM

    kwargs: dict[str, Any] = {"model": solver, "api_key": api_key(cfg), "max_retries": int(max_retries),
                              "temperature": _field(cfg, "temperature")}
    if _field(cfg, "api_base"):
        kwargs["api_base"] = _field(cfg, "api_base")
    if _field(cfg, "max_output_tokens") is not None:
        kwargs["max_tokens"] = int(_field(cfg, "max_output_tokens"))
    if _field(cfg, "request_timeout_s") is not None:
        kwargs["request_timeout"] = float(_field(cfg, "request_timeout_s"))
    extra = dict(_field(cfg, "extra_body") or {})
    if extra:
        kwargs["model_kwargs"] = {"extra_body": extra}
    if rate_limiter is not None:
        kwargs["rate_limiter"] = rate_limiter
    return ChatLiteLLM(**kwargs)


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
