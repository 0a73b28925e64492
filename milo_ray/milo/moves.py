"""The orchestrator's moves (papers/000 §4.1.3, App. C.2), one typed class each with its
one handler: Reassign, Speciate, Graft (the decision's ``recombine``) and Curriculum.

Owns :class:`Move` (the protocol), :data:`MOVES` (the move kinds in application order)
and :func:`moves_of` (a validated decision's moves). The orchestrator module decides
*whether* to intervene and validates the decision; a move's ``apply`` carries itself out
mechanically through the run's events. Graft is the one move whose result is judged: its
child faces normal admission. A handler that finds its work half done (a crash between
its events) finishes it, so resume completes an interrupted intervention.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from milo_ray.agents.protocols import MutationRequest
from milo_ray.milo.children import admit_child, eval_search, heldout
from milo_ray.milo.evaluate import write_evidence
from milo_ray.milo.events import CurriculumChanged, IslandFounded, MoveFailed, Progress, Reassign, Refit
from milo_ray.milo.island import Island
from milo_ray.milo.island_actor import ask, node_of
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.records import node_files
from milo_ray.milo.view import PopulationView
from milo_ray.search.agent_calls import spec_model
from milo_ray.search.mutation import MutationOutcome, run_mutation_async
from milo_ray.core.seeds import derive_seed


def agent_name(agent: Any) -> str:
    """How the agent ledger names an orchestrator agent."""
    return str(getattr(agent, "name", type(agent).__name__))


class Move(Protocol):
    """One move of a decision. ``kind`` is what ``MoveDone`` records; ``key`` is the
    decision field it is read from."""

    kind: ClassVar[str]
    key: ClassVar[str]

    @classmethod
    def parse(cls, value: Any) -> list["Move"]:
        """The moves the decision's ``key`` field holds (validated, non-empty)."""
        ...

    async def apply(self, run: PopulationView, decision_id: str, index: int, round: int) -> None:
        """Carry the move out (``index``: its position in the decision; ``round``: the
        intervention's round on the stalled island)."""
        ...


@dataclass(frozen=True)
class ReassignMove:
    """Give islands other mutators: the whole ``reassign`` list is ONE move (the
    paper's move counting); instantaneous, so it is applied first."""

    kind: ClassVar[str] = "reassign"
    key: ClassVar[str] = "reassign"
    assignments: tuple[tuple[int, str], ...]

    @classmethod
    def parse(cls, value: Any) -> list[Move]:
        return [cls(tuple((int(a["island"]), str(a["mutator"])) for a in value))]

    async def apply(self, run: PopulationView, decision_id: str, index: int, round: int) -> None:
        for island, mutator in self.assignments:
            run.emit(Reassign(island, mutator, decision_id), island=island, round=round)


@dataclass(frozen=True)
class SpeciateMove:
    """Move the subtree rooted at ``harness_id`` (a node or harness id) of
    ``from_island`` to a new island under ``mutator``: a crowded-out niche gets its own
    population."""

    kind: ClassVar[str] = "speciate"
    key: ClassVar[str] = "speciate"
    from_island: int
    harness_id: str
    mutator: str

    @classmethod
    def parse(cls, value: Any) -> list[Move]:
        return [cls(int(m["from_island"]), m["harness_id"], str(m["mutator"])) for m in value]

    async def apply(self, run: PopulationView, decision_id: str, index: int, round: int) -> None:
        src, st = self.from_island, run.state
        if (decision_id, index) in st.speciations:
            # A crash interrupted this move after the new island was created: finish it.
            new, node_id = st.speciations[(decision_id, index)]
        else:
            found, problem = await ask(st.islands[src], Island.speciation_root, self.harness_id)
            if problem:
                run.emit(MoveFailed(decision_id, index, problem), island=src)
                return
            node_id, new = found, max(st.islands) + 1
            run.emit(IslandFounded(new, src, node_id, self.mutator, decision_id, index), island=new, round=round)
        # The root becomes admitted on its new island; if it was judged on an older B_search
        # (rejected nodes are not re-fit by a curriculum change), judge it on the current one.
        async with run.lock:
            if (await node_of(st, node_id)).search_version != st.version:
                await refit(run, new, node_id, round)
        root = await node_of(st, node_id)
        if root.val_accuracy is None:
            await heldout(run, new, root, round=0)
        run.spawn(new)


@dataclass(frozen=True)
class GraftMove:
    """Breed the destination island's best harness (the parent) with the donor island's
    best (the co-parent); the child faces normal admission on the destination."""

    kind: ClassVar[str] = "recombine"
    key: ClassVar[str] = "recombine"
    dest_island: int
    donor_island: int
    why: str = ""

    @classmethod
    def parse(cls, value: Any) -> list[Move]:
        return [cls(int(m["dest_island"]), int(m["donor_island"]), m.get("why", "")) for m in value]

    async def apply(self, run: PopulationView, decision_id: str, index: int, round: int) -> None:
        dst, donor, st = self.dest_island, self.donor_island, run.state
        r, _ = await ask(st.islands[dst], Island.status)  # the child is a node of the destination's current round
        node_id = f"{decision_id}-g{index}"
        if st.has_node(node_id):
            # A crash interrupted this move after its child was recorded: finish it.
            child = await node_of(st, node_id)
        else:
            a, b = await asyncio.gather(ask(st.islands[dst], Island.best), ask(st.islands[donor], Island.best))
            if a is None or b is None:
                run.emit(MoveFailed(decision_id, index, f"island {dst if a is None else donor} has no evaluated harness"),
                         island=dst)
                return
            reason = run.role_refused("orchestrator")
            if reason is not None:
                run.emit(MoveFailed(decision_id, index, f"orchestrator budget: {reason}"), island=dst)
                return
            t0 = time.monotonic()
            call_id, model = f"graft:{decision_id}:{index}", spec_model(run.orchestrator_spec())
            ticket = run.ctx.agent_calls.ticket(call_id, "orchestrator", model)
            res = await self._child(run, decision_id, index, a, b, ticket)
            run.ctx.agent_calls.record("orchestrator", res.usage.with_seconds(time.monotonic() - t0),
                                       call_id=call_id, agent=agent_name(run.orchestrator()), model=model,
                                       island=dst, round=r, covers=ticket if res.metered else None)
            child = await admit_child(run, dst, r, node_id=node_id, parent=a, res=res, origin="graft",
                                      mutator="orchestrator", co_parent=b.node_id,
                                      co_parent_label={"accuracy": b.accuracy, "costs": dict(b.costs or {}),
                                                       "search_version": b.search_version})
        if child.admitted and await heldout(run, dst, child, round=r):
            # A held-out gain on the destination island resets its stall like any other.
            rounds_done, _ = await ask(st.islands[dst], Island.status)
            run.emit(Progress(dst, rounds_done, 0), island=dst, round=r)

    async def _child(self, run: PopulationView, decision_id: str, index: int, a: LineageNode,
                     b: LineageNode, ticket: Any = None) -> MutationOutcome:
        """The graft call: a request breeding ``a`` with ``b``, run by the orchestrator agent
        through the shared mutation runner (time cap, validation). A failing call is a
        rejected child, never a crash."""
        wd = run.run_dir / "workspace" / "mutations" / "graft" / f"{decision_id}-{index}"
        wd.mkdir(parents=True, exist_ok=True)
        a_dir, a_evidence = node_files(run, a)
        b_dir, _ = node_files(run, b)
        req = MutationRequest(
            parent=run.harness(a), parent_dir=a_dir,
            evidence_dir=a_evidence or wd, memory_markdown="", workdir=wd,
            seed=derive_seed(run.ctx.seed, "graft", decision_id, index),
            context={"mode": "graft", "node_id": f"{decision_id}-g{index}", "co_parent_source": run.harness(b).source,
                     "co_parent_dir": str(b_dir), "donor_island": self.donor_island,
                     "dest_island": self.dest_island,
                     "diagnosis": run.state.decisions[decision_id].decision["diagnosis"], "why": self.why},
        )
        return await run_mutation_async(run.orchestrator_spec(), req, time_cap_s=run.cfg.mutation_time_cap_s,
                                        validation=run.validation, call="graft", num_cpus=run.cfg.mutation_num_cpus,
                                        scope=run.ctx.session, env=run.ctx.agent_env, ticket=ticket)


@dataclass(frozen=True)
class CurriculumMove:
    """Replace B_search with ``tasks`` and re-fit every admitted harness on it (cached
    rollouts reused, missing ones run)."""

    kind: ClassVar[str] = "curriculum"
    key: ClassVar[str] = "curriculum"
    tasks: tuple[str, ...]

    @classmethod
    def parse(cls, value: Any) -> list[Move]:
        return [cls(tuple(value["tasks"]))]

    async def apply(self, run: PopulationView, decision_id: str, index: int, round: int) -> None:
        st = run.state
        async with run.lock:
            if list(self.tasks) != st.search_tasks:
                run.emit(CurriculumChanged(st.version + 1, list(self.tasks), decision_id), round=round)
            run.ctx.scheduler.add_tasks([run.ctx.benchmark.task(t) for t in st.search_tasks])
            for j in sorted(st.islands):
                for node_id in await ask(st.islands[j], Island.refit_due, st.version):
                    await refit(run, j, node_id, round)


# Application order: reassign first (it is instantaneous), then every speciation, every
# graft, and the curriculum last (its re-fit covers islands founded by the speciations).
MOVES: tuple[type[Move], ...] = (ReassignMove, SpeciateMove, GraftMove, CurriculumMove)


def moves_of(decision: dict[str, Any]) -> list[Move]:
    """A validated decision's moves in application order; a move's index in this list is
    the one its ``MoveDone`` and ``MoveFailed`` events record."""
    out: list[Move] = []
    for move in MOVES:
        if decision.get(move.key):
            out += move.parse(decision[move.key])
    return out


async def refit(run: PopulationView, j: int, node_id: str, r: int) -> None:
    """Re-evaluate one node of island j on the current B_search (cached rollouts are
    reused) and relabel it.  The caller holds ``run.lock``."""
    node = await node_of(run.state, node_id)
    h = run.harness(node)
    ev = await eval_search(run, h, island=j, round=r)
    tasks = [run.ctx.benchmark.task(t) for t in run.state.search_tasks]
    write_evidence(run.run_dir, h, ev.results, tasks, run.ctx.store)
    changes = {"accuracy": ev.accuracy, "costs": ev.costs, "behavior": ev.behavior, "fitness": ev.fitness,
               "search_version": run.state.version}
    run.emit(Refit(j, node_id, changes), island=j, round=r, harness_id=node.harness_id)
