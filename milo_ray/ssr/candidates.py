"""Multiscale candidate generation (SSR §4.2): independent edits of one frozen parent.

Each candidate gets its own evidence set, its own on-disk evidence directory (only the
trajectories of its records, read on demand), its own derived seed and an identical
request otherwise; the optimizer runs as a Ray task per candidate (a thread when Ray
is not initialized), and the child is validated in a fresh subprocess inside that
same task, so generation and validation of different candidates overlap.

The optimizer is shipped as its ``_target_`` config (or a picklable object) and built
inside the worker. Paths in the request must be visible to the worker: on a cluster
the run directory is expected on a shared filesystem.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.agents.usage import AgentUsage
from milo_ray.harness.model import ENTRY_FILE, Harness


@dataclass(frozen=True)
class CandidateJob:
    """What one candidate's generation needs (small and picklable)."""

    index: int
    scale: int
    request: MutationRequest


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

    @property
    def usage(self) -> AgentUsage:
        """What the optimizer call cost (recorded in ``agent_calls`` by the loop)."""
        return AgentUsage(self.input_tokens, self.output_tokens, self.cost_usd, self.seconds, self.retries,
                          None if self.child is not None else self.error)

    @property
    def valid(self) -> bool:
        return self.child is not None and self.error is None


def build_agent(spec: Any) -> Any:
    """A ``_target_`` dict is instantiated with Hydra; anything else is used as is."""
    if isinstance(spec, dict) and "_target_" in spec:
        from hydra.utils import instantiate

        return instantiate(spec, _convert_="all")
    if spec is None:
        raise ValueError("agent spec is missing (expected a `_target_` dict under backend.agents)")
    return spec


def generate_one(optimizer_spec: Any, job: CandidateJob, forbidden: Sequence[str], timeout_s: float) -> CandidateOutcome:
    """Run the optimizer on one request, read the child back, validate it. Never raises
    for a bad child: the reason lands in ``error``."""
    t0 = time.monotonic()
    req = job.request
    out = CandidateOutcome(job.index, job.scale, req.seed, None, None)
    try:
        optimizer = build_agent(optimizer_spec)
        res: MutationResult = optimizer.mutate(req)
    except Exception as e:  # an optimizer crash is a failed candidate, not a failed round
        out.error = f"optimizer crashed: {type(e).__name__}: {e}"[:2000]
        out.seconds = time.monotonic() - t0
        return out
    out.report, out.input_tokens, out.output_tokens = res.report, res.input_tokens, res.output_tokens
    child = res.child
    if child is None and res.error is None and (Path(req.workdir) / ENTRY_FILE).is_file():
        child = Harness.from_dir(req.workdir, name=f"{req.parent.name}-c{job.index}")
    if res.error is not None or child is None:
        out.error = res.error or "optimizer returned no child harness"
        out.seconds = time.monotonic() - t0
        return out
    out.child = child
    if child.harness_id == req.parent.harness_id:
        out.error = "duplicate: identical to the parent"
    else:
        ok, reason = _validate_cached(child, tuple(forbidden), timeout_s)
        if not ok:
            out.error = f"validation: {reason}"
    out.seconds = time.monotonic() - t0
    return out


# Validation is a pure function of the harness content and the options, and a
# subprocess start costs seconds; optimizers often re-propose an identical child in a
# later round, so verdicts are remembered per process.
_VERDICTS: dict[tuple[str, int, float], tuple[bool, str | None]] = {}


def _validate_cached(child: Harness, forbidden: tuple[str, ...], timeout_s: float) -> tuple[bool, str | None]:
    from milo_ray.harness.validate import validate

    key = (child.harness_id, hash(forbidden), float(timeout_s))
    if key not in _VERDICTS:
        v = validate(child, forbidden_fragments=forbidden, timeout_s=timeout_s)
        _VERDICTS[key] = (v.ok, v.reason)
    return _VERDICTS[key]


_remote = None


def _remote_fn():
    global _remote
    if _remote is None:
        import ray

        _remote = ray.remote(num_cpus=1, max_retries=1)(generate_one)
    return _remote


def use_ray() -> bool:
    """Candidates go to Ray tasks whenever the driver is connected to Ray."""
    import ray

    return ray.is_initialized()


def generate_candidates(optimizer_spec: Any, jobs: Sequence[CandidateJob], *, forbidden: Sequence[str],
                        timeout_s: float, max_concurrent: int = 4) -> list[CandidateOutcome]:
    """Generate every candidate in parallel; outcomes in ``jobs`` order."""
    if not jobs:
        return []
    if not use_ray():
        with ThreadPoolExecutor(max_workers=max(1, min(max_concurrent, len(jobs)))) as pool:
            return list(pool.map(lambda j: generate_one(optimizer_spec, j, forbidden, timeout_s), jobs))
    import ray

    fn = _remote_fn()
    forb = ray.put(tuple(forbidden))
    spec = ray.put(optimizer_spec)
    results: dict[int, CandidateOutcome] = {}
    pending: dict[Any, CandidateJob] = {}
    queue = list(jobs)
    while queue or pending:
        while queue and len(pending) < max_concurrent:
            job = queue.pop(0)
            pending[fn.remote(spec, job, forb, timeout_s)] = job
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            job = pending.pop(ref)
            try:
                results[job.index] = ray.get(ref)
            except Exception as e:  # worker died twice: the candidate is lost, the round goes on
                results[job.index] = CandidateOutcome(job.index, job.scale, job.request.seed, None,
                                                      f"generation task failed: {type(e).__name__}: {e}"[:2000])
    return [results[j.index] for j in jobs]
