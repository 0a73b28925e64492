"""Recording MILO nodes: building a :class:`LineageNode` with its on-disk harness
directory and evidence, its ``milo.node`` event, and the ``harnesses`` table rows
derived from the events.

Owns :func:`build_node`, :func:`record_node`, :func:`write_missing_rows` and the key
of MILO's rows (:func:`node_row_key`: one row per lineage node, one per seed left
without an island), which the run's :class:`~milo_ray.search.recording.HarnessRecorder`
(``run.harness_rows``, the one writer of ``harnesses`` rows) stores each row under.
The ``milo.node`` event is the record; the ``harnesses`` row is written after it, so a
kill in between leaves a row :func:`write_missing_rows` adds on resume (once).

A node's on-disk files live under the run's ``workspace/``, which the store does not
hold (a run resumed from a bucket, or moved to another directory, has none of it, and
its events name the old absolute paths): :func:`rebased` points a recorded node's
paths at the current run directory, and :func:`node_files` rewrites a node's harness
directory (from its source blob) and evidence (from its stored rollouts) before use.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from milo_ray.core.rollouts import cache_key
from milo_ray.harness.diff import diff
from milo_ray.harness.model import Harness
from milo_ray.milo.evaluate import Evaluation, harness_dir, write_evidence, write_harness_dir
from milo_ray.milo.events import NodeRecorded
from milo_ray.milo.island import Island
from milo_ray.milo.island_actor import ask
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.state import MiloState
from milo_ray.milo.view import PopulationView


def build_node(run: PopulationView, *, node_id: str, h: Harness | None, island: int, round: int, origin: str,
               parent: LineageNode | None, ev: Evaluation | None, **labels: Any) -> LineageNode:
    """The node of ``h`` (None: a mutation that produced no harness), its harness
    directory (source + diff vs the parent) and, when evaluated, its evidence dir."""
    n = LineageNode(node_id=node_id, harness_id=h.harness_id if h else "", island=island, round=round,
                    origin=origin, parent=parent.node_id if parent else None, name=h.name if h else "",
                    search_version=run.state.version)
    if h is not None:
        patch = diff(run.harness(parent), h) if parent else None
        hd, diff_path = write_harness_dir(run.run_dir, h, patch.patch if patch else None,
                                          parent_id=parent.harness_id if parent else "")
        n.harness_path, n.source_ref = str(hd / "harness.py"), run.ctx.store.put_harness_source(dict(h.files))
        if patch:
            n.diff_path, n.diff_added, n.diff_deleted = str(diff_path), patch.added, patch.deleted
        run.remember(h)
    if ev is not None:
        tasks = [run.ctx.benchmark.task(t) for t in run.state.search_tasks]
        ev_dir = write_evidence(run.run_dir, h, ev.results, tasks, run.ctx.store)
        n.accuracy, n.costs, n.behavior, n.fitness = ev.accuracy, ev.costs, ev.behavior, ev.fitness
        n.evidence_path = str(ev_dir)
    for k, v in labels.items():
        if not hasattr(n, k):
            raise ValueError(f"LineageNode has no field {k!r}")
        setattr(n, k, v)
    return n


def rebased(run_dir: Path, node: LineageNode) -> LineageNode:
    """``node`` with its recorded paths under ``run_dir``. A node's files always sit in
    its harness's directory (``harness.py``, its diff file, ``evidence/``), so the new
    path follows from the harness id and the old file name, whatever directory the run
    was recorded in."""
    if not node.harness_id:
        return node
    d = harness_dir(run_dir, node.harness_id)
    return replace(node, harness_path=str(d / Path(node.harness_path).name) if node.harness_path else None,
                   diff_path=str(d / Path(node.diff_path).name) if node.diff_path else None,
                   evidence_path=str(d / "evidence") if node.evidence_path else None)


def node_files(run: PopulationView, node: LineageNode) -> tuple[Path, Path | None]:
    """(harness directory, evidence directory or None) of a recorded node under the current
    run directory, rewritten first when missing: the harness from its source blob, the
    evidence from the node's stored search rollouts (the tasks of its latest evaluation,
    ``k_search`` each; the rollouts are read, never run again)."""
    h = run.harness(node)
    d = harness_dir(run.run_dir, node.harness_id)
    if not (d / "harness.py").is_file():
        h.write_to(d)
    if not node.evidence_path:
        return d, None
    ev_dir = d / "evidence"
    if not ev_dir.is_dir():
        ctx, tasks = run.ctx, list(node.behavior or {})
        keys = [cache_key(h.harness_id, t, i, ctx.model_id, ctx.seed)
                for t in tasks for i in range(int(run.cfg.k_search))]
        results = list(ctx.store.get_rollouts(keys).values())
        write_evidence(run.run_dir, h, results, [ctx.benchmark.task(t) for t in tasks], ctx.store)
    return d, ev_dir


def record_node(run: PopulationView, node: LineageNode) -> None:
    """Record a node: its ``milo.node`` event, then its ``harnesses`` row."""
    run.emit(NodeRecorded(node), island=node.island, round=node.round, harness_id=node.harness_id or None)
    run.harness_rows.record(None, **harness_row(run.state, node))


def harness_row(state: MiloState, n: LineageNode) -> dict[str, Any]:
    return {
        "harness_id": n.harness_id or f"none:{n.node_id}", "name": n.name, "island": n.island,
        "parent_id": state.harness_of(n.parent), "co_parent_id": state.harness_of(n.co_parent),
        "round": n.round, "origin": n.origin, "mutator": n.mutator, "admitted": bool(n.admitted),
        "verdict_reason": n.verdict_reason, "fitness": n.fitness, "delta_hv": n.delta_hv,
        "diff_added": n.diff_added, "diff_deleted": n.diff_deleted, "source_ref": n.source_ref,
        "validation_error": n.validation_error, "created_at": time.time(),
        "extra": {"node_id": n.node_id, "mutation": n.mutation, "accuracy": n.accuracy, "costs": n.costs,
                  "search_version": n.search_version},
    }


def node_row_key(row: dict[str, Any]) -> tuple[str, str]:
    """(node id, or "" for a seed without an island; harness id) of a ``harnesses`` row,
    as written or as read back (``extra`` is JSON text in the store)."""
    extra = row.get("extra") or {}
    extra = json.loads(extra) if isinstance(extra, str) else extra
    return str(extra.get("node_id") or ""), row["harness_id"]


async def write_missing_rows(run: PopulationView) -> None:
    """The ``harnesses`` rows the events imply and the store lacks: a node recorded
    just before a kill, or the seeds left without an island when the kill came right
    after ``milo.init``. Rows already stored are never written twice (the recorder
    knows every stored key). The islands hold their nodes as recorded."""
    state, rows = run.state, run.harness_rows
    recorded = await asyncio.gather(*(ask(state.islands[j], Island.recorded_nodes) for j in sorted(state.islands)))
    for n in (n for nodes in recorded for n in nodes):
        rows.record(None, **harness_row(state, n))
    placed = {i for members in state.init_members.values() for _, i in members}
    K = len(state.init_members)
    for i, s in enumerate(state.seed_scores):
        if i in placed:
            continue
        rows.record(run.seeds[i], round=0, origin="seed", admitted=False,
                    verdict_reason=f"not among the {K} most behavior-dissimilar seeds: no island",
                    fitness=s.fitness, created_at=time.time(), extra={"accuracy": s.accuracy, "costs": s.costs})
