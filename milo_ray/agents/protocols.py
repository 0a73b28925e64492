"""Protocols for the search-side agents. Offline and LLM implementations both satisfy
them, so MILO and SSR never know which kind they drive.

Everything a mutator may read is on disk (parent harness, evidence directory,
lineage snapshot) exactly as an LLM coding agent would see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from milo_ray.llm.usage import AgentReply, AgentUsage
from milo_ray.harness.model import Harness


@dataclass(frozen=True)
class MutationRequest:
    """Inputs of one mutation (MILO §4.1.2) or one SSR candidate edit.

    parent_dir: on-disk copy of the parent harness (``harness.py`` + extra files).
    evidence_dir: report.md, ctrf.json, traces/<task>/trajectory.json, result.json.
    memory_markdown: MILO's lineage snapshot, or SSR's ranked experience records.
    workdir: an empty directory the mutator may write into; the child harness is
    read back from ``workdir/harness.py`` (plus extra files) or returned directly.
    """

    parent: Harness
    parent_dir: Path
    evidence_dir: Path
    memory_markdown: str
    workdir: Path
    seed: int
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MutationResult:
    """A child harness and the agent's short report, or the reason there is none, and
    what the call cost (``usage``; an LLM agent fills it from its responses)."""

    child: Harness | None
    report: str = ""
    error: str | None = None
    usage: AgentUsage = AgentUsage()


@runtime_checkable
class Mutator(Protocol):
    """Writes one child harness. Must not raise for a bad child: return ``error``."""

    name: str

    def mutate(self, request: MutationRequest) -> MutationResult: ...


@dataclass(frozen=True)
class JudgeVerdict:
    """One experience record's judged fields (SSR §4.1); all scores in [0, 1]."""

    w: float
    a: float
    u: float
    summary: str
    suggestions: list[str]
    insights: str = ""


@runtime_checkable
class Judge(Protocol):
    name: str

    def judge(self, trajectory: dict[str, Any], feedback: dict[str, Any], task_id: str) -> AgentReply[Any]:
        """Raw judge output (a JSON object) and its usage. The caller validates the output
        into a JudgeVerdict and re-asks a bounded number of times when it is malformed or
        out of range."""
        ...


@runtime_checkable
class Orchestrator(Protocol):
    """MILO's meta-level agent: reads the population snapshot, returns a decision JSON
    (schema in ``milo_ray.agents.orchestrators.schema``)."""

    name: str

    def decide(self, snapshot_markdown: str, state: dict[str, Any], seed: int) -> AgentReply[dict[str, Any]]:
        """The decision JSON (validated by the caller) and its usage."""
        ...

    def graft(self, request: MutationRequest) -> MutationResult:
        """Write the recombined child of a Graft move: ``request.parent`` is the
        destination island's best; ``request.context`` holds ``co_parent_source`` (the
        donor's best ``harness.py``), ``co_parent_dir`` and the island indices."""
        ...


@runtime_checkable
class Embedder(Protocol):
    model_name: str

    def embed(self, texts: list[str]) -> "Any":
        """float32 array (len(texts), d), rows L2-normalized."""
        ...
