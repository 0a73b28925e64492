"""Driving MILO's orchestrator (papers/000 §4.1.3, Eq. 5–6): build what it sees,
ask it for a decision, validate it (re-asking once with the reason when it cannot be
executed), and carry the moves out.

Owns :func:`intervene` (one stall -> diagnosis -> ≤ ``max_moves`` moves) and
:func:`apply_decision`. The orchestrator agent (offline rules or an LLM, behind the
``Orchestrator`` protocol) only decides; everything here is the loop applying the
decision mechanically, except Graft, whose child faces normal admission. Each
diagnosis, move and completion is an ``events`` row, so an intervention interrupted
by a crash is completed on resume from its stored decision. Every orchestrator call
(decide, its re-ask, graft) is recorded in the run's agent ledger as role ``orchestrator``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from milo_ray.agents.orchestrators.schema import DecisionError, validate_decision
from milo_ray.agents.protocols import MutationRequest
from milo_ray.agents.usage import AgentUsage, reply_parts
from milo_ray.kernels.pareto import task_regret
from milo_ray.milo.children import admit_child, eval_search, heldout
from milo_ray.milo.evaluate import dumps, write_evidence
from milo_ray.milo.events import (CurriculumChanged, Decision, DecisionInvalid, InterventionDone, IslandFounded,
                                  MoveDone, MoveFailed, Progress, Reassign, Refit)
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.render import render_population
from milo_ray.milo.view import PopulationView
from milo_ray.search.agent_calls import spec_model
from milo_ray.search.mutation import MutationOutcome, run_mutation_async
from milo_ray.core.seeds import derive_seed


def _agent_name(agent: Any) -> str:
    return str(getattr(agent, "name", type(agent).__name__))


def population_regret(run: PopulationView) -> dict[str, float]:
    """rho(tau) over every admitted harness H+ on the current B_search."""
    tasks = run.state.search_tasks
    rows = []
    for j in sorted(run.state.islands):
        for n in run.state.islands[j].lineage.admitted():
            if n.evaluated and all(t in n.behavior for t in tasks):
                rows.append([n.behavior[t] for t in tasks])
    if not rows:
        return {t: 0.0 for t in tasks}
    rho = task_regret(np.array(rows))
    return {t: float(x) for t, x in zip(tasks, rho)}


def build_inputs(run: PopulationView, trigger: int | None) -> tuple[str, dict[str, Any]]:
    """The population snapshot markdown and the structured state the orchestrator reads."""
    st = run.state
    islands = sorted(st.islands)
    summaries = {j: st.islands[j].summary(5) for j in islands}
    trees = {j: st.islands[j].render(memory="lineage", mutator=st.assignment.get(j)) for j in islands}
    regret = population_regret(run)
    md = render_population([(j, summaries[j], trees[j]) for j in islands], assignment=st.assignment,
                           pool=run.pool_names, regret=regret, search_tasks=st.search_tasks, trigger=trigger,
                           curriculum_version=st.version)
    state = {
        "trigger": trigger,
        "islands": [summaries[j] for j in islands],
        "assignment": {str(j): m for j, m in st.assignment.items()},
        "pool": list(run.pool_names),
        "search_tasks": list(st.search_tasks),
        "task_pool": list(st.task_pool),
        "regret": regret,
        "max_moves": run.cfg.max_moves,
        "patience": run.cfg.patience,
        "mutator_stats": {m: dict(s) for m, s in st.mutator_stats.items()},
        "next_island": max(islands) + 1,
    }
    return md, state


async def intervene(run: PopulationView, j: int) -> None:
    """Island j stalled (stall_j >= P): diagnose and apply at most ``max_moves`` moves.

    An answer the loop cannot execute is re-asked exactly once (call ``decide:<id>:reask``,
    answer in ``decision.reask.json``); a second refusal is a ``DecisionInvalid`` carrying
    both errors, and the intervention is skipped. Resume re-runs an intervention only
    when neither a ``Decision`` nor a ``DecisionInvalid`` was stored for it."""
    r = run.state.rounds_done(j)
    did = f"d{j}-{r}"
    md, state = build_inputs(run, j)
    odir = run.run_dir / "orchestrator" / did
    odir.mkdir(parents=True, exist_ok=True)
    (odir / "snapshot.md").write_text(md)
    seed = derive_seed(run.ctx.seed, "orchestrate", j, r)
    orch = run.orchestrator()
    owners = {s["island"]: [n["node_id"] for n in s["nodes"]] + [n["harness_id"] for n in s["nodes"]]
              for s in state["islands"]}
    raw, error = await _ask(run, orch, md, state, seed, call_id=f"decide:{did}", island=j, round=r)
    (odir / "decision.json").write_text(dumps(raw))
    d = _validated(run, raw, error, owners)
    if isinstance(d, str):
        # One re-ask (App. C.2: an under-specified move is skipped, but a model often
        # fixes a named mistake at once): the same inputs plus its answer and the reason
        # it cannot be executed. A failed call left no answer to correct: it is simply
        # asked again. A spent orchestrator budget allows no second call.
        first_raw, first_error = raw, d
        refused = run.role_refused("orchestrator")
        if refused is not None:
            run.emit(DecisionInvalid(did, j, r, f"{d} (not re-asked: orchestrator budget: {refused})", raw),
                     island=j, round=r)
            return
        reask = state if error is not None else {**state, "reask": {"error": first_error, "previous": first_raw}}
        raw, error = await _ask(run, orch, md, reask, seed, call_id=f"decide:{did}:reask", island=j, round=r)
        (odir / "decision.reask.json").write_text(dumps(raw))
        d = _validated(run, raw, error, owners)
        if isinstance(d, str):
            run.emit(DecisionInvalid(did, j, r, d, raw, first_error=first_error, first_raw=first_raw),
                     island=j, round=r)
            return
    run.emit(Decision(did, j, r, d), island=j, round=r)
    await apply_decision(run, did)


async def _ask(run: PopulationView, orch: Any, md: str, state: dict[str, Any], seed: int, *, call_id: str,
               island: int, round: int) -> tuple[Any, str | None]:
    """One decide call, recorded in the agent ledger: its raw answer and, when the call
    itself failed, why."""
    t0 = time.monotonic()
    try:
        reply = await asyncio.wait_for(asyncio.to_thread(orch.decide, md, state, seed), timeout=run.cfg.mutation_time_cap_s)
        raw, usage = reply_parts(reply)
    except Exception as e:  # a failing orchestrator call skips this intervention, never the run
        raw = {"error": f"{type(e).__name__}: {e}"}
        usage = AgentUsage(cost_usd=None, error=raw["error"])
    # An LLM orchestrator names its model (``RoleLLM.model``); rule-based ones have none.
    model = getattr(getattr(orch, "llm", None), "model", None)
    run.ctx.agent_calls.record("orchestrator", usage.with_seconds(time.monotonic() - t0), call_id=call_id,
                               agent=_agent_name(orch), model=model, island=island, round=round)
    return raw, usage.error


def _validated(run: PopulationView, raw: Any, call_error: str | None,
               owners: dict[int, list[str]]) -> dict[str, Any] | str:
    """The normalized decision, or why it cannot be executed (a failed call's own error
    says more than the schema's complaint about ``{"error": ...}``)."""
    try:
        return validate_decision(raw, islands=run.state.islands.keys(), mutators=run.pool_names,
                                 max_moves=run.cfg.max_moves, harnesses=owners, tasks=run.state.task_pool,
                                 assignment=run.state.assignment)
    except DecisionError as e:
        return str(e) if call_error is None else f"the orchestrator call failed: {call_error}"


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


async def apply_decision(run: PopulationView, did: str) -> None:
    """Carry out a recorded decision's moves not yet marked done (all of them, or what
    a crash left undone), then mark the intervention done."""
    dec = run.state.decisions[did]
    trigger, r = dec.trigger, dec.round
    done = run.state.moves_done.get(did, set())
    for i, (kind, m) in enumerate(moves_of(dec.decision)):
        if i in done or run.stop:
            continue
        if kind == "reassign":
            for a in m:
                run.emit(Reassign(int(a["island"]), str(a["mutator"]), did), island=a["island"], round=r)
        elif kind == "speciate":
            await speciate(run, did, i, m, r)
        elif kind == "recombine":
            await graft(run, did, i, m)
        elif kind == "curriculum":
            await curriculum(run, did, m["tasks"], r)
        run.emit(MoveDone(did, i, kind), island=trigger, round=r)
    if run.stop:
        return
    # stall_trigger is left alone (it resets only on a held-out gain); the loop spaces the
    # next intervention P rounds after this one (MiloRun._should_orchestrate).
    run.emit(InterventionDone(did), island=trigger, round=r)


async def speciate(run: PopulationView, did: str, i: int, m: dict[str, Any], r: int) -> None:
    src = int(m["from_island"])
    st = run.state
    if (did, i) in st.speciations:
        # A crash interrupted this move after the new island was created: finish it.
        new, node_id = st.speciations[(did, i)]
    else:
        node_id = st.islands[src].find(m["harness_id"])
        problem = None
        if node_id is None or st.islands[src].is_root(node_id):
            problem = f"{m['harness_id']!r} is missing or a root of island {src}"  # would empty its island
        elif st.node(node_id).fitness is None:
            problem = f"{m['harness_id']!r} was never evaluated (invalid or missing child): it cannot found an island"
        if problem:
            run.emit(MoveFailed(did, i, problem), island=src)
            return
        new = max(st.islands) + 1
        run.emit(IslandFounded(new, src, node_id, str(m["mutator"]), did, i), island=new, round=r)
    # The root becomes admitted on its new island; if it was judged on an older B_search
    # (rejected nodes are not re-fit by a curriculum change), judge it on the current one.
    async with run.lock:
        if st.node(node_id).search_version != st.version:
            await refit(run, new, node_id, r)
    root = st.node(node_id)
    if root.val_accuracy is None:
        await heldout(run, new, root, round=0)
    run.spawn(new)


async def graft(run: PopulationView, did: str, i: int, m: dict[str, Any]) -> None:
    dst, donor = int(m["dest_island"]), int(m["donor_island"])
    st = run.state
    r = st.rounds_done(dst)
    node_id = f"{did}-g{i}"
    if st.has_node(node_id):
        # A crash interrupted this move after its child was recorded: finish it.
        child = st.node(node_id)
    else:
        a, b = st.islands[dst].best(), st.islands[donor].best()
        if a is None or b is None:
            run.emit(MoveFailed(did, i, f"island {dst if a is None else donor} has no evaluated harness"), island=dst)
            return
        reason = run.role_refused("orchestrator")
        if reason is not None:
            run.emit(MoveFailed(did, i, f"orchestrator budget: {reason}"), island=dst)
            return
        t0 = time.monotonic()
        res = await _graft_child(run, did, i, m, a, b)
        run.ctx.agent_calls.record("orchestrator", res.usage.with_seconds(time.monotonic() - t0),
                                   call_id=f"graft:{did}:{i}", agent=_agent_name(run.orchestrator()),
                                   model=spec_model(run.orchestrator_spec()), island=dst, round=r)
        child = await admit_child(run, dst, r, node_id=node_id, parent=a, res=res, origin="graft",
                                  mutator="orchestrator", co_parent=b.node_id,
                                  co_parent_label={"accuracy": b.accuracy, "costs": dict(b.costs or {}),
                                                   "search_version": b.search_version})
    if child.admitted and await heldout(run, dst, child, round=r):
        # A held-out gain on the destination island resets its stall like any other.
        run.emit(Progress(dst, st.rounds_done(dst), 0), island=dst, round=r)


async def _graft_child(run: PopulationView, did: str, i: int, m: dict[str, Any], a: LineageNode,
                       b: LineageNode) -> MutationOutcome:
    """The graft call: a request breeding ``a`` (destination best, the parent) with
    ``b`` (donor best, the co-parent), run by the orchestrator agent through the shared
    mutation runner (time cap, validation). A failing call is a rejected child, never a crash."""
    dst, donor = int(m["dest_island"]), int(m["donor_island"])
    wd = run.run_dir / "workspace" / "mutations" / "graft" / f"{did}-{i}"
    wd.mkdir(parents=True, exist_ok=True)
    req = MutationRequest(
        parent=run.harness(a), parent_dir=Path(a.harness_path).parent,
        evidence_dir=Path(a.evidence_path) if a.evidence_path else wd, memory_markdown="", workdir=wd,
        seed=derive_seed(run.ctx.seed, "graft", did, i),
        context={"mode": "graft", "node_id": f"{did}-g{i}", "co_parent_source": run.harness(b).source, "co_parent_dir": str(Path(b.harness_path).parent),
                 "donor_island": donor, "dest_island": dst, "diagnosis": run.state.decisions[did].decision["diagnosis"],
                 "why": m.get("why", "")},
    )
    return await run_mutation_async(run.orchestrator_spec(), req, time_cap_s=run.cfg.mutation_time_cap_s,
                                    validation=run.validation, call="graft", num_cpus=run.cfg.mutation_num_cpus,
                                    scope=run.ctx.session, env=run.ctx.agent_env)


async def curriculum(run: PopulationView, did: str, tasks: list[str], r: int) -> None:
    """Replace B_search and re-fit every admitted harness on it (cached rollouts reused)."""
    st = run.state
    async with run.lock:
        if list(tasks) != st.search_tasks:
            run.emit(CurriculumChanged(st.version + 1, list(tasks), did), round=r)
        run.ctx.scheduler.add_tasks([run.ctx.benchmark.task(t) for t in st.search_tasks])
        for j in sorted(st.islands):
            for n in [n for n in st.islands[j].lineage.admitted() if n.evaluated]:
                if n.search_version != st.version:
                    await refit(run, j, n.node_id, r)


async def refit(run: PopulationView, j: int, node_id: str, r: int) -> None:
    """Re-evaluate one node of island j on the current B_search (cached rollouts are
    reused) and relabel it.  The caller holds ``run.lock``."""
    node = run.state.node(node_id)
    h = run.harness(node)
    ev = await eval_search(run, h, island=j, round=r)
    tasks = [run.ctx.benchmark.task(t) for t in run.state.search_tasks]
    write_evidence(run.run_dir, h, ev.results, tasks, run.ctx.store)
    changes = {"accuracy": ev.accuracy, "costs": ev.costs, "behavior": ev.behavior, "fitness": ev.fitness,
               "search_version": run.state.version}
    run.emit(Refit(j, node_id, changes), island=j, round=r, harness_id=node.harness_id)
