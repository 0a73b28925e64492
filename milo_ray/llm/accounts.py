"""Which provider account a model's calls are billed to and limited on: the environment
variable that holds its key (:func:`key_env`; the variable's NAME, never its value) and
the account label (:func:`account_of`) the cluster-wide rate limit is kept by
(:mod:`milo_ray.llm.rate_limit`). Plain functions over a model config or its mapping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Providers litellm refuses to call without some key, even for a local server, and the
# environment variable litellm itself reads for each when none is named.
PROVIDER_KEY_ENV = {"openai": "OPENAI_API_KEY", "hosted_vllm": "HOSTED_VLLM_API_KEY",
                    "anthropic": "ANTHROPIC_API_KEY", "azure": "AZURE_API_KEY", "groq": "GROQ_API_KEY",
                    "mistral": "MISTRAL_API_KEY", "together_ai": "TOGETHERAI_API_KEY",
                    "openrouter": "OPENROUTER_API_KEY", "deepseek": "DEEPSEEK_API_KEY", "gemini": "GEMINI_API_KEY"}


def _field(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, Mapping) or hasattr(cfg, "get") else getattr(cfg, name, default)


def key_env(cfg: Any) -> str | None:
    """The environment variable holding ``cfg``'s key: ``api_key_env`` when given, else the
    variable litellm reads for the solver's provider (``OPENAI_API_KEY`` for ``openai/``...),
    else None (a provider that authenticates otherwise, e.g. ``bedrock/`` through AWS
    credentials)."""
    name = _field(cfg, "api_key_env")
    if name:
        return str(name)
    return PROVIDER_KEY_ENV.get(str(_field(cfg, "solver") or "").split("/", 1)[0])


def account_of(cfg: Any) -> str:
    """The provider account ``cfg``'s calls are billed to and limited on, as a label:
    ``<provider>|<key variable>|<api base>`` -- the litellm provider of ``solver``, the NAME
    of the variable holding the key (:func:`key_env`; never its value), the endpoint (``-``
    where the provider's default). Two configs that differ only in temperature, prices or
    the provider's model share it."""
    solver = str(_field(cfg, "solver") or "")
    provider = solver.split("/", 1)[0] if "/" in solver else (solver or str(_field(cfg, "id") or ""))
    if not provider:
        raise ValueError("model.rpm/model.tpm: the model has neither solver nor id to find its provider account by")
    base = str(_field(cfg, "api_base") or "").rstrip("/") or "-"
    return f"{provider}|{key_env(cfg) or '-'}|{base}"
