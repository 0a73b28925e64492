"""Driving MILO's orchestrator (papers/000 §4.1.3, Eq. 5–6): build what it sees,
ask it for a decision, validate it (re-asking once with the reason when it cannot be
executed), and carry the moves out.

Owns :func:`intervene` (one stall -> diagnosis -> ≤ ``max_moves`` moves) and
:func:`apply_decision`. The orchestrator agent (offline rules or an LLM, behind the
``Orchestrator`` protocol) only decides; each move is a typed object with its own
handler (:mod:`milo_ray.milo.moves`) that applies it mechanically, except Graft, whose
child faces normal admission. Each
diagnosis, move and completion is an ``events`` row, so an intervention interrupted
by a crash is completed on resume from its stored decision. Every orchestrator call
(decide, its re-ask, graft) is recorded in the run's agent ledger as role ``orchestrator``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from milo_ray.agents.orchestrators.schema import DecisionError, validate_decision
from milo_ray.llm.usage import AgentUsage, reply_parts
from milo_ray.kernels.pareto import task_regret
from milo_ray.milo.evaluate import dumps
from milo_ray.milo.events import Decision, DecisionInvalid, InterventionDone, MoveDone
from milo_ray.milo.island import Island, IslandView
from milo_ray.milo.island_actor import ask
from milo_ray.milo.moves import agent_name, moves_of
from milo_ray.milo.render import render_population
from milo_ray.milo.view import PopulationView
from milo_ray.core.seeds import derive_seed


def population_regret(views: dict[int, IslandView], tasks: list[str]) -> dict[str, float]:
    """rho(tau) over every admitted harness H+ (the islands' views) on B_search ``tasks``."""
    rows = [[a["behavior"][t] for t in tasks] for j in sorted(views) for a in views[j].summary["admitted"]
            if all(t in a["behavior"] for t in tasks)]
    if not rows:
        return {t: 0.0 for t in tasks}
    rho = task_regret(np.array(rows))
    return {t: float(x) for t, x in zip(tasks, rho)}


def inputs_from(run: PopulationView, trigger: int | None, views: dict[int, IslandView]) -> tuple[str, dict[str, Any]]:
    """The population snapshot markdown and the structured state the orchestrator reads,
    from each island's view."""
    st = run.state
    islands = sorted(views)
    summaries = {j: views[j].summary for j in islands}
    regret = population_regret(views, st.search_tasks)
    md = render_population([(j, summaries[j], views[j].tree) for j in islands], assignment=st.assignment,
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


def build_inputs(run: PopulationView, trigger: int | None) -> tuple[str, dict[str, Any]]:
    """:func:`inputs_from` a state of plain islands (read side, tests)."""
    st = run.state
    return inputs_from(run, trigger, {j: st.islands[j].view(5, st.assignment.get(j)) for j in sorted(st.islands)})


async def gather_inputs(run: PopulationView, trigger: int | None) -> tuple[str, dict[str, Any]]:
    """:func:`inputs_from` the islands' views, asked of every island at once."""
    st = run.state
    islands = sorted(st.islands)
    views = await asyncio.gather(*(ask(st.islands[j], Island.view, 5, st.assignment.get(j)) for j in islands))
    return inputs_from(run, trigger, dict(zip(islands, views)))


async def intervene(run: PopulationView, j: int) -> None:
    """Island j stalled (stall_j >= P): diagnose and apply at most ``max_moves`` moves.

    An answer the loop cannot execute is re-asked exactly once (call ``decide:<id>:reask``,
    answer in ``decision.reask.json``); a second refusal is a ``DecisionInvalid`` carrying
    both errors, and the intervention is skipped. Resume re-runs an intervention only
    when neither a ``Decision`` nor a ``DecisionInvalid`` was stored for it."""
    r, _ = await ask(run.state.islands[j], Island.status)
    did = f"d{j}-{r}"
    md, state = await gather_inputs(run, j)
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
                               agent=agent_name(orch), model=model, island=island, round=round)
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


async def apply_decision(run: PopulationView, did: str) -> None:
    """Carry out a recorded decision's moves not yet marked done (all of them, or what
    a crash left undone), then mark the intervention done."""
    dec = run.state.decisions[did]
    trigger, r = dec.trigger, dec.round
    done = run.state.moves_done.get(did, set())
    for i, move in enumerate(moves_of(dec.decision)):
        if i in done or run.stop:
            continue
        await move.apply(run, did, i, r)
        run.emit(MoveDone(did, i, move.kind), island=trigger, round=r)
    if run.stop:
        return
    # stall_trigger is left alone (it resets only on a held-out gain); the loop spaces the
    # next intervention P rounds after this one (MiloRun._should_orchestrate).
    run.emit(InterventionDone(did), island=trigger, round=r)
