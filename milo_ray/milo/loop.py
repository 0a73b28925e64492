"""MILO's evolution loop (papers/000 Algorithm 1, §4.2) as the ``milo`` method.

Owns :class:`MiloMethod` (the ``Method`` the entry point runs) and :class:`MiloRun`,
the driver of one run: initialization from the seeds, islands advancing as asyncio
coroutines on the driver (an island never waits for a slower island's mutation), the
wall-clock and budget stops, and the final test evaluation.

State changes are event-sourced: every change of an island, the assignment or the
curriculum is one ``events`` row (``milo.*``) written first and then applied by
:meth:`MiloRun.apply`; resuming replays the same rows through the same method, so the
store is the single source of truth and the actors are caches. Orchestrator moves
live in :mod:`milo_ray.milo.orchestrator`; reproducibility in
:mod:`milo_ray.search.seeds`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.context import RunContext
from milo_ray.execution.budget import BudgetExceeded
from milo_ray.harness.model import Harness
from milo_ray.kernels.pareto import most_dissimilar
from milo_ray.milo.config import MiloConfig
from milo_ray.search.seeds import derive_seed
from milo_ray.milo.evaluate import (Evaluation, empty_dir, evaluate, write_evidence, write_harness_dir,
                                   write_request_record)
from milo_ray.milo.island import IslandActor
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.mutator_pool import MutatorPool, MutatorPoolActor

log = logging.getLogger(__name__)


class MiloMethod:
    """``method=milo``: built by Hydra from :class:`MiloConfig` fields."""

    name = "milo"
    agent_roles = ("mutators", "orchestrator")  # checked by the entry point before the run starts

    def __init__(self, **fields: Any) -> None:
        fields.pop("_target_", None)
        self.cfg = MiloConfig(**fields)
        self.cfg.check()

    def preflight(self, benchmark: Any, agents: dict[str, Any]) -> None:
        """Refuse a benchmark or backend this config cannot run on (before anything is written)."""
        self.cfg.for_run(benchmark, agents)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from milo_ray.execution.cluster import ensure_connected

        ensure_connected()
        return asyncio.run(MiloRun(self.cfg, ctx).main())


class MiloRun:
    """One MILO run on the driver."""

    def __init__(self, cfg: MiloConfig, ctx: RunContext) -> None:
        agents = ctx.agents or {}
        cfg = cfg.for_run(ctx.benchmark, agents)
        self.cfg, self.ctx = cfg, ctx
        self.store, self.sched, self.bench = ctx.store, ctx.scheduler, ctx.benchmark
        self.run_dir = Path(ctx.run_dir)
        self.caps = (float(cfg.token_cap), float(cfg.seconds_cap))
        specs = list(agents.get("mutators") or [])[: cfg.pool_size]
        self.pool_plain = MutatorPool(specs, time_cap_s=cfg.mutation_time_cap_s, max_concurrent=cfg.mutator_concurrency)
        self.pool = MutatorPoolActor.remote(specs, cfg.mutation_time_cap_s, cfg.mutator_concurrency,
                                                      cfg.mutation_num_cpus)
        self.orch_spec = agents.get("orchestrator")
        self._orchestrator: Any = None
        # Mirrors of the event-sourced state the driver needs without an actor round trip.
        self.islands: dict[int, Any] = {}
        self.progress: dict[int, tuple[int, int]] = {}
        self.assignment: dict[int, str] = {}
        self.search_tasks: list[str] = []
        self.val_tasks: list[str] = []
        self.task_pool: list[str] = []
        self.version = 0
        self.decisions: dict[str, dict[str, Any]] = {}
        self.moves_done: dict[str, set[int]] = {}
        self.decisions_done: set[str] = set()
        self.last_intervention: dict[int, int] = {}  # island -> rounds_done when it last triggered the orchestrator
        self.mutator_stats: dict[str, dict[str, int]] = {}
        self.node_index: dict[str, tuple[int, dict[str, Any]]] = {}  # node_id -> (island, node dict)
        self.recorded_nodes: dict[str, dict[str, Any]] = {}  # node_id -> the node as its milo.node event recorded it
        self.val_gain: dict[str, bool] = {}  # node_id -> whether its held-out score was a new island best
        self.init_members: dict[int, list[tuple[str, int]]] = {}  # island -> (seed node id, seed index)
        self.speciations: dict[tuple[str, int], tuple[int, str]] = {}  # (decision, move) -> (new island, root)
        self.last_step: dict[int, int] = {}  # lock-step: island -> the round its latest step runs
        self.harnesses: dict[str, Harness] = {}
        self.seed_scores: list[dict[str, Any]] = []
        self.stop = False
        self.stop_reason = ""
        self.lock = asyncio.Lock()  # curriculum changes vs. admissions
        self.orch_lock = asyncio.Lock()  # one orchestrator intervention at a time
        self._tasks: dict[int, asyncio.Task] = {}
        tasks_all = [t for split in self.bench.splits().values() for t in split]
        self.forbidden = tuple(sorted({t.task_id for t in tasks_all} | {t.instruction for t in tasks_all if t.instruction}))

    # ------------------------------------------------------------------ events
    async def emit(self, kind: str, payload: dict[str, Any], *, island: int | None = None, round: int | None = None,
                   harness_id: str | None = None) -> None:
        cols: dict[str, Any] = {}
        if island is not None:
            cols["island"] = int(island)
        if round is not None:
            cols["round"] = int(round)
        if harness_id:
            cols["harness_id"] = harness_id
        self.store.event(kind, payload, **cols)
        await self.apply(kind, payload)

    async def apply(self, kind: str, p: dict[str, Any]) -> None:
        """Apply one ``milo.*`` event to the islands, the pool and the mirrors."""
        if kind == "milo.init":
            self.search_tasks, self.val_tasks, self.task_pool = list(p["search_tasks"]), list(p["val_tasks"]), list(p["task_pool"])
            self.seed_scores = list(p.get("seeds", []))
            self.init_members = {int(j): [(str(nid), int(i)) for nid, i in m] for j, m in p.get("members", {}).items()}
            for j in p["islands"]:
                await self._new_island(int(j))
            for j, m in p["assignment"].items():
                await self._assign(int(j), m)
        elif kind == "milo.node":
            n = p["node"]
            self.recorded_nodes[n["node_id"]] = copy.deepcopy(n)  # as recorded; node_index's copy is updated later
            await self.islands[n["island"]].add_node.remote(n)
            self.node_index[n["node_id"]] = (n["island"], n)
            if n["origin"] in ("mutation", "graft") and n.get("mutator"):
                st = self.mutator_stats.setdefault(n["mutator"], {"children": 0, "admitted": 0})
                st["children"] += 1
                st["admitted"] += int(bool(n["admitted"]))
        elif kind == "milo.heldout":
            # The island answers atomically whether this is a new best (replay gives the same answer).
            gain = await self.islands[p["island"]].record_val.remote(p["node_id"], p["val_accuracy"])
            self.val_gain[p["node_id"]] = bool(gain)
            self._touch(p["node_id"], {"val_accuracy": p["val_accuracy"]})
        elif kind == "milo.progress":
            j = int(p["island"])
            await self.islands[j].set_progress.remote(p["rounds_done"], p["stall"])
            self.progress[j] = (int(p["rounds_done"]), int(p["stall"]))
        elif kind == "milo.reassign":
            await self._assign(int(p["island"]), p["mutator"])
        elif kind == "milo.island":
            src, j = int(p["from_island"]), int(p["island"])
            moved = await self.islands[src].detach_subtree.remote(p["node_id"])
            await self._new_island(j)
            await self.islands[j].adopt_subtree.remote(moved)
            for n in moved:
                n["island"] = j
                self.node_index[n["node_id"]] = (j, n)
            await self._assign(j, p["mutator"])
            if "index" in p:
                self.speciations[(p["decision_id"], int(p["index"]))] = (j, p["node_id"])
        elif kind == "milo.curriculum":
            self.version, self.search_tasks = int(p["version"]), list(p["tasks"])
        elif kind == "milo.refit":
            await self.islands[p["island"]].relabel.remote(p["node_id"], p["changes"])
            self._touch(p["node_id"], p["changes"])
        elif kind == "milo.decision":
            self.decisions[p["decision_id"]] = p
            self.moves_done.setdefault(p["decision_id"], set())
            self.last_intervention[int(p["trigger"])] = int(p["round"])
        elif kind == "milo.decision_invalid":
            j = int(p["trigger"])
            self.last_intervention[j] = int(p.get("round", self.progress.get(j, (0, 0))[0]))
        elif kind == "milo.move_done":
            self.moves_done.setdefault(p["decision_id"], set()).add(int(p["index"]))
        elif kind == "milo.intervention_done":
            self.decisions_done.add(p["decision_id"])
        elif kind == "milo.step":
            self.last_step = {int(j): int(r) for j, r in p["rounds"].items()}
        # Other kinds (diagnosis text, invalid decisions, stops) are records only.

    def _touch(self, node_id: str, changes: dict[str, Any]) -> None:
        if node_id in self.node_index:
            self.node_index[node_id][1].update(changes)

    async def _new_island(self, j: int) -> None:
        if j not in self.islands:
            self.islands[j] = IslandActor.remote(j, self.cfg.eps, self.cfg.temperature)
            self.progress.setdefault(j, (0, 0))
            self.sched.set_group_limit(f"island-{j}", int(self.cfg.island_concurrency))

    async def _assign(self, j: int, name: str) -> None:
        self.pool_plain.assign(j, name)
        await self.pool.assign.remote(j, name)
        self.assignment[j] = name

    async def replay(self) -> bool:
        """Rebuild state from the store's events; False when the run never initialized."""
        tbl = self.store.read("events").to_pylist()
        rows = sorted((r for r in tbl if str(r.get("kind", "")).startswith("milo.")), key=lambda r: r["seq"])
        if not any(r["kind"] == "milo.init" for r in rows):
            return False
        import json

        for r in rows:
            p = r["payload"]
            await self.apply(r["kind"], json.loads(p) if isinstance(p, str) else (p or {}))
        for _, n in self.node_index.values():
            if n.get("source_ref") and n["harness_id"] not in self.harnesses:
                self.harnesses[n["harness_id"]] = Harness(dict(self.store.get_blob(n["source_ref"])), name=n.get("name", ""))
        return True

    # ------------------------------------------------------------------ helpers
    def out_of_time(self) -> bool:
        # The run's one time limit (run.time_limit_s), earlier sessions counted.
        return self.ctx.out_of_time()

    def harness(self, node: dict[str, Any]) -> Harness:
        return self.harnesses[node["harness_id"]]

    def tasks_of(self, ids: list[str]) -> list[Any]:
        return [self.bench.task(t) for t in ids]

    async def eval_search(self, h: Harness, *, island: int | str, round: int) -> Evaluation:
        return await evaluate(self.sched, h, self.search_tasks, self.cfg.k_search, seed=self.ctx.seed,
                              split=self.cfg.search_split, round=round, stage="search", group=self._group(island),
                              caps=self.caps)

    async def eval_val(self, h: Harness, *, island: int | str, round: int) -> Evaluation:
        return await evaluate(self.sched, h, self.val_tasks, self.cfg.k_val, seed=self.ctx.seed,
                              split=self.cfg.val_split, round=round, stage="heldout", group=self._group(island),
                              caps=self.caps)

    @staticmethod
    def _group(island: int | str) -> str:
        return f"island-{island}" if isinstance(island, int) else str(island)

    def _node_dict(self, *, node_id: str, h: Harness | None, island: int, round: int, origin: str,
                   parent: dict[str, Any] | None, ev: Evaluation | None, **labels: Any) -> dict[str, Any]:
        d = LineageNode(node_id=node_id, harness_id=h.harness_id if h else "", island=island, round=round,
                        origin=origin, parent=parent["node_id"] if parent else None, name=h.name if h else "",
                        search_version=self.version).to_dict()
        if h is not None:
            from milo_ray.harness.diff import diff

            patch = diff(self.harness(parent), h) if parent else None
            hd, diff_path = write_harness_dir(self.run_dir, h, patch.patch if patch else None,
                                              parent_id=parent["harness_id"] if parent else "")
            d.update(harness_path=str(hd / "harness.py"), source_ref=self.store.put_harness_source(dict(h.files)))
            if patch:
                d.update(diff_path=str(diff_path), diff_added=patch.added, diff_deleted=patch.deleted)
            self.harnesses[h.harness_id] = h
        if ev is not None:
            ev_dir = write_evidence(self.run_dir, h, ev.results, self.tasks_of(self.search_tasks), self.store)
            d.update(accuracy=ev.accuracy, costs=ev.costs, behavior=ev.behavior, fitness=ev.fitness,
                     evidence_path=str(ev_dir))
        d.update(labels)
        return d

    async def record_node(self, d: dict[str, Any]) -> None:
        """Record a node: its ``milo.node`` event is the record, its ``harnesses`` row is
        derived from it afterwards (a kill in between is repaired by :meth:`write_missing_rows`)."""
        await self.emit("milo.node", {"node": d}, island=d["island"], round=d["round"], harness_id=d["harness_id"] or None)
        self.store.append("harnesses", [self._node_row(d)])

    def _node_row(self, d: dict[str, Any]) -> dict[str, Any]:
        return {
            "harness_id": d["harness_id"] or f"none:{d['node_id']}", "name": d["name"], "island": d["island"],
            "parent_id": self.node_index[d["parent"]][1]["harness_id"] if d.get("parent") in self.node_index else None,
            "co_parent_id": self.node_index[d["co_parent"]][1]["harness_id"] if d.get("co_parent") in self.node_index else None,
            "round": d["round"], "origin": d["origin"], "mutator": d.get("mutator"), "admitted": bool(d["admitted"]),
            "verdict_reason": d["verdict_reason"], "fitness": d.get("fitness"), "delta_hv": d.get("delta_hv"),
            "diff_added": d.get("diff_added"), "diff_deleted": d.get("diff_deleted"), "source_ref": d.get("source_ref"),
            "validation_error": d.get("validation_error"), "created_at": time.time(),
            "extra": {"node_id": d["node_id"], "mutation": d.get("mutation"), "accuracy": d.get("accuracy"),
                      "costs": d.get("costs"), "search_version": d.get("search_version")},
        }

    def _stored_rows(self) -> set[tuple[str, str]]:
        """(node id or "" for an island-less seed, harness id) of every stored harnesses row."""
        import json

        out = set()
        for r in self.store.read("harnesses").to_pylist():
            extra = r.get("extra") or {}
            extra = json.loads(extra) if isinstance(extra, str) else extra
            out.add((str(extra.get("node_id") or ""), r["harness_id"]))
        return out

    def write_missing_rows(self) -> None:
        """The ``harnesses`` rows the events imply and the store lacks: a node recorded
        just before a kill, or the seeds left without an island when the kill came right
        after ``milo.init``. Rows already stored are never written twice."""
        have = self._stored_rows()
        rows = [self._node_row(d) for node_id, d in self.recorded_nodes.items()
                if (node_id, d["harness_id"] or f"none:{node_id}") not in have]
        placed = {i for members in self.init_members.values() for _, i in members}
        seeds = self.bench.seed_harnesses()
        K = len(self.init_members)
        for i, s in enumerate(self.seed_scores):
            if i in placed or ("", s["harness_id"]) in have:
                continue
            h = seeds[i]
            rows.append({
                "harness_id": h.harness_id, "name": h.name, "round": 0, "origin": "seed", "admitted": False,
                "verdict_reason": f"not among the {K} most behavior-dissimilar seeds: no island",
                "fitness": s.get("fitness"), "source_ref": self.store.put_harness_source(dict(h.files)),
                "created_at": time.time(), "extra": {"accuracy": s.get("accuracy"), "costs": s.get("costs")},
            })
        if rows:
            self.store.append("harnesses", rows)

    # ------------------------------------------------------------------ initialization
    async def initialize(self) -> None:
        cfg, rng = self.cfg, np.random.default_rng(derive_seed(self.ctx.seed, "init"))
        search_all = [t.task_id for t in self.bench.tasks(cfg.search_split)]
        val_all = [t.task_id for t in self.bench.tasks(cfg.val_split)]
        if not search_all or not val_all:
            raise ValueError(f"benchmark {self.bench.name}: needs tasks in splits {cfg.search_split!r} and {cfg.val_split!r}")
        search = list(rng.permutation(search_all)[: cfg.search_size]) if cfg.search_size else list(search_all)
        val = list(rng.permutation(val_all)[: cfg.val_size]) if cfg.val_size else list(val_all)
        self.search_tasks = [str(t) for t in search]
        seeds = self.bench.seed_harnesses()
        if not seeds:
            raise ValueError(f"benchmark {self.bench.name}: no seed harnesses")
        evs = await asyncio.gather(*(self.eval_search(h, island="init", round=0) for h in seeds))
        B = np.array([[ev.behavior[t] for t in self.search_tasks] for ev in evs])
        K = min(cfg.num_islands, len(seeds))
        groups = [list(range(len(seeds)))] if cfg.num_islands == 1 else [[int(i)] for i in most_dissimilar(B, K)]
        assignment = self.pool_plain.assign_initial(range(len(groups)), rng, cfg.default_mutator)
        members = {str(j): [[self._seed_node_id(j, seeds[i]), int(i)] for i in idxs] for j, idxs in enumerate(groups)}
        await self.emit("milo.init", {
            "search_tasks": self.search_tasks, "val_tasks": [str(t) for t in val], "task_pool": search_all,
            "islands": list(range(len(groups))), "assignment": {str(j): m for j, m in assignment.items()},
            "seeds": [{"name": h.name, "harness_id": h.harness_id, "accuracy": ev.accuracy,
                       "fitness": [float(f) for f in ev.fitness], "costs": ev.costs} for h, ev in zip(seeds, evs)],
            "members": members,
        })
        # Seeds left without an island were still evaluated: the harnesses table keeps them.
        self.write_missing_rows()
        await self.seed_islands(dict(enumerate(evs)))

    @staticmethod
    def _seed_node_id(j: int, h: Harness) -> str:
        return f"s{j}-{h.name or h.harness_id}"

    async def seed_islands(self, evs: dict[int, Evaluation] | None = None) -> None:
        """Record every island's seed nodes and their held-out scores.

        On resume this finishes what a crash during initialization left out: seed
        nodes already recorded are kept, missing ones are judged from their (cached)
        evaluations, missing held-out scores are measured."""
        seeds = self.bench.seed_harnesses()
        for j, members in sorted(self.init_members.items()):
            for node_id, i in members:
                if node_id in self.node_index:
                    d = self.node_index[node_id][1]
                else:
                    h = seeds[i]
                    ev = evs[i] if evs is not None else await self.eval_search(h, island="init", round=0)
                    verdict = await self.islands[j].judge.remote(ev.fitness)
                    d = self._node_dict(node_id=node_id, h=h, island=j, round=0, origin="seed", parent=None, ev=ev,
                                        admitted=verdict.admitted, delta_hv=verdict.delta_hv,
                                        verdict_reason=verdict.reason, mutation=f"seed {h.name}")
                    await self.record_node(d)
                if d["admitted"]:
                    await self.heldout(j, d, round=0)

    async def heldout(self, j: int, d: dict[str, Any], *, round: int) -> bool:
        """Measure and record a node's held-out score once; whether it was a new island best.

        A node whose score is already recorded (a resumed round) is not measured again."""
        node_id = d["node_id"]
        if node_id not in self.val_gain:
            ev = await self.eval_val(self.harness(d), island=j, round=round)
            await self.emit("milo.heldout", {"island": j, "node_id": node_id, "val_accuracy": ev.accuracy},
                            island=j, round=round, harness_id=d["harness_id"])
        return self.val_gain[node_id]

    # ------------------------------------------------------------------ one round
    async def island_round(self, j: int) -> None:
        r = self.progress[j][0] + 1
        node_id = f"{j}-{r}"
        if node_id in self.node_index:
            # A crash interrupted this round after its child was recorded: finish the round.
            d = self.node_index[node_id][1]
        else:
            d = await self._mutate(j, r, node_id)
        new_best = bool(d["admitted"]) and await self.heldout(j, d, round=r)
        # Read the counter now, not at the start of the round: a graft into this island may
        # have produced a held-out gain (and reset it) while this round's mutation ran.
        stall = self.progress[j][1]
        await self.emit("milo.progress", {"island": j, "rounds_done": r, "stall": 0 if new_best else stall + 1},
                        island=j, round=r)

    async def _mutate(self, j: int, r: int, node_id: str) -> dict[str, Any]:
        """Round r's mutation on island j: parent selection, the mutator, and the child's node."""
        cfg = self.cfg
        isl = self.islands[j]
        parent_id = await isl.select_parent.remote(derive_seed(self.ctx.seed, "parent", j, r), cfg.parent_selection)
        parent = await isl.node.remote(parent_id)
        mutator = self.assignment[j]
        memory_md = await isl.render.remote(cfg.memory, mutator)
        workdir = self.run_dir / "workspace" / "mutations" / f"island-{j}" / f"round-{r}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        (workdir.parent / f"round-{r}.memory.md").write_text(memory_md)
        agentic = cfg.mutator_mode == "agentic"
        evidence = Path(parent["evidence_path"]) if agentic and parent.get("evidence_path") else empty_dir(workdir.parent / "no-evidence")
        req = MutationRequest(
            parent=self.harness(parent), parent_dir=Path(parent["harness_path"]).parent, evidence_dir=evidence,
            memory_markdown=memory_md, workdir=workdir, seed=derive_seed(self.ctx.seed, "mutate", j, r),
            context={"mode": cfg.mutator_mode, "memory": cfg.memory, "island": j, "round": r, "parent_node": parent_id,
                     "parent_accuracy": parent.get("accuracy"), "parent_costs": parent.get("costs"),
                     "memory_path": str(workdir.parent / f"round-{r}.memory.md")},
        )
        write_request_record(workdir.parent / f"round-{r}.request.json", req, mutator)
        res: MutationResult = await self.pool.mutate.remote(mutator, req)
        return await self.child(j, r, node_id=node_id, parent=parent, res=res, origin="mutation", mutator=mutator)

    async def child(self, j: int, r: int, *, node_id: str, parent: dict[str, Any], res: MutationResult, origin: str,
                    mutator: str, co_parent: str | None = None,
                    co_parent_label: dict[str, Any] | None = None) -> dict[str, Any]:
        """Validate, evaluate and judge a mutator's (or graft's) output; record the node."""
        label = (res.report or "").strip().splitlines()[0][:200] if (res.report or "").strip() else ""
        base = dict(island=j, round=r, origin=origin, parent=parent, mutator=mutator, co_parent=co_parent,
                    co_parent_label=co_parent_label)
        if res.child is None:
            d = self._node_dict(node_id=node_id, h=None, ev=None, admitted=False, mutation=label or "(no child)",
                                verdict_reason=f"mutator error: {res.error or 'no child'}", **base)
            await self.record_node(d)
            return d
        h = res.child
        from milo_ray.harness.validate import validate

        vr = await asyncio.to_thread(validate, h, forbidden_fragments=self.forbidden, timeout_s=self.cfg.validate_timeout_s)
        if not vr.ok:
            d = self._node_dict(node_id=node_id, h=h, ev=None, admitted=False, mutation=label, validation_error=vr.reason,
                                verdict_reason=f"invalid child: {vr.reason}", **base)
            await self.record_node(d)
            return d
        dup = await self.islands[j].find.remote(h.harness_id)
        if dup is not None:
            d = self._node_dict(node_id=node_id, h=h, ev=None, admitted=False, mutation=label,
                                verdict_reason=f"duplicate of {dup} (no behavioral change)", **base)
            await self.record_node(d)
            return d
        while True:
            version = self.version
            ev = await self.eval_search(h, island=j, round=r)
            async with self.lock:
                if version != self.version:
                    continue  # the curriculum changed during evaluation: re-fit on the new B_search
                verdict = await self.islands[j].judge.remote(ev.fitness)
                d = self._node_dict(node_id=node_id, h=h, ev=ev, admitted=verdict.admitted, delta_hv=verdict.delta_hv,
                                    verdict_reason=verdict.reason, mutation=label, **base)
                await self.record_node(d)
                return d

    # ------------------------------------------------------------------ driving
    def orchestrator(self) -> Any:
        if self._orchestrator is None:
            import hydra.utils

            if not self.orch_spec:
                raise ValueError("method.orchestrator=true but the backend defines no agents.orchestrator")
            self._orchestrator = hydra.utils.instantiate(self.orch_spec, _convert_="all")
        return self._orchestrator

    def _should_orchestrate(self, j: int) -> bool:
        """stall_j >= P, and island j has run P rounds since its last intervention.

        stall_j itself only resets on a held-out gain (it is what the orchestrator reads);
        the spacing gives each intervention P rounds to show an effect before the next one.
        """
        rounds, stall = self.progress[j]
        P = self.cfg.patience
        spaced = j not in self.last_intervention or rounds - self.last_intervention[j] >= P
        return bool(self.cfg.orchestrator and self.cfg.max_moves > 0 and stall >= P and spaced)

    def _island_done(self, j: int) -> bool:
        return self.cfg.max_rounds is not None and self.progress[j][0] >= self.cfg.max_rounds

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
            if self._should_orchestrate(j) and not self.stop:
                await self._guarded(intervene(self, j))

    async def island_loop(self, j: int) -> None:
        """Free-running island: rounds back to back until time, budget or max_rounds."""
        while not self.stop:
            if self.out_of_time():
                self._halt("time limit")
                break
            if self._should_orchestrate(j):
                await self._orchestrate(j)
                continue
            if self._island_done(j):
                break
            await self._guarded(self.island_round(j))

    def spawn(self, j: int) -> None:
        """Start a coroutine for a (new) island; the lock-step driver picks islands up itself."""
        if not self.cfg.round_sync and j not in self._tasks:
            self._tasks[j] = asyncio.create_task(self.island_loop(j))

    async def run_free(self) -> None:
        for j in sorted(self.islands):
            self.spawn(j)
        while True:
            pending = [t for t in self._tasks.values() if not t.done()]
            if not pending:
                break
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for t in self._tasks.values():
            t.result()  # re-raise real errors

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
        unfinished = {j: r for j, r in self.last_step.items() if self.progress[j][0] < r}
        if unfinished and not self.stop:
            await self.run_rounds(unfinished)
        while not self.stop:
            for j in sorted(self.islands):
                if self._should_orchestrate(j):
                    await self._orchestrate(j)
            if self.stop:
                break
            if self.out_of_time():
                self._halt("time limit")
                break
            active = [j for j in sorted(self.islands) if not self._island_done(j)]
            if not active:
                break
            rounds = {j: self.progress[j][0] + 1 for j in active}
            await self.emit("milo.step", {"rounds": {str(j): r for j, r in rounds.items()}})
            await self.run_rounds(rounds)

    async def finish_pending(self) -> None:
        """Complete interventions a crash interrupted (their decision is in the store)."""
        from milo_ray.milo.orchestrator import apply_decision

        for did, p in list(self.decisions.items()):
            if did not in self.decisions_done:
                async with self.orch_lock:
                    await self._guarded(apply_decision(self, did, p["trigger"], p["round"], p["decision"]))

    async def main(self) -> dict[str, Any]:
        resumed = self.ctx.resumed and await self.replay()
        try:
            if not resumed:
                await self.initialize()
            else:
                self.write_missing_rows()
                await self.seed_islands()
                await self.finish_pending()
            if not self.stop:
                await (self.run_lockstep() if self.cfg.round_sync else self.run_free())
        except BudgetExceeded as e:
            self._halt(f"budget: {e}")
        self.store.event("milo.stop", {"reason": self.stop_reason or "finished"})
        from milo_ray.milo.summary import final_summary

        return await final_summary(self)
