"""Test doubles for the MILO loop: a seeded mechanism-adding mutator and a scripted
orchestrator that plays a fixed sequence of decisions."""

from __future__ import annotations

from typing import Any

import numpy as np

from milo_ray.agents.orchestrators.offline import OfflineOrchestrator
from milo_ray.agents.protocols import MutationRequest, MutationResult


class AddMechanismMutator:
    """Adds one random catalog mechanism the parent lacks; every ``fail_every``-th seed fails."""

    def __init__(self, personality: str = "plain", fail_every: int = 0) -> None:
        self.name = personality
        self.fail_every = fail_every

    def mutate(self, req: MutationRequest) -> MutationResult:
        from milo_ray.harness.mechanisms import MECHANISMS, add_mechanism, detect_mechanisms

        if self.fail_every and req.seed % self.fail_every == 0:
            return MutationResult(None, error="scripted failure")
        rng = np.random.default_rng(req.seed)
        have = detect_mechanisms(req.parent.source)
        cands = sorted(m for m in MECHANISMS if m not in have)
        if not cands:
            return MutationResult(None, error="nothing left to add")
        m = cands[int(rng.integers(len(cands)))]
        try:
            src = add_mechanism(req.parent.source, m)
        except Exception as e:
            return MutationResult(None, error=str(e))
        return MutationResult(req.parent.with_source(src), report=f"add {m} [{self.name}]")


class ScriptedOrchestrator(OfflineOrchestrator):
    """Returns ``script[i]`` on the i-th call (callables get the state); grafts like the offline one."""

    name = "scripted"
    calls: list[dict[str, Any]] = []

    def __init__(self, script: str) -> None:
        super().__init__()
        # Grafts build their own copy in a Ray worker, where no test registered the script
        # (only decide(), on the driver, reads it).
        self.script = list(SCRIPTS.get(script, ()))
        self.i = 0

    def decide(self, snapshot_markdown: str, state: dict[str, Any], seed: int) -> dict[str, Any]:
        step = self.script[min(self.i, len(self.script) - 1)]
        self.i += 1
        d = step(state) if callable(step) else dict(step)
        ScriptedOrchestrator.calls.append({"trigger": state["trigger"], "decision": d, "snapshot": snapshot_markdown})
        return d


# Named scripts (Hydra configs cannot carry callables); tests register theirs here.
SCRIPTS: dict[str, list[Any]] = {}


class TokenMutator(AddMechanismMutator):
    """An :class:`AddMechanismMutator` that reports ``tokens`` output tokens per call
    (a known spend for per-role cap tests)."""

    def __init__(self, personality: str = "plain", tokens: int = 1000) -> None:
        super().__init__(personality)
        self.tokens = int(tokens)

    def mutate(self, req: MutationRequest) -> MutationResult:
        from dataclasses import replace

        from milo_ray.llm.usage import AgentUsage

        return replace(super().mutate(req), usage=AgentUsage(output_tokens=self.tokens))
