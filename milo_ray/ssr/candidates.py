"""Multiscale candidate generation (SSR §4.2): independent edits of one frozen parent.

Each candidate gets its own evidence set, its own on-disk evidence directory (only the
trajectories of its records, read on demand), its own derived seed and an identical
request otherwise. The optimizer runs through the shared mutation runner
(:mod:`milo_ray.search.mutation`): a Ray task per candidate (threads without Ray),
the optimizer built once per worker process, each call under the time cap, the child
validated in a fresh subprocess inside the same task, so generation and validation
of different candidates overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from milo_ray.agents.protocols import MutationRequest
from milo_ray.llm.usage import AgentUsage
from milo_ray.harness.model import Harness
from milo_ray.search.mutation import MutationOutcome, ValidationOptions, run_mutations

DEFAULT_TIME_CAP_S = 2700.0


@dataclass(frozen=True)
class CandidateJob:
    """What one candidate's generation needs (small and picklable)."""

    index: int
    scale: int
    request: MutationRequest
    # The journal ticket of this optimizer call (role_journal.RoleCallTicket; None: none).
    ticket: Any = None


@dataclass
class CandidateOutcome:
    """A generated child (or why there is none) and its validation verdict."""

    index: int
    scale: int
    seed: int
    child: Harness | None
    error: str | None
    report: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    cost_usd: float | None = 0.0
    retries: int = 0
    # Whether the usage is the optimizer's own account of its model calls (MutationOutcome.metered).
    metered: bool = False

    @property
    def usage(self) -> AgentUsage:
        """What the optimizer call cost (recorded in ``agent_calls`` by the loop)."""
        return AgentUsage(self.input_tokens, self.output_tokens, self.cost_usd, self.seconds, self.retries,
                          None if self.child is not None else self.error)

    @property
    def valid(self) -> bool:
        return self.child is not None and self.error is None

    @classmethod
    def of(cls, job: CandidateJob, out: MutationOutcome) -> "CandidateOutcome":
        if out.error is not None:
            error = out.error
        elif out.validation_error is None or out.validation_error.startswith("duplicate:"):
            error = out.validation_error
        else:
            error = f"validation: {out.validation_error}"
        u = out.usage
        return cls(job.index, job.scale, job.request.seed, out.child, error, out.report, u.input_tokens, u.output_tokens,
                   u.seconds, u.cost_usd, u.retries, out.metered)


def use_ray() -> bool:
    """Candidates go to Ray tasks whenever the driver is connected to Ray."""
    import ray

    return ray.is_initialized()


def generate_candidates(optimizer_spec: Any, jobs: Sequence[CandidateJob], *, forbidden: Sequence[str],
                        timeout_s: float, max_concurrent: int = 4,
                        time_cap_s: float = DEFAULT_TIME_CAP_S, scope: str | None = None,
                        env: dict[str, str] | None = None, entry: str = "build_agent",
                        sandbox: dict[str, Any] | None = None) -> list[CandidateOutcome]:
    """Generate every candidate in parallel; outcomes in ``jobs`` order. ``timeout_s``
    limits each validation subprocess, ``time_cap_s`` each optimizer call; ``env``: the
    optimizer's key variables for its Ray tasks; ``entry``: the artifact's entry function
    (``build_agent`` or ``optimize``) children are validated against; ``sandbox``: the run's
    sandbox config, in which kind of sandbox they are."""
    if not jobs:
        return []
    outs = run_mutations(optimizer_spec, [j.request for j in jobs], time_cap_s=time_cap_s,
                         validation=ValidationOptions(tuple(forbidden), timeout_s, entry=entry, sandbox=sandbox), max_concurrent=max_concurrent,
                         use_ray=use_ray(), scope=scope, env=env, tickets=[j.ticket for j in jobs])
    return [CandidateOutcome.of(j, o) for j, o in zip(jobs, outs)]
