"""The model behind one search role (mutator, orchestrator, judge, optimizer), through
the same litellm client, retries, shared rate limit and pricing as the solver.

Owns :class:`RoleLLM` (one role's model settings, checked with errors that name the
field), :func:`chat_model` (its LangChain chat model, built by
:func:`milo_ray.llm.client.build_chat_model`), :func:`metered_chat_model` (the chat
model of one agent call that reaches the role's model only through a model gateway, and
what the gateway metered for it), :func:`ask` (one chat call and what it cost) and
:func:`total_usage` (the spend of many calls as one ``agent_calls`` row).

``backend=litellm`` gives every role the same model (``backend.model``,
``backend.api_base``, ``backend.api_key_env``...); a role's spec may override any field
under its own ``llm`` (e.g. ``backend.agents.judge.llm.model=openai/NAME``).

Offline agents never import this module's litellm side: :func:`chat_model` imports it
on first use.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterator, Mapping, Protocol, Sequence

from milo_ray.llm.usage import AgentUsage
from milo_ray.core.llm_endpoint import LLMEndpoint
from milo_ray.core.problems import Problem, raise_invalid


@dataclass(kw_only=True)
class RoleLLM(LLMEndpoint):
    """One search role's model: ``model`` is the litellm model string; the endpoint fields
    mean what they mean for the solver (:class:`~milo_ray.core.llm_endpoint.LLMEndpoint`,
    the one type both use). ``context_tokens``: how many tokens the model reads in one call
    (a judge condenses a longer trajectory to fit)."""

    model: str
    request_timeout_s: float | None = 600.0
    context_tokens: int = 128_000

    @classmethod
    def of(cls, spec: "RoleLLM | Mapping[str, Any] | None", *, where: str) -> "RoleLLM":
        """A checked RoleLLM from a spec mapping; ``where`` names the config node in
        errors (e.g. ``backend.agents.judge.llm``); ``ValueError``, one line per problem."""
        if isinstance(spec, RoleLLM):
            return spec
        if spec is None or not isinstance(spec, Mapping):
            raise ValueError(f"{where}: expected a mapping with at least `model` (a litellm model string such as "
                             f"openai/NAME), got {type(spec).__name__}; set backend.model=... with backend=litellm")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(known)}")
        if not spec.get("model"):
            raise ValueError(f"{where}.model: not set; give a litellm model string such as openai/NAME "
                             "(backend.model=... sets it for every role)")
        llm = cls(**{k: v for k, v in spec.items()})
        problems = llm.endpoint_problems(where)
        if not isinstance(llm.context_tokens, int) or llm.context_tokens < 1000:
            problems.append(Problem(f"{where}.context_tokens={llm.context_tokens}", "must be an integer >= 1000"))
        raise_invalid(problems)
        return llm

    def model_config(self) -> dict[str, Any]:
        """The mapping :mod:`milo_ray.llm.client` reads (it names the model ``solver``)."""
        d = asdict(self)
        d.pop("context_tokens")
        d["solver"] = d["id"] = d.pop("model")
        return d


def chat_model(llm: RoleLLM, *, callbacks: list[Any] | None = None) -> Any:
    """The role's LangChain chat model: config retries with full-jitter backoff, the
    shared per-model rate limit, the key from the environment variable the config names."""
    from milo_ray.llm.client import build_chat_model

    return build_chat_model(llm.model_config(), callbacks=callbacks)


class MeteringGateway(Protocol):
    """A model gateway as an in-process agent uses it
    (:class:`milo_ray.boundary.gateway.mutation.MutationGateway`): ``local_url(api)`` is
    its OpenAI-compatible ``http://.../v1`` base, ``issue_token`` a grant for one agent
    call, ``revoke_token`` ends it (the gateway refuses it from then on), ``metered`` and
    ``calls`` are what its calls cost as the gateway recorded them."""

    def local_url(self, api: str = "openai") -> str: ...

    def issue_token(self, *, role: str, caller: str) -> str: ...

    def revoke_token(self, token: str) -> None: ...

    def metered(self, token: str) -> dict[str, Any] | None: ...

    def calls(self, token: str) -> list[dict[str, Any]]: ...


class MeteredCall:
    """One agent call's chat model (``model``: keyless, holding only ``token``) and its
    spend as the gateway metered it."""

    def __init__(self, gateway: MeteringGateway, token: str, model: Any) -> None:
        self.gateway, self.token, self.model = gateway, token, model

    def usage(self, *, seconds: float, error: str | None = None) -> AgentUsage:
        """The call's usage from the gateway's ledger: tokens, USD (None when a call is
        unpriced or was still in flight when read), retries; the caller's wall clock."""
        m = self.gateway.metered(self.token) or {}
        return AgentUsage(int(m.get("input_tokens") or 0), int(m.get("output_tokens") or 0),
                          m.get("cost_usd") if m else None, seconds=float(seconds),
                          retries=int(m.get("retries") or 0), error=error)

    def calls(self) -> list[dict[str, Any]]:
        """Every model call of the token (``SolverCall.as_dict()`` rows), as metered."""
        return self.gateway.calls(self.token)


@contextlib.contextmanager
def metered_chat_model(llm: RoleLLM, gateway: MeteringGateway, *, role: str, caller: str) -> Iterator[MeteredCall]:
    """The role's chat model for one agent call, reaching its model only through
    ``gateway`` with a token issued for this call (the chat model never holds the key or
    the endpoint; see :func:`milo_ray.llm.client.gateway_chat_model`). The token is
    revoked when the block ends, so whatever the agent left running is refused from then
    on; read the usage after the block. Every search agent that runs a model loop in this
    process builds its chat model here."""
    from milo_ray.llm.client import gateway_chat_model

    token = gateway.issue_token(role=role, caller=caller)
    try:
        model = gateway_chat_model(llm.model_config(), base_url=gateway.local_url("openai"), token=token)
        yield MeteredCall(gateway, token, model)
    finally:
        gateway.revoke_token(token)


def recorder(llm: RoleLLM) -> Any:
    """A callback recorder of the role's calls (tokens, USD, retries, errors per call)."""
    from milo_ray.llm.solver_calls import SolverCallRecorder

    return SolverCallRecorder(llm.model_config())


def total_usage(calls: Sequence[Any], *, seconds: float, error: str | None = None) -> AgentUsage:
    """The spend of several chat calls (``SolverCall`` s) as one usage: tokens and retries
    summed, USD summed (None as soon as one call is unpriced), the caller's wall clock."""
    tin = sum(c.usage.input_tokens for c in calls)
    tout = sum(c.usage.output_tokens for c in calls)
    costs = [c.usage.cost_usd for c in calls]
    cost = None if any(c is None for c in costs) else float(sum(costs))
    return AgentUsage(tin, tout, cost, seconds=float(seconds), retries=sum(c.usage.retries for c in calls),
                      error=error)


def ask(llm: RoleLLM, messages: Sequence[Any], *, model: Any = None) -> tuple[str | None, AgentUsage]:
    """One chat call: the answer's text (None when the call failed) and its usage; a
    failed call (after the config's retries) is an usage with ``error``, never an
    exception. ``messages``: LangChain messages or (role, text) pairs. ``model``: a chat
    model already built for ``llm`` (agents keep theirs between calls)."""
    rec = recorder(llm)
    model = model if model is not None else chat_model(llm)
    t0 = time.monotonic()
    try:
        answer = model.invoke(list(messages), config={"callbacks": [rec]})
    except Exception as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
        return None, total_usage(rec.calls(), seconds=time.monotonic() - t0, error=why)
    text = answer.content if isinstance(answer.content, str) else _text_of(answer.content)
    return text, total_usage(rec.calls(), seconds=time.monotonic() - t0)


def _text_of(content: Any) -> str:
    """The text of a multi-part message content."""
    parts = []
    for p in content or []:
        if isinstance(p, str):
            parts.append(p)
        elif isinstance(p, Mapping) and p.get("type") == "text":
            parts.append(str(p.get("text", "")))
    return "".join(parts)
