"""MILO's evolution loop (papers/000 Algorithm 1, §4.2) as the ``milo`` method.

Owns :class:`MiloMethod` (the ``Method`` the entry point runs) and :class:`MiloRun`,
the driver of one run: initialization from the seeds, the rounds (lock-step, or
free-running islands as asyncio coroutines), when the orchestrator is called, the
time, budget and per-role agent caps, and the final test evaluation.

State is a projection of events (DESIGN §5.11): every change is one typed event
(:mod:`milo_ray.milo.events`) that :meth:`MiloRun.emit` hands to the run's
:class:`~milo_ray.search.events.EventLog`, which stores it and applies it to
:class:`~milo_ray.milo.state.MiloState`; resuming replays the stored events, in
order, through the same ``apply``. Children are handled in
:mod:`milo_ray.milo.children`, orchestrator moves in
:mod:`milo_ray.milo.orchestrator`; both see the run as a
:class:`~milo_ray.milo.view.PopulationView`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from milo_ray.context import RunContext
from milo_ray.core.seeds import derive_seed
from milo_ray.execution.budget import BudgetExceeded
from milo_ray.execution.cluster import driver_node, ensure_connected
from milo_ray.harness.model import Harness
from milo_ray.kernels.pareto import most_dissimilar
from milo_ray.milo.children import admit_child, eval_search, heldout, mutation_request
from milo_ray.milo.config import MiloConfig
from milo_ray.milo.events import MILO_EVENTS, Init, NodeRecorded, Progress, RoleBudget, SeedScore, Step, Stopped
from milo_ray.milo.island import Island, RoundPlan
from milo_ray.milo.island_actor import ask, island_actors, node_of
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.mutator_pool import MutatorPool
from milo_ray.milo.mutator_pool_actor import MutatorPoolActor, PoolRef
from milo_ray.milo.plugin import PLUGIN
from milo_ray.milo.records import build_node, node_row_key, rebased, record_node, write_missing_rows
from milo_ray.milo.state import MiloState
from milo_ray.search.agent_calls import spec_model
from milo_ray.search.events import Event, EventLog
from milo_ray.search.mutation import MutationOutcome, ValidationOptions, run_mutation_async, ship_files
from milo_ray.search.recording import HarnessRecorder

log = logging.getLogger(__name__)


class MiloMethod:
    """``method=milo``: built by Hydra from :class:`MiloConfig` fields."""

    name = "milo"
    agent_roles = ("mutators", "orchestrator")  # checked by the entry point before the run starts

    @classmethod
    def agent_roles_for(cls, method: dict[str, Any]) -> tuple[str, ...]:
        """The roles this configuration needs (the plugin's rule: rungs without an
        orchestrator, ablations A-D, need mutators only)."""
        return PLUGIN.roles(method)

    def __init__(self, **fields: Any) -> None:
        fields.pop("_target_", None)
        self.cfg = MiloConfig(**fields)
        self.cfg.check()

    def preflight(self, benchmark: Any, agents: dict[str, Any]) -> None:
        """Refuse a benchmark, backend or seed list this config cannot run on (before
        anything is written)."""
        self.cfg.for_run(benchmark, agents)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        ensure_connected()
        return asyncio.run(MiloRun(self.cfg, ctx).main())


class MiloRun:
    """One MILO run on the driver (a :class:`~milo_ray.milo.view.PopulationView`)."""

    def __init__(self, cfg: MiloConfig, ctx: RunContext) -> None:
        agents = ctx.agents or {}
        cfg = cfg.for_run(ctx.benchmark, agents)
        self.cfg, self.ctx = cfg, ctx
        self.store, self.sched, self.bench = ctx.store, ctx.scheduler, ctx.benchmark
        self.run_dir = Path(ctx.run_dir)
        self.seeds: list[Harness] = cfg.seed_harnesses(ctx.benchmark)
        specs = list(agents.get("mutators") or [])[: cfg.pool_size]
        self.pool_plain = MutatorPool(specs, time_cap_s=cfg.mutation_time_cap_s, max_concurrent=cfg.mutator_concurrency)
        self.pool_names: list[str] = list(self.pool_plain.names)
        self.mutator_models = {n: spec_model(self.pool_plain.spec(n)) for n in self.pool_names}
        tasks_all = [t for split in self.bench.splits().values() for t in split]
        self.forbidden = tuple(sorted({t.task_id for t in tasks_all} | {t.instruction for t in tasks_all if t.instruction}))
        # Children are checked against what the benchmark's artifact is: an agent harness
        # (build_agent) or an optimizer program (optimize).
        self.validation = ValidationOptions(self.forbidden, float(cfg.validate_timeout_s),
                                            entry=getattr(self.bench, "artifact_entry", "build_agent"),
                                            sandbox=ctx.sandbox)
        # The pool actor holds the assignment, the seats and their fair queue; the driver
        # runs each mutation under a seat it grants (see milo/mutator_pool_actor.py). The
        # holder names the run at the shared accounts, the same in every session of it.
        holder = f"{ctx.run_id}@{hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:12]}"
        self.pool = PoolRef(lambda: MutatorPoolActor.options(scheduling_strategy=driver_node()).remote(
            specs, cfg.mutation_time_cap_s, cfg.mutator_concurrency, holder))
        self.orch_spec = agents.get("orchestrator")
        self._orchestrator: Any = None
        # Each island is a Ray actor, the only in-memory owner of its state; this state
        # holds the run-level rest and routes each island its events.
        # The initial islands' actors start now, while the seeds are evaluated.
        initial = range(1 if cfg.num_islands == 1 else min(cfg.num_islands, len(self.seeds)))
        self.state = MiloState(eps=cfg.eps, temperature=cfg.temperature,
                               island_factory=island_actors(eps=cfg.eps, temperature=cfg.temperature, prestart=initial))
        # ``_apply`` looked up per event, so an instance that overrides it is honoured.
        self.events = EventLog(self.store, MILO_EVENTS, apply=lambda event: self._apply(event))
        self.harnesses: dict[str, Harness] = {}  # harness id -> source (a cache of the store's blobs)
        self.harness_rows = HarnessRecorder(self.store, key=node_row_key, resumed=bool(ctx.resumed))
        self._grouped: set[int] = set()  # islands whose scheduler group limit is set
        self.stop = False
        self.stop_reason = ""
        self.lock = asyncio.Lock()  # curriculum changes vs. admissions
        self.orch_lock = asyncio.Lock()  # one orchestrator intervention at a time
        self._tasks: dict[int, asyncio.Task] = {}

    # ------------------------------------------------------------------ events
    def emit(self, event: Event, *, island: int | None = None, round: int | None = None,
             harness_id: str | None = None, once: bool = False) -> None:
        """The one way state changes: store the event, then apply it. ``once``: the run's
        closing records (stop, summary), which a resumed run does not store again when the
        killed session already stored them (:meth:`EventLog.append`)."""
        self.events.append(event, once=once, island=None if island is None else int(island),
                           round=None if round is None else int(round), harness_id=harness_id or None)

    def _apply(self, event: Event) -> None:
        self.state.apply(event)
        self.pool.apply(event)  # the assignment's events: the pool actor follows them
        for j in self.state.islands:
            if j not in self._grouped:
                self.sched.set_group_limit(f"island-{j}", int(self.cfg.island_concurrency))
                self._grouped.add(j)

    def stored_events(self) -> list[Event]:
        """The run's MILO events in write order, decoded."""
        return self.events.stored()

    async def replay(self) -> bool:
        """Rebuild state from the store's events; False when the run never initialized."""
        events = self.stored_events()
        if not any(isinstance(e, Init) for e in events):
            return False
        for e in events:
            # Recorded paths name the directory the run was recorded in (another machine's,
            # or before a move): the nodes are applied with paths under this run directory.
            self._apply(NodeRecorded(rebased(self.run_dir, e.node)) if isinstance(e, NodeRecorded) else e)
        return True

    # ------------------------------------------------------------------ services (PopulationView)
    def harness(self, node: LineageNode) -> Harness:
        h = self.harnesses.get(node.harness_id)
        if h is None:
            if not node.source_ref:
                raise KeyError(f"node {node.node_id!r} has no harness source")
            h = self.harnesses[node.harness_id] = Harness(dict(self.store.get_blob(node.source_ref)), name=node.name)
        return h

    def remember(self, harness: Harness) -> None:
        self.harnesses[harness.harness_id] = harness

    def orchestrator_spec(self) -> Any:
        if not self.orch_spec:
            raise ValueError("method.orchestrator=true but the backend defines no agents.orchestrator")
        return self.orch_spec

    def orchestrator(self) -> Any:
        """The decision agent, built once per run on the driver (grafts build their own
        copy where they run, through the mutation runner)."""
        if self._orchestrator is None:
            import hydra.utils

            spec = self.orchestrator_spec()
            self._orchestrator = hydra.utils.instantiate(spec, _convert_="all") if isinstance(spec, dict) else spec
        return self._orchestrator

    def role_refused(self, role: str) -> str | None:
        """None while ``role`` may start agent calls; else why not, recorded once as a
        ``milo.role_budget`` event (the check is live: spend can only grow)."""
        reason = self.ctx.agent_calls.exhausted_reason(role)
        if reason is not None and role not in self.state.exhausted_roles:
            self.emit(RoleBudget(role, reason))
        return reason

    def out_of_time(self) -> bool:
        # The run's one time limit (run.time_limit_s), earlier sessions counted.
        return self.ctx.out_of_time()

    # ------------------------------------------------------------------ initialization
    async def initialize(self) -> None:
        cfg, rng = self.cfg, np.random.default_rng(derive_seed(self.ctx.seed, "init"))
        search_all = [t.task_id for t in self.bench.tasks(cfg.search_split)]
        val_all = [t.task_id for t in self.bench.tasks(cfg.val_split)]
        if not search_all or not val_all:
            raise ValueError(f"benchmark {self.bench.name}: needs tasks in splits {cfg.search_split!r} and {cfg.val_split!r}")
        search = list(rng.permutation(search_all)[: cfg.search_size]) if cfg.search_size else list(search_all)
        val = list(rng.permutation(val_all)[: cfg.val_size]) if cfg.val_size else list(val_all)
        search_tasks = [str(t) for t in search]
        seeds = self.seeds
        evs = await asyncio.gather(*(eval_search(self, h, island="init", round=0, tasks=search_tasks) for h in seeds))
        B = np.array([[ev.behavior[t] for t in search_tasks] for ev in evs])
        K = min(cfg.num_islands, len(seeds))
        groups = [list(range(len(seeds)))] if cfg.num_islands == 1 else [[int(i)] for i in most_dissimilar(B, K)]
        assignment = self.pool_plain.assign_initial(range(len(groups)), rng, cfg.default_mutator)
        self.emit(Init(
            search_tasks=search_tasks, val_tasks=[str(t) for t in val], task_pool=search_all,
            islands=list(range(len(groups))), assignment=dict(assignment),
            seeds=[SeedScore(h.name, h.harness_id, ev.accuracy, [float(f) for f in ev.fitness], ev.costs)
                   for h, ev in zip(seeds, evs)],
            members={j: [(self._seed_node_id(j, seeds[i]), int(i)) for i in idxs] for j, idxs in enumerate(groups)},
        ))
        # Seeds left without an island were still evaluated: the harnesses table keeps them.
        await write_missing_rows(self)
        await self.seed_islands(dict(enumerate(evs)))

    @staticmethod
    def _seed_node_id(j: int, h: Harness) -> str:
        return f"s{j}-{h.name or h.harness_id}"

    async def seed_islands(self, evs: dict[int, Any] | None = None) -> None:
        """Record every island's seed nodes and their held-out scores.

        On resume this finishes what a crash during initialization left out: seed
        nodes already recorded are kept, missing ones are judged from their (cached)
        evaluations, missing held-out scores are measured."""
        for j, members in sorted(self.state.init_members.items()):
            for node_id, i in members:
                if self.state.has_node(node_id):
                    n = await node_of(self.state, node_id)
                else:
                    h = self.seeds[i]
                    ev = evs[i] if evs is not None else await eval_search(self, h, island="init", round=0)
                    verdict = await ask(self.state.islands[j], Island.judge, ev.fitness)
                    n = build_node(self, node_id=node_id, h=h, island=j, round=0, origin="seed", parent=None, ev=ev,
                                   admitted=verdict.admitted, delta_hv=verdict.delta_hv,
                                   verdict_reason=verdict.reason, mutation=f"seed {h.name}")
                    record_node(self, n)
                if n.admitted:
                    await heldout(self, j, n, round=0)

    # ------------------------------------------------------------------ one round
    async def island_round(self, j: int) -> None:
        island, mutator = self.state.islands[j], self.state.assignment[j]
        # One question opens the round: the counters, the parent drawn with the round's
        # seed and the memory rendered for the island's mutator.
        plan = await ask(island, Island.plan, self.ctx.seed, self.cfg.parent_selection_strategy,
                         self.cfg.memory_strategy, mutator)
        r = plan.rounds_done + 1
        node_id = f"{j}-{r}"
        if self.state.has_node(node_id):
            # A crash interrupted this round after its child was recorded: finish the round.
            n = await node_of(self.state, node_id)
        else:
            reason = self.role_refused("mutator")
            if reason is not None:
                self._halt(f"mutator budget: {reason}")
                return
            n = await self._mutate(j, r, node_id, plan, mutator)
        new_best = bool(n.admitted) and await heldout(self, j, n, round=r)
        # Read the counter now, not at the start of the round: a graft into this island may
        # have produced a held-out gain (and reset it) while this round's mutation ran.
        _, stall = await ask(island, Island.status)
        self.emit(Progress(j, r, 0 if new_best else stall + 1), island=j, round=r)

    async def _mutate(self, j: int, r: int, node_id: str, plan: RoundPlan, mutator: str) -> LineageNode:
        """Round r's mutation on island j: from the round's plan (parent, memory), the
        mutator call (its spend recorded as role ``mutator``), and the child's way into
        the island."""
        if plan.parent is None:
            raise ValueError(plan.problem)
        parent = plan.parent
        req = mutation_request(self, j, r, parent, mutator, plan.memory)
        # Packed here, on the driver, whose disk holds the files (see search/mutation.py).
        shipped = await asyncio.to_thread(ship_files, req)
        call_id = f"mutate:i{j}:r{r}"
        # The seat is held until the call is recorded: the row's [time - latency_s, time]
        # lies inside it, so the stored calls show what the seats allowed.
        async with self.pool.seat(j, call_id) as lease:
            t0 = time.monotonic()
            # The pool's mutator for island j: the same events gave the plan's (mutator).
            mutator, model = lease.mutator, self.mutator_models.get(lease.mutator)
            ticket = self.ctx.agent_calls.ticket(call_id, "mutator", model)
            res: MutationOutcome = await run_mutation_async(
                lease.spec, req, time_cap_s=lease.time_cap_s, validation=self.validation,
                num_cpus=self.cfg.mutation_num_cpus, scope=self.ctx.session, env=self.ctx.agent_env,
                shipped=shipped, ticket=ticket)
            self.ctx.agent_calls.record("mutator", res.usage.with_seconds(time.monotonic() - t0), call_id=call_id,
                                        agent=mutator, model=model, island=j, round=r,
                                        covers=ticket if res.metered else None)
        return await admit_child(self, j, r, node_id=node_id, parent=parent, res=res, origin="mutation",
                                 mutator=mutator)

    # ------------------------------------------------------------------ driving
    async def _should_orchestrate(self, j: int, status: tuple[int, int] | None = None) -> bool:
        """stall_j >= P, island j has run P rounds since its last intervention, and the
        orchestrator role may still spend.

        stall_j itself only resets on a held-out gain (it is what the orchestrator reads);
        the spacing gives each intervention P rounds to show an effect before the next one.
        """
        rounds, stall = status or await ask(self.state.islands[j], Island.status)
        P = self.cfg.patience
        last = self.state.last_intervention
        spaced = j not in last or rounds - last[j] >= P
        due = bool(self.cfg.orchestrator and self.cfg.max_moves > 0 and stall >= P and spaced)
        return due and self.role_refused("orchestrator") is None

    def _island_done(self, rounds_done: int, idle: int = 0) -> bool:
        """The island ran ``max_rounds``, or its last ``max_idle_rounds`` rounds evaluated
        no new child: its mutators only reach harnesses it has already evaluated, and a
        round that spends no execution would never bring the run to its budget."""
        if self.cfg.max_rounds is not None and rounds_done >= self.cfg.max_rounds:
            return True
        return self.cfg.max_idle_rounds is not None and idle >= self.cfg.max_idle_rounds

    def _halt_if_converged(self, progress: dict[int, tuple[int, int]]) -> None:
        """Stop the run as converged when every island is idle past ``max_idle_rounds``
        (``progress``: what :meth:`_progress` answered)."""
        n = self.cfg.max_idle_rounds
        if n is not None and all(idle >= n for _, idle in progress.values()):
            self._halt(f"converged: every island's last {n} rounds evaluated no new child (method.max_idle_rounds)")

    async def _progress(self, islands: list[int]) -> dict[int, tuple[int, int]]:
        """(rounds done, idle rounds) per island, asked of all of them at once."""
        status = await asyncio.gather(*(ask(self.state.islands[j], Island.progress) for j in islands))
        return dict(zip(islands, status))

    def _halt(self, reason: str) -> None:
        if not self.stop:
            self.stop, self.stop_reason = True, reason

    async def _guarded(self, coro: Any) -> None:
        try:
            await coro
        except BudgetExceeded as e:
            self._halt(f"budget: {e}")

    async def _orchestrate(self, j: int) -> None:
        from milo_ray.milo.orchestrator import intervene

        async with self.orch_lock:
            if await self._should_orchestrate(j) and not self.stop:
                await self._guarded(intervene(self, j))

    async def island_loop(self, j: int) -> None:
        """Free-running island: rounds back to back until time, budget or max_rounds."""
        while not self.stop:
            if self.out_of_time():
                self._halt("time limit")
                break
            status = await ask(self.state.islands[j], Island.status)  # one question for both checks
            if await self._should_orchestrate(j, status):
                await self._orchestrate(j)
                continue
            if self._island_done(*await ask(self.state.islands[j], Island.progress)):
                break
            await self._guarded(self.island_round(j))

    def spawn(self, j: int) -> None:
        """Start a coroutine for a (new) island; the lock-step driver picks islands up itself."""
        if not self.cfg.round_sync and j not in self._tasks:
            self._tasks[j] = asyncio.create_task(self.island_loop(j))

    async def run_free(self) -> None:
        for j in sorted(self.state.islands):
            self.spawn(j)
        while True:
            pending = [t for t in self._tasks.values() if not t.done()]
            if not pending:
                break
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for t in self._tasks.values():
            t.result()  # re-raise real errors
        if not self.stop and self.cfg.max_idle_rounds is not None:
            self._halt_if_converged(await self._progress(sorted(self.state.islands)))

    async def run_rounds(self, rounds: dict[int, int]) -> None:
        """One lock-step step: the given islands each run their next round concurrently."""
        out = await asyncio.gather(*(self.island_round(j) for j in sorted(rounds)), return_exceptions=True)
        for e in out:
            if isinstance(e, BudgetExceeded):
                self._halt(f"budget: {e}")
            elif isinstance(e, BaseException):
                raise e

    async def run_lockstep(self) -> None:
        # A crash inside a step: its islands that had not closed their round finish it
        # first, before any orchestrator call, exactly as the uninterrupted run would.
        done = await self._progress(list(self.state.last_step))
        unfinished = {j: r for j, r in self.state.last_step.items() if done[j][0] < r}
        if unfinished and not self.stop:
            await self.run_rounds(unfinished)
        while not self.stop:
            for j in sorted(self.state.islands):
                if await self._should_orchestrate(j):
                    await self._orchestrate(j)
            if self.stop:
                break
            if self.out_of_time():
                self._halt("time limit")
                break
            done = await self._progress(sorted(self.state.islands))
            active = [j for j in sorted(done) if not self._island_done(*done[j])]
            if not active:
                self._halt_if_converged(done)
                break
            reason = self.role_refused("mutator")
            if reason is not None:
                self._halt(f"mutator budget: {reason}")
                break
            rounds = {j: done[j][0] + 1 for j in active}
            self.emit(Step(rounds))
            await self.run_rounds(rounds)

    async def finish_pending(self) -> None:
        """Complete interventions a crash interrupted (their decision is in the store)."""
        from milo_ray.milo.orchestrator import apply_decision

        for did in list(self.state.decisions):
            if did not in self.state.decisions_done:
                async with self.orch_lock:
                    await self._guarded(apply_decision(self, did))

    async def main(self) -> dict[str, Any]:
        resumed = self.ctx.resumed and await self.replay()
        try:
            if not resumed:
                await self.initialize()
            else:
                await write_missing_rows(self)
                await self.seed_islands()
                await self.finish_pending()
            if not self.stop:
                await (self.run_lockstep() if self.cfg.round_sync else self.run_free())
        except BudgetExceeded as e:
            self._halt(f"budget: {e}")
        # Rounds stopped by a role cap close normally: the incumbents get their final test.
        self.emit(Stopped(self.stop_reason or "finished"), once=self.ctx.resumed)
        from milo_ray.milo.summary import final_summary

        return await final_summary(self, self.stop_reason or "finished")
