"""Driving MILO's orchestrator (papers/000 §4.1.3, Eq. 5–6): build what it sees,
ask it for a decision, validate it, and carry the moves out.

Owns :func:`intervene` (one stall -> diagnosis -> ≤ ``max_moves`` moves) and
:func:`apply_decision`. The orchestrator agent (offline rules or an LLM, behind the
``Orchestrator`` protocol) only decides; everything here is the loop applying the
decision mechanically, except Graft, whose child faces normal admission. Each
diagnosis, move and completion is an ``events`` row, so an intervention interrupted
by a crash is completed on resume from its stored decision.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from milo_ray.agents.orchestrators.schema import DecisionError, validate_decision
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.agents.usage import AgentUsage, reply_parts
from milo_ray.kernels.pareto import task_regret
from milo_ray.milo.evaluate import dumps, write_evidence
from milo_ray.milo.render import render_population
from milo_ray.search.seeds import derive_seed

if TYPE_CHECKING:
    from milo_ray.milo.loop import MiloRun


async def population_regret(run: "MiloRun") -> dict[str, float]:
    """rho(tau) over every admitted harness H+ on the current B_search."""
    rows = []
    for j in sorted(run.islands):
        for n in (await run.islands[j].summary.remote(5))["admitted"]:
            if all(t in n["behavior"] for t in run.search_tasks):
                rows.append([n["behavior"][t] for t in run.search_tasks])
    if not rows:
        return {t: 0.0 for t in run.search_tasks}
    rho = task_regret(np.array(rows))
    return {t: float(x) for t, x in zip(run.search_tasks, rho)}


async def build_inputs(run: "MiloRun", trigger: int | None) -> tuple[str, dict[str, Any]]:
    """The population snapshot markdown and the structured state the orchestrator reads."""
    summaries = {j: await run.islands[j].summary.remote(5) for j in sorted(run.islands)}
    trees = {j: await run.islands[j].render.remote("lineage", run.assignment.get(j)) for j in sorted(run.islands)}
    regret = await population_regret(run)
    md = render_population([(j, summaries[j], trees[j]) for j in sorted(run.islands)], assignment=run.assignment,
                           pool=run.pool_plain.names, regret=regret, search_tasks=run.search_tasks, trigger=trigger,
                           curriculum_version=run.version)
    state = {
        "trigger": trigger,
        "islands": [summaries[j] for j in sorted(run.islands)],
        "assignment": {str(j): m for j, m in run.assignment.items()},
        "pool": list(run.pool_plain.names),
        "search_tasks": list(run.search_tasks),
        "task_pool": list(run.task_pool),
        "regret": regret,
        "max_moves": run.cfg.max_moves,
        "patience": run.cfg.patience,
        "mutator_stats": {m: dict(s) for m, s in run.mutator_stats.items()},
        "next_island": max(run.islands) + 1,
    }
    return md, state


async def intervene(run: "MiloRun", j: int) -> None:
    """Island j stalled (stall_j >= P): diagnose and apply at most ``max_moves`` moves."""
    r = run.progress[j][0]
    did = f"d{j}-{r}"
    md, state = await build_inputs(run, j)
    odir = run.run_dir / "orchestrator" / did
    odir.mkdir(parents=True, exist_ok=True)
    (odir / "snapshot.md").write_text(md)
    seed = derive_seed(run.ctx.seed, "orchestrate", j, r)
    orch = run.orchestrator()
    t0 = time.monotonic()
    try:
        reply = await asyncio.wait_for(asyncio.to_thread(orch.decide, md, state, seed), timeout=run.cfg.mutation_time_cap_s)
        raw, usage = reply_parts(reply)
    except Exception as e:  # a failing orchestrator call skips this intervention, never the run
        raw = {"error": f"{type(e).__name__}: {e}"}
        usage = AgentUsage(cost_usd=None, error=raw["error"])
    run.ctx.agent_calls.record("orchestrator", usage.with_seconds(time.monotonic() - t0), call_id=f"decide:{did}",
                               agent=getattr(orch, "name", type(orch).__name__), island=j, round=r)
    (odir / "decision.json").write_text(dumps(raw))
    owners = {s["island"]: [n["node_id"] for n in s["nodes"]] + [n["harness_id"] for n in s["nodes"]]
              for s in state["islands"]}
    try:
        d = validate_decision(raw, islands=run.islands.keys(), mutators=run.pool_plain.names,
                              max_moves=run.cfg.max_moves, harnesses=owners, tasks=run.task_pool,
                              assignment=run.assignment)
    except DecisionError as e:
        await run.emit("milo.decision_invalid", {"decision_id": did, "trigger": j, "round": r, "error": str(e),
                                                 "raw": raw}, island=j, round=r)
        return
    await run.emit("milo.decision", {"decision_id": did, "trigger": j, "round": r, "decision": d}, island=j, round=r)
    await apply_decision(run, did, j, r, d)


def moves_of(d: dict[str, Any]) -> list[tuple[str, Any]]:
    """The decision's moves in application order (reassign first: it is instantaneous)."""
    out: list[tuple[str, Any]] = []
    if d.get("reassign"):
        out.append(("reassign", d["reassign"]))
    out += [("speciate", m) for m in d.get("speciate") or []]
    out += [("recombine", m) for m in d.get("recombine") or []]
    if d.get("curriculum"):
        out.append(("curriculum", d["curriculum"]))
    return out


async def apply_decision(run: "MiloRun", did: str, trigger: int, r: int, d: dict[str, Any]) -> None:
    done = run.moves_done.get(did, set())
    for i, (kind, m) in enumerate(moves_of(d)):
        if i in done or run.stop:
            continue
        if kind == "reassign":
            for a in m:
                await run.emit("milo.reassign", {"island": a["island"], "mutator": a["mutator"], "decision_id": did},
                               island=a["island"], round=r)
        elif kind == "speciate":
            await speciate(run, did, i, m, r)
        elif kind == "recombine":
            await graft(run, did, i, m)
        elif kind == "curriculum":
            await curriculum(run, did, m["tasks"], r)
        await run.emit("milo.move_done", {"decision_id": did, "index": i, "kind": kind}, island=trigger, round=r)
    if run.stop:
        return
    # stall_trigger is left alone (it resets only on a held-out gain); the loop spaces the
    # next intervention P rounds after this one (MiloRun._should_orchestrate).
    await run.emit("milo.intervention_done", {"decision_id": did}, island=trigger, round=r)


async def speciate(run: "MiloRun", did: str, i: int, m: dict[str, Any], r: int) -> None:
    src = int(m["from_island"])
    if (did, i) in run.speciations:
        # A crash interrupted this move after the new island was created: finish it.
        new, node_id = run.speciations[(did, i)]
    else:
        node_id = await run.islands[src].find.remote(m["harness_id"])
        problem = None
        if node_id is None or await run.islands[src].is_root.remote(node_id):
            problem = f"{m['harness_id']!r} is missing or a root of island {src}"  # would empty its island
        elif run.node_index[node_id][1].get("fitness") is None:
            problem = f"{m['harness_id']!r} was never evaluated (invalid or missing child): it cannot found an island"
        if problem:
            run.store.event("milo.move_failed", {"decision_id": did, "index": i, "error": problem}, island=src)
            return
        new = max(run.islands) + 1
        await run.emit("milo.island", {"island": new, "from_island": src, "node_id": node_id, "mutator": m["mutator"],
                                       "decision_id": did, "index": i}, island=new, round=r)
    root = run.node_index[node_id][1]
    # The root becomes admitted on its new island; if it was judged on an older B_search
    # (rejected nodes are not re-fit by a curriculum change), judge it on the current one.
    async with run.lock:
        if root.get("search_version") != run.version:
            await refit(run, new, node_id, r)
    if root.get("val_accuracy") is None:
        await run.heldout(new, root, round=0)
    run.spawn(new)


async def graft(run: "MiloRun", did: str, i: int, m: dict[str, Any]) -> None:
    dst = int(m["dest_island"])
    r = run.progress[dst][0]
    node_id = f"{did}-g{i}"
    if node_id in run.node_index:
        # A crash interrupted this move after its child was recorded: finish it.
        d = run.node_index[node_id][1]
    else:
        d = await _graft_child(run, did, i, m, r, node_id)
        if d is None:
            return
    if d["admitted"] and await run.heldout(dst, d, round=r):
        # A held-out gain on the destination island resets its stall like any other.
        await run.emit("milo.progress", {"island": dst, "rounds_done": run.progress[dst][0], "stall": 0},
                       island=dst, round=r)


async def _graft_child(run: "MiloRun", did: str, i: int, m: dict[str, Any], r: int, node_id: str) -> dict[str, Any] | None:
    dst, donor = int(m["dest_island"]), int(m["donor_island"])
    a, b = await run.islands[dst].best.remote(), await run.islands[donor].best.remote()
    if a is None or b is None:
        run.store.event("milo.move_failed", {"decision_id": did, "index": i,
                                             "error": f"island {dst if a is None else donor} has no evaluated harness"},
                        island=dst)
        return None
    wd = run.run_dir / "workspace" / "mutations" / "graft" / f"{did}-{i}"
    wd.mkdir(parents=True, exist_ok=True)
    req = MutationRequest(
        parent=run.harness(a), parent_dir=Path(a["harness_path"]).parent,
        evidence_dir=Path(a["evidence_path"]) if a.get("evidence_path") else wd, memory_markdown="", workdir=wd,
        seed=derive_seed(run.ctx.seed, "graft", did, i),
        context={"mode": "graft", "co_parent_source": run.harness(b).source, "co_parent_dir": str(Path(b["harness_path"]).parent),
                 "donor_island": donor, "dest_island": dst, "diagnosis": run.decisions[did]["decision"]["diagnosis"],
                 "why": m.get("why", "")},
    )
    orch = run.orchestrator()
    try:
        res = await asyncio.wait_for(asyncio.to_thread(orch.graft, req), timeout=run.cfg.mutation_time_cap_s)
    except Exception as e:
        res = MutationResult(None, error=f"graft failed: {type(e).__name__}: {e}")
    return await run.child(dst, r, node_id=node_id, parent=a, res=res, origin="graft", mutator="orchestrator",
                           co_parent=b["node_id"], co_parent_label={"accuracy": b.get("accuracy"),
                                                                    "costs": b.get("costs") or {},
                                                                    "search_version": b.get("search_version", 0)})


async def curriculum(run: "MiloRun", did: str, tasks: list[str], r: int) -> None:
    """Replace B_search and re-fit every admitted harness on it (cached rollouts reused)."""
    async with run.lock:
        if list(tasks) != run.search_tasks:
            await run.emit("milo.curriculum", {"version": run.version + 1, "tasks": list(tasks), "decision_id": did},
                           round=r)
        run.sched.add_tasks(run.tasks_of(run.search_tasks))
        for j in sorted(run.islands):
            for n in (await run.islands[j].summary.remote(5))["admitted"]:
                if run.node_index[n["node_id"]][1].get("search_version") != run.version:
                    await refit(run, j, n["node_id"], r)


async def refit(run: "MiloRun", j: int, node_id: str, r: int) -> None:
    """Re-evaluate one node of island j on the current B_search (cached rollouts are
    reused) and relabel it.  The caller holds ``run.lock``."""
    node = run.node_index[node_id][1]
    h = run.harness(node)
    ev = await run.eval_search(h, island=j, round=r)
    write_evidence(run.run_dir, h, ev.results, run.tasks_of(run.search_tasks), run.store)
    changes = {"accuracy": ev.accuracy, "costs": ev.costs, "behavior": ev.behavior, "fitness": ev.fitness,
               "search_version": run.version}
    await run.emit("milo.refit", {"island": j, "node_id": node_id, "changes": changes},
                   island=j, round=r, harness_id=node["harness_id"])
