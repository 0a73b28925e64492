"""Evaluating one harness for MILO: rollouts through the RolloutScheduler, the
aggregates the lineage stores (accuracy, costs, behavior, fitness) and the on-disk
harness directory ``<run_dir>/workspace/harnesses/<harness_id>/{harness.py, diff.patch, evidence/}``
(outside the store's table directories, so ``<run_dir>/harnesses/`` holds only Parquet parts).

Owns :class:`Evaluation` and :func:`evaluate`, and the workspace files beside them (a
mutation's ``round-<r>.request.json``: what its mutator was given); no policy lives here.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from milo_ray.agents.protocols import MutationRequest
from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.harness.evidence import write_evidence_dir
from milo_ray.harness.model import Harness
from milo_ray.kernels.pareto import fitness_vectors
from milo_ray.milo.lineage import COST_AXES


@dataclass
class Evaluation:
    """Aggregates over tasks and k rollouts: ``accuracy`` = mean score, ``costs`` = mean
    output tokens and agent seconds per rollout, ``behavior`` = per-task pass rate
    (mean score), ``fitness`` = F(h) (accuracy, token economy, time economy)."""

    accuracy: float
    costs: dict[str, float]
    behavior: dict[str, float]
    fitness: list[float]
    results: list[RolloutResult]


def aggregate(results: Sequence[RolloutResult], task_ids: Sequence[str], caps: Sequence[float]) -> Evaluation:
    per_task: dict[str, list[float]] = defaultdict(list)
    for r in results:
        per_task[r.task_id].append(float(r.score))
    behavior = {t: float(np.mean(per_task[t])) if per_task[t] else 0.0 for t in task_ids}
    acc = float(np.mean([behavior[t] for t in task_ids])) if task_ids else 0.0
    n = max(len(results), 1)
    costs = {
        "output_tokens": float(sum(r.output_tokens for r in results) / n),
        "seconds": float(sum(r.latency_s for r in results) / n),
    }
    F = fitness_vectors(np.array([acc]), np.array([[costs[a] for a in COST_AXES]]), np.asarray(caps, dtype=float))
    return Evaluation(acc, costs, behavior, [float(x) for x in F[0]], list(results))


def requests_for(harness_id: str, task_ids: Sequence[str], k: int, *, seed: int, split: str, round: int,
                 stage: str, group: str) -> list[RolloutRequest]:
    return [
        RolloutRequest(harness_id=harness_id, task_id=t, rollout_idx=i, seed=seed, split=split, method="milo",
                       round=round, stage=stage, group=group)
        for t in task_ids
        for i in range(k)
    ]


async def evaluate(sched: Any, harness: Harness, task_ids: Sequence[str], k: int, *, seed: int, split: str,
                   round: int, stage: str, group: str, caps: Sequence[float]) -> Evaluation:
    """Run (or fetch from the cache) k rollouts per task; raises BudgetExceeded untouched."""
    sched.add_harness(harness)
    reqs = requests_for(harness.harness_id, task_ids, k, seed=seed, split=split, round=round, stage=stage, group=group)
    results = await sched.arun(reqs)
    return aggregate(results, task_ids, caps)


def harness_dir(run_dir: Path, harness_id: str) -> Path:
    return Path(run_dir) / "workspace" / "harnesses" / harness_id


def write_harness_dir(run_dir: Path, harness: Harness, patch: str | None,
                      parent_id: str = "") -> tuple[Path, Path | None]:
    """``harness.py`` (+ extra files) and the diff vs the tree parent on disk: (dir, diff path).

    The diff is ``diff.patch``; the same harness reached again from another parent
    (on another island) gets ``diff-from-<parent>.patch``, so every node's diff path
    shows that node's own edit.
    """
    d = harness_dir(run_dir, harness.harness_id)
    harness.write_to(d)
    if patch is None:
        return d, None
    path = d / "diff.patch"
    if path.exists() and path.read_text() != patch:
        path = d / f"diff-from-{parent_id[:12] or 'parent'}.patch"
    if not path.exists():
        path.write_text(patch)
    return d, path


def write_evidence(run_dir: Path, harness: Harness, results: Sequence[RolloutResult], tasks: Sequence[Any],
                   store: Any) -> Path:
    """The evidence directory mutators read (report.md, ctrf.json, traces/...)."""
    path = harness_dir(run_dir, harness.harness_id) / "evidence"

    return Path(write_evidence_dir(path, harness, list(results), list(tasks), store))


def empty_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)


def write_request_record(path: Path, req: MutationRequest, mutator: str) -> None:
    """What a mutator was given, beside its workspace: the ablation rungs differ only in
    this (evidence or none, tree or flat archive), and a person debugging a mutator
    reads it first."""
    evidence = sorted(str(p.relative_to(req.evidence_dir)) for p in Path(req.evidence_dir).rglob("*") if p.is_file())
    path.write_text(json.dumps({
        "mutator": mutator, "parent_dir": str(req.parent_dir), "evidence_dir": str(req.evidence_dir),
        "evidence_files": evidence, "memory_path": req.context.get("memory_path"), "seed": req.seed,
        "context": {k: v for k, v in req.context.items() if k != "memory_path"},
    }, indent=1, default=str))
