"""What one agent call cost: the unit of the ``agent_calls`` ledger.

Every search-side agent call (mutator, orchestrator, judge, optimizer, embedder) and
every solver call reports an :class:`AgentUsage`. ``cost_usd`` is None when nobody
can price the call (an unpriced model): unknown is never recorded as free. Offline
agents are free: zero tokens, ``cost_usd == 0.0``, and the seconds they really took.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from milo_ray.store.schema import AGENT_ROLES as ROLES  # noqa: F401  (re-exported: the roles of a call)

T = TypeVar("T")


@dataclass(frozen=True)
class AgentUsage:
    """Spend of one call. ``retries``: transport retries inside the call (429, 5xx,
    dropped connections); ``error``: why the call produced nothing usable, if so."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0
    seconds: float = 0.0
    retries: int = 0
    error: str | None = None

    def __post_init__(self) -> None:
        if self.input_tokens < 0 or self.output_tokens < 0:
            raise ValueError(f"AgentUsage: token counts must be >= 0 (got {self.input_tokens}, {self.output_tokens})")
        if self.cost_usd is not None and self.cost_usd < 0:
            raise ValueError(f"AgentUsage: cost_usd={self.cost_usd} must be >= 0 or None (unknown)")

    @property
    def tokens(self) -> int:
        return int(self.input_tokens) + int(self.output_tokens)

    def with_seconds(self, seconds: float) -> "AgentUsage":
        """The same usage with the caller's wall-clock measurement when the agent gave none."""
        return self if self.seconds > 0 else replace(self, seconds=float(seconds))

    def with_error(self, error: str | None) -> "AgentUsage":
        return replace(self, error=error)


@dataclass(frozen=True)
class AgentReply(Generic[T]):
    """An agent's answer and what producing it cost (judge verdicts, orchestrator
    decisions). Mutations return :class:`~milo_ray.agents.protocols.MutationResult`,
    which carries its own usage."""

    output: T
    usage: AgentUsage = AgentUsage()


def reply_parts(reply: Any) -> tuple[Any, AgentUsage]:
    """(output, usage) of an :class:`AgentReply`. A bare output is accepted from
    agents written against the older protocol; its cost is unknown (None)."""
    if isinstance(reply, AgentReply):
        return reply.output, reply.usage
    return reply, AgentUsage(cost_usd=None)
