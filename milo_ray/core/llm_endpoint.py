"""How one model is reached: the settings the solver (``model``) and every search role's
``llm`` block share, and their one validation.

``milo_ray.config.schemas.ModelConfig`` (the solver), ``BackendConfig`` (the search roles'
default model) and ``milo_ray.llm.role_llm.RoleLLM`` (one role's model) all extend
:class:`LLMEndpoint`, so a field means the same everywhere and is checked by the same
rule; each names its own config path (``model``, ``backend.agents.judge.llm``) in the
errors, so a message points at the key the person wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from milo_ray.core.problems import Problem

# Prefixes of provider keys (OpenAI/Anthropic, AWS access key ids, GitHub, Slack, Google,
# Hugging Face): a value like these in ``api_key_env`` is a key pasted where the NAME of
# its environment variable belongs, and would end up in the manifest.
KEY_PREFIXES = ("sk-", "sk_", "AKIA", "ASIA", "ghp_", "gho_", "github_pat_", "xoxb-", "xoxp-", "AIza", "hf_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def looks_like_key(name: Any) -> bool:
    """Whether ``name`` (meant to be an environment variable's name) is a key itself."""
    text = str(name)
    return text.startswith(KEY_PREFIXES) or not _ENV_NAME.fullmatch(text)


@dataclass
class LLMEndpoint:
    """The endpoint settings of one model.

    api_base: the endpoint (a LiteLLM proxy, a vLLM server); None: the provider's default.
    api_key_env: the NAME of the environment variable holding the API key (never the key
        itself: the config is stored in the manifest); None: the provider's default variable.
    temperature: sampling temperature (None: not sent, the provider's default).
    max_output_tokens: cap on the output tokens of one call (None: the provider's default).
    request_timeout_s: timeout of one HTTP request in seconds (None: litellm's default); a
        request that times out is retried like a dropped connection.
    max_retries: retries of a failed request (429, 5xx, timeouts, dropped connections) after
        the first attempt; other 4xx answers are never retried. The HTTP client's own retries
        are switched off, so a call sends at most ``max_retries + 1`` requests.
    retry_base_s / retry_max_s: exponential backoff with full jitter between retries: retry
        i (from 1) sleeps uniformly in [0, min(retry_max_s, retry_base_s * 2**(i-1))].
    rpm / tpm: requests and tokens (input + output) per minute allowed on this model's
        provider account (provider, key variable, api base), shared by every run on the
        cluster (one detached Ray actor per account); configs on one account that give
        different limits hold the lower, with a warning; None: this config is not limited.
    usd_per_mtok_input / usd_per_mtok_output: prices in USD per million tokens; None: the
        model is unpriced (a USD cap on it is refused rather than silently never reached).
    """

    api_base: Optional[str] = None
    api_key_env: Optional[str] = None
    temperature: Optional[float] = 0.0
    max_output_tokens: Optional[int] = None
    request_timeout_s: Optional[float] = None
    max_retries: int = 3
    retry_base_s: float = 1.0
    retry_max_s: float = 60.0
    rpm: Optional[int] = None
    tpm: Optional[int] = None
    usd_per_mtok_input: Optional[float] = None
    usd_per_mtok_output: Optional[float] = None

    def endpoint_problems(self, where: str) -> list[Problem]:
        """Every invalid endpoint field, each naming ``<where>.<field>`` and the fix (a key
        given in ``api_key_env`` is never echoed)."""
        out: list[Problem] = []
        if self.api_base is not None and not str(self.api_base).startswith(("http://", "https://")):
            out.append(Problem(f"{where}.api_base={self.api_base!r}", "not a URL",
                               "give an http(s):// URL (or null for the provider's default endpoint)"))
        if self.api_key_env is not None and looks_like_key(self.api_key_env):
            out.append(Problem(f"{where}.api_key_env", "this looks like an API key, not the name of the "
                               "environment variable holding one", "export the key (e.g. OPENAI_API_KEY=...) and set "
                               f"{where}.api_key_env=OPENAI_API_KEY"))
        number = _number_problem
        out += filter(None, [
            number(where, "temperature", self.temperature, low=0.0, high=2.0, nullable=True, rule="must be in [0, 2]"),
            number(where, "max_output_tokens", self.max_output_tokens, low=1, nullable=True, integer=True),
            number(where, "request_timeout_s", self.request_timeout_s, low=0.0, strict=True, nullable=True,
                   rule="must be > 0 seconds (or null)"),
            number(where, "max_retries", self.max_retries, low=0, integer=True),
            number(where, "retry_base_s", self.retry_base_s, low=0.0, rule="must be >= 0 seconds"),
            number(where, "retry_max_s", self.retry_max_s, low=0.0, rule="must be >= 0 seconds"),
            number(where, "rpm", self.rpm, low=1, nullable=True, integer=True,
                   rule="must be an integer >= 1 (or null: unlimited)"),
            number(where, "tpm", self.tpm, low=1, nullable=True, integer=True,
                   rule="must be an integer >= 1 (or null: unlimited)"),
            number(where, "usd_per_mtok_input", self.usd_per_mtok_input, low=0.0, nullable=True,
                   rule="must be >= 0 USD per million tokens (or null)"),
            number(where, "usd_per_mtok_output", self.usd_per_mtok_output, low=0.0, nullable=True,
                   rule="must be >= 0 USD per million tokens (or null)"),
        ])
        if not out and float(self.retry_max_s) < float(self.retry_base_s):
            out.append(Problem(f"{where}.retry_base_s={self.retry_base_s}, {where}.retry_max_s={self.retry_max_s}",
                               "the backoff's cap is below its base", "need 0 <= retry_base_s <= retry_max_s seconds"))
        priced = [p for p in out if ".usd_per_mtok_" in p.key]
        if not priced and (self.usd_per_mtok_input is None) != (self.usd_per_mtok_output is None):
            out.append(Problem(f"{where}.usd_per_mtok_input / {where}.usd_per_mtok_output", "only one price given",
                               "give both prices or neither"))
        return out


def _number_problem(where: str, name: str, value: Any, *, low: float, high: float | None = None,
                    strict: bool = False, nullable: bool = False, integer: bool = False,
                    rule: str | None = None) -> Problem | None:
    """The problem of one numeric field outside its range (or not a number), else None."""
    if rule is None:
        rule = f"must be an integer >= {low:g}" if integer else f"must be >= {low:g}"
        rule += " (or null)" if nullable else ""
    if value is None:
        return None if nullable else Problem(f"{where}.{name}", "missing", rule)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        return Problem(f"{where}.{name}={value!r}", rule)
    if value < low or (strict and value <= low) or (high is not None and value > high):
        return Problem(f"{where}.{name}={value}", rule)
    return None
