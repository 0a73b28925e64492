"""A MILO child's way into the population (papers/000 §4.2 stages 2–5): the mutation
request a mutator is given, the child's search evaluation and admission verdict, and
the held-out measurement of admitted harnesses.

Owns :func:`mutation_request`, :func:`admit_child` (validation verdict -> deduplicate
-> evaluate -> judge -> record) and :func:`heldout`. Children are validated by the
shared mutation runner (:mod:`milo_ray.search.mutation`) where they were written.
Mutation children and graft children go through the same :func:`admit_child`.
"""

from __future__ import annotations

import shutil
from typing import Any

from milo_ray.agents.protocols import MutationRequest
from milo_ray.core.seeds import derive_seed
from milo_ray.harness.model import Harness
from milo_ray.milo.evaluate import Evaluation, empty_dir, evaluate, write_request_record
from milo_ray.milo.events import HeldOut
from milo_ray.milo.island import Island
from milo_ray.milo.island_actor import ask
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.records import build_node, node_files, record_node
from milo_ray.milo.view import PopulationView
from milo_ray.search.mutation import MutationOutcome


def group(island: int | str) -> str:
    """The scheduler group of an island's rollouts (``init``/``final`` stay as named)."""
    return f"island-{island}" if isinstance(island, int) else str(island)


async def eval_search(run: PopulationView, h: Harness, *, island: int | str, round: int,
                      tasks: list[str] | None = None) -> Evaluation:
    """k_search rollouts per task of B_search (``tasks``: the initial B_search, before
    ``milo.init`` has put it in the state)."""
    cfg = run.cfg
    tasks = run.state.search_tasks if tasks is None else tasks
    return await evaluate(run.ctx.scheduler, h, tasks, cfg.k_search, seed=run.ctx.seed,
                          split=cfg.search_split, round=round, stage="search", group=group(island),
                          caps=(float(cfg.token_cap), float(cfg.seconds_cap)))


async def eval_val(run: PopulationView, h: Harness, *, island: int | str, round: int) -> Evaluation:
    cfg = run.cfg
    return await evaluate(run.ctx.scheduler, h, run.state.val_tasks, cfg.k_val, seed=run.ctx.seed,
                          split=cfg.val_split, round=round, stage="heldout", group=group(island),
                          caps=(float(cfg.token_cap), float(cfg.seconds_cap)))


async def heldout(run: PopulationView, j: int, node: LineageNode, *, round: int) -> bool:
    """Measure and record a node's held-out score once; whether it was a new island best.

    A node whose score is already recorded (a resumed round) is not measured again;
    island j (which holds the node) says whether the score was a new best. ``node`` is
    current (just built, or read from its island): its ``val_accuracy`` is set exactly
    when its ``milo.heldout`` event was applied, so one question suffices."""
    if node.val_accuracy is None:
        ev = await eval_val(run, run.harness(node), island=j, round=round)
        run.emit(HeldOut(j, node.node_id, ev.accuracy), island=j, round=round, harness_id=node.harness_id)
    gain = await ask(run.state.islands[j], Island.held_out_gain, node.node_id)
    if gain is None:
        raise RuntimeError(f"island {j}: node {node.node_id!r} has a held-out score but no verdict")
    return gain


def mutation_request(run: PopulationView, j: int, r: int, parent: LineageNode, mutator: str,
                     memory_md: str) -> MutationRequest:
    """Round r's request to island j's mutator: the parent, its evidence (agentic mode),
    the island's memory as rendered for it (``memory_md``), a fresh workdir; written
    beside the workdir."""
    cfg = run.cfg
    workdir = run.run_dir / "workspace" / "mutations" / f"island-{j}" / f"round-{r}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    memory_path = workdir.parent / f"round-{r}.memory.md"
    memory_path.write_text(memory_md)
    agentic = cfg.mutator_mode == "agentic"
    parent_dir, evidence = node_files(run, parent)
    if not (agentic and evidence):
        evidence = empty_dir(workdir.parent / "no-evidence")
    req = MutationRequest(
        parent=run.harness(parent), parent_dir=parent_dir, evidence_dir=evidence,
        memory_markdown=memory_md, workdir=workdir, seed=derive_seed(run.ctx.seed, "mutate", j, r),
        context={"mode": cfg.mutator_mode, "memory": cfg.memory_strategy.name, "island": j, "round": r,
                 "parent_node": parent.node_id, "parent_accuracy": parent.accuracy, "parent_costs": parent.costs,
                 "memory_path": str(memory_path),
                 # What the artifact is: an agent harness (build_agent) or an optimizer program (optimize).
                 "artifact_entry": getattr(run.ctx.benchmark, "artifact_entry", "build_agent")},
    )
    write_request_record(workdir.parent / f"round-{r}.request.json", req, mutator)
    return req


def _label(res: MutationOutcome) -> str:
    """The mutator's one-line change label (the first line of its report)."""
    report = (res.report or "").strip()
    return report.splitlines()[0][:200] if report else ""


async def admit_child(run: PopulationView, j: int, r: int, *, node_id: str, parent: LineageNode,
                      res: MutationOutcome, origin: str, mutator: str, co_parent: str | None = None,
                      co_parent_label: dict[str, Any] | None = None) -> LineageNode:
    """Validate, evaluate and judge a mutator's (or graft's) output; record the node.

    A missing, invalid or duplicate child is recorded rejected without a rollout."""
    label = _label(res)
    base = dict(island=j, round=r, origin=origin, parent=parent, mutator=mutator, co_parent=co_parent,
                co_parent_label=co_parent_label)
    if res.child is None:
        n = build_node(run, node_id=node_id, h=None, ev=None, admitted=False, mutation=label or "(no child)",
                       verdict_reason=f"mutator error: {res.error or 'no child'}", **base)
        record_node(run, n)
        return n
    h = res.child
    # Validated where it was written (the shared mutation runner); a child identical to its
    # parent is a duplicate, reported below like any other.
    invalid = res.validation_error if not (res.validation_error or "duplicate:").startswith("duplicate:") else None
    if invalid is not None:
        n = build_node(run, node_id=node_id, h=h, ev=None, admitted=False, mutation=label,
                       validation_error=invalid, verdict_reason=f"invalid child: {invalid}", **base)
        record_node(run, n)
        return n
    island = run.state.islands[j]
    dup = await ask(island, Island.find, h.harness_id)
    if dup is not None:
        n = build_node(run, node_id=node_id, h=h, ev=None, admitted=False, mutation=label,
                       verdict_reason=f"duplicate of {dup} (no behavioral change)", **base)
        record_node(run, n)
        return n
    while True:
        version = run.state.version
        ev = await eval_search(run, h, island=j, round=r)
        async with run.lock:
            if version != run.state.version:
                continue  # the curriculum changed during evaluation: re-fit on the new B_search
            # The lock keeps the admitted set this verdict reads unchanged until the node is recorded.
            verdict = await ask(island, Island.judge, ev.fitness)
            n = build_node(run, node_id=node_id, h=h, ev=ev, admitted=verdict.admitted, delta_hv=verdict.delta_hv,
                           verdict_reason=verdict.reason, mutation=label, **base)
            record_node(run, n)
            return n
