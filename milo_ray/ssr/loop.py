"""SSR's driver: recursive evolution of one incumbent harness (SSR §4.4; DESIGN §4.3).

``SSRMethod.run(ctx)`` carries out every decision the pure parts make:

round t: (after an accepted update, or at t = 0) refresh the parent on all N training
tasks (1 rollout each; stop and return the incumbent if the budget cannot cover
all N), judge + embed + order the records; generate M candidates from the evidence
sets (fresh derived seeds every round); race them against the protected parent;
accept the winner only on a strictly higher cumulative score. Stop at budget
exhaustion, the deadline, the candidate cap, or P rounds without strict improvement.
Finally test the final (and initial) harness (``test_rollouts`` per task, outside the
budget, ``count_budget=False``) and return a summary.

Budget: B (= the scheduler ledger's execution cap) counts training refreshes and all
racing executions. The method keeps its own count of the distinct rollouts it asked
for, so every budget decision depends only on the run's own history — this is what
makes a resumed run replay the same decisions.

Resume: a resumed run re-executes this deterministic procedure with the same seed.
Finished rollouts come back from the scheduler's cache (never executed again, never
charged), the offline agents reproduce their answers, and rows already in the store
(harnesses, experience, events) are not written twice. Judge and optimizer calls are
repeated; with LLM agents their answers may differ, so a resumed LLM run continues
from the same rollouts but may take a different path from there.

Rollout indices keep executions distinct by purpose: training refreshes use index
0; racing in round t uses 1 + t·R + i (fresh executions per race, so racing never
reuses a training trajectory and a new race never reuses an old race's rewards);
the test split uses 0..test_rollouts-1.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from milo_ray.agents.protocols import MutationRequest
from milo_ray.execution.budget import BudgetExceeded
from milo_ray.execution.types import RolloutRequest
from milo_ray.harness.model import Harness
from milo_ray.ssr import evidence as ev
from milo_ray.ssr.candidates import CandidateJob, build_agent, generate_candidates
from milo_ray.ssr.config import SSRConfig
from milo_ray.ssr.racing import Race, RaceCandidate, RaceConfig, UniformRace
from milo_ray.search.seeds import derive_seed
from milo_ray.ssr.store_io import StoreWriter

METHOD = "ssr"
GROUP = "ssr"


def _duplicates(parent: Harness, outcomes: list[Any]) -> list[int]:
    """Indices of valid children identical to the parent or to an earlier candidate."""
    seen, dups = {parent.harness_id}, []
    for o in outcomes:
        if o.child is None or o.error is not None:
            continue
        if o.child.harness_id in seen:
            dups.append(o.index)
        else:
            seen.add(o.child.harness_id)
    return dups


class SSRMethod:
    """Successive Scale Racing (built by Hydra from ``SSRConfig``)."""

    name = METHOD
    agent_roles = ("judge", "optimizer", "embedder")  # checked by the entry point before the run starts

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("_target_", None)
        self.cfg = SSRConfig(**kwargs)

    def preflight(self, benchmark: Any, agents: dict[str, Any]) -> None:
        """Refuse a benchmark or backend this config cannot run on (before anything is written)."""
        self.cfg.for_run(benchmark, agents)

    def run(self, ctx: Any) -> dict[str, Any]:
        return _SSRRun(self.cfg, ctx).execute()


class _SSRRun:
    def __init__(self, cfg: SSRConfig, ctx: Any) -> None:
        agents = dict(ctx.agents or {})
        cfg = cfg.for_run(ctx.benchmark, agents)
        self.cfg, self.ctx = cfg, ctx
        self.sched, self.store, self.bench = ctx.scheduler, ctx.store, ctx.benchmark
        self.judge = build_agent(agents["judge"])
        self.embedder = build_agent(agents["embedder"])
        self.optimizer_spec = agents["optimizer"]
        self.optimizer_name = str(getattr(self.optimizer_spec, "name", None) or
                                  (self.optimizer_spec.get("_target_", "") if isinstance(self.optimizer_spec, dict) else "")
                                  ).rsplit(".", 1)[-1]
        self.train = self.bench.tasks(cfg.train_split)
        self.val = self.bench.tasks(cfg.val_split)
        if not self.train:
            raise ValueError(f"ssr: benchmark split {cfg.train_split!r} is empty (method.train_split)")
        self.tasks = {t.task_id: t for split in self.bench.splits().values() for t in split}
        from milo_ray.harness.validate import forbidden_fragments_for

        self.forbidden = forbidden_fragments_for(self.tasks.values())
        self.race_cfg = RaceConfig(cfg.stages, tuple(cfg.b_v) if not isinstance(cfg.b_v, int) else (cfg.b_v,),
                                   cfg.b_s, cfg.b_f, cfg.rollouts)
        self.cap = getattr(self.sched.budget, "executions", None)
        self.keys: set[str] = set()  # distinct rollouts this run asked for under the budget
        self.out = StoreWriter(self.store, resumed=bool(ctx.resumed))
        self.work = Path(ctx.run_dir) / "workspace" / "ssr"
        self.harnesses: dict[str, Harness] = {}
        self.generated = 0

    # ------------------------------------------------------------------ budget
    def remaining(self) -> float:
        return math.inf if self.cap is None else max(0, self.cap - len(self.keys))

    def _charge(self, reqs: list[RolloutRequest]) -> int:
        return sum(1 for k in {r.key(self.sched.model_id) for r in reqs} if k not in self.keys)

    def _run(self, reqs: list[RolloutRequest]) -> list[Any]:
        try:
            results = self.sched.run(reqs)
        except BudgetExceeded as e:
            # Only what finished was executed (and charged); a refused batch charged nothing.
            self.keys.update(reqs[i].key(self.sched.model_id) for i in e.partial)
            raise
        self.keys.update(r.key(self.sched.model_id) for r in reqs)
        return results

    def _req(self, h: str, t: str, i: int, split: str, rnd: int, stage: str) -> RolloutRequest:
        return RolloutRequest(h, t, i, self.ctx.seed, split=split, method=METHOD, round=rnd, stage=stage, group=GROUP)

    # ------------------------------------------------------------------ harnesses
    def _add(self, h: Harness, row: dict[str, Any]) -> None:
        self.harnesses[h.harness_id] = h
        self.sched.add_harness(h)
        self.out.harness(h, row)

    def _initial(self) -> Harness:
        seeds = self.bench.seed_harnesses()
        if not seeds:
            raise ValueError("ssr: the benchmark has no seed harness to start from")
        if not self.cfg.initial:
            return seeds[0]
        for h in seeds:
            if h.name == self.cfg.initial:
                return h
        raise ValueError(f"method.initial={self.cfg.initial!r}: no such seed; choose one of {[h.name for h in seeds]}")

    # ------------------------------------------------------------------ evidence
    def _refresh(self, parent: Harness, rnd: int):
        reqs = [self._req(parent.harness_id, t.task_id, 0, self.cfg.train_split, rnd, "refresh") for t in self.train]
        need = self._charge(reqs)
        if need > self.remaining():
            self.out.event("ssr.refresh_unaffordable", {"needed": need, "remaining": self.remaining()}, round=rnd,
                           harness_id=parent.harness_id)
            return None
        try:
            results = self._run(reqs)
        except BudgetExceeded as e:
            # A token/cost cap ran out: the incumbent stands, the run stops cleanly.
            self.out.event("ssr.refresh_aborted", {"reason": str(e), "finished": len(e.partial)}, round=rnd,
                           harness_id=parent.harness_id)
            return None
        items = ev.judge_items(results, self.store)
        records = ev.judge_records(self.judge, items, round=rnd, harness_id=parent.harness_id,
                                   retries=self.cfg.judge_retries, workers=self.cfg.judge_workers)
        ev.embed_records(records, self.embedder)
        rng = np.random.default_rng(derive_seed(self.ctx.seed, "order", rnd))
        order = ev.order_records(records, self.cfg.ordering, rng)
        self.out.experience(records)
        failures = [r.task_id for r in records if not r.ok]
        self.out.event("ssr.refresh", {
            "tasks": len(results), "resolved": sum(1 for r in results if r.score >= 1.0),
            "mean_score": float(np.mean([r.score for r in results])), "judge_failures": failures,
            "order": order, "ordering": self.cfg.ordering, "executions_used": len(self.keys),
        }, round=rnd, harness_id=parent.harness_id)
        return {"results": results, "records": records, "order": order}

    # ------------------------------------------------------------------ candidates
    def _candidates(self, parent: Harness, ev_state: dict, rnd: int) -> tuple[list[RaceCandidate], int]:
        """The children that race this round, and how many were generated (M)."""
        from milo_ray.harness.diff import diff
        from milo_ray.harness.evidence import write_evidence_dir

        cfg = self.cfg
        m = cfg.m if cfg.candidate_cap is None else min(cfg.m, cfg.candidate_cap - self.generated)
        rng = np.random.default_rng(derive_seed(self.ctx.seed, "evidence", rnd))
        sets = ev.evidence_sets(ev_state["order"], cfg.scales, cfg.evidence, rng)[:m]
        by_task = {r.task_id: r for r in ev_state["records"]}
        res_by_task = {r.task_id: r for r in ev_state["results"]}
        rdir = self.work / f"round-{rnd:03d}"
        parent_dir = parent.write_to(rdir / "parent")
        jobs = []
        for i, tasks in enumerate(sets):
            cdir = rdir / f"candidate-{i}"
            recs = [by_task[t] for t in tasks]
            edir = write_evidence_dir(cdir / "evidence", parent, [res_by_task[t] for t in tasks], self.tasks, self.store)
            (cdir / "work").mkdir(parents=True, exist_ok=True)
            memory = ev.render_memory(recs, k=len(tasks), n=len(ev_state["order"]), evidence_dir=str(edir))
            seed = derive_seed(self.ctx.seed, "candidate", rnd, i)
            req = MutationRequest(parent=parent, parent_dir=parent_dir, evidence_dir=Path(edir), memory_markdown=memory,
                                  workdir=cdir / "work", seed=seed,
                                  context={"records": [r.as_dict() for r in recs], "scale": len(tasks),
                                           "round": rnd, "candidate_index": i, "method": METHOD})
            jobs.append(CandidateJob(i, len(tasks), req))
        outcomes = self._generate(jobs)
        redrawn: dict[int, int] = {}
        for attempt in range(1, cfg.duplicate_retries + 1):
            # An optimizer given the same evidence twice (topk_fixed, fixed_n) may write the
            # same child twice; re-drawing it with a fresh seed, as an LLM sampled again
            # would, keeps M distinct racers under every evidence strategy.
            dups = _duplicates(parent, outcomes)
            if not dups:
                break
            again = [CandidateJob(i, jobs[i].scale, replace(jobs[i].request, seed=derive_seed(
                self.ctx.seed, "candidate", rnd, i, attempt))) for i in dups]
            for o in self._generate(again):
                outcomes[o.index] = o
                redrawn[o.index] = attempt
        self.generated += len(outcomes)
        racers: list[RaceCandidate] = []
        seen = {parent.harness_id}
        for o, tasks in zip(outcomes, sets):
            err = o.error
            if o.child is not None and err is None and o.child.harness_id in seen:
                err = "duplicate: identical to the parent or to an earlier candidate of this round"
            d = diff(parent, o.child) if o.child is not None else None
            if o.child is not None:
                self._add(o.child, {
                    "parent_id": parent.harness_id, "round": rnd, "origin": "ssr_candidate",
                    "mutator": self.optimizer_name, "evidence_scale": o.scale,
                    "diff_added": d.added, "diff_deleted": d.deleted, "validation_error": err,
                    "extra": {"candidate_index": o.index, "seed": o.seed, "redraws": redrawn.get(o.index, 0),
                              "evidence": cfg.evidence,
                              "ordering": cfg.ordering, "report": o.report[:2000], "seconds": o.seconds},
                })
            if err is None:
                seen.add(o.child.harness_id)
                racers.append(RaceCandidate(o.child.harness_id, o.index, tuple(tasks), d.added + d.deleted))
        self.out.event("ssr.candidates", {
            "generated": [{"index": o.index, "scale": o.scale, "seed": o.seed, "harness_id": o.child.harness_id
                           if o.child else None, "error": o.error, "redraws": redrawn.get(o.index, 0)}
                          for o in outcomes],
            "racing": [c.harness_id for c in racers], "evidence": cfg.evidence,
        }, round=rnd, harness_id=parent.harness_id)
        return racers, len(outcomes)

    def _generate(self, jobs: list[CandidateJob]) -> list[Any]:
        return generate_candidates(self.optimizer_spec, jobs, forbidden=self.forbidden,
                                   timeout_s=self.cfg.validate_timeout_s,
                                   max_concurrent=self.cfg.max_concurrent_candidates)

    # ------------------------------------------------------------------ racing
    def _race(self, parent: Harness, ev_state: dict, racers: list[RaceCandidate], generated: int, rnd: int):
        cls = UniformRace if self.cfg.racing == "uniform" else Race
        success = [r.task_id for r in ev_state["results"] if r.score >= 1.0]
        failure = [r.task_id for r in ev_state["results"] if r.score < 1.0]
        race = cls(parent.harness_id, racers, order=ev_state["order"], parent_success=success, parent_failure=failure,
                   validation=[t.task_id for t in self.val], config=self.race_cfg,
                   rng=np.random.default_rng(derive_seed(self.ctx.seed, "race", rnd)), generated=generated)
        base = 1 + rnd * self.cfg.rollouts
        splits = {t.task_id: self.cfg.val_split for t in self.val} | {t: self.cfg.train_split for t in success + failure}
        while not self.ctx.out_of_time():
            left = self.remaining()
            req = race.next_stage(None if math.isinf(left) else int(left))
            if req is None:
                break
            self.out.event("ssr.stage", req.payload(), round=rnd, harness_id=parent.harness_id)
            reqs = [self._req(h, t, base + i, splits[t], rnd, f"race-{req.stage}") for h, t, i in req.runs]
            try:
                results = self._run(reqs)
            except BudgetExceeded as e:
                race.abort("budget")
                self.out.event("ssr.stage_aborted", {"stage": req.stage, "reason": str(e)}, round=rnd)
                break
            report = race.record([(r.harness_id, r.task_id, r.rollout_idx - base, r.score) for r in results])
            self.out.event("ssr.stage_result", report.payload(), round=rnd, harness_id=parent.harness_id)
        if not race.finished and race.stage < self.cfg.stages:
            race.abort("deadline")
        outcome = race.decision()
        self.out.event("ssr.selection", outcome.payload(), round=rnd, harness_id=outcome.selected)
        return outcome

    # ------------------------------------------------------------------ main loop
    def _min_stage_cost(self, ev_state: dict) -> int:
        """Cheapest possible first stage (one child + the parent), to skip generating
        candidates that could never race."""
        n_s = sum(1 for r in ev_state["results"] if r.score >= 1.0)
        n_f = len(ev_state["results"]) - n_s
        b1 = min(self.race_cfg.b_v[0], len(self.val)) + min(self.cfg.b_s, n_s) + min(self.cfg.b_f, n_f)
        return self.cfg.rollouts * 2 * b1

    def execute(self) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        if ctx.resumed:
            self.out.event("ssr.resume", {"note": "replaying deterministic decisions; cached rollouts are reused"})
        initial = self._initial()
        self._add(initial, {"round": 0, "origin": "seed", "name": initial.name})
        parent, ev_state, stall, rnd, stop = initial, None, 0, 0, None
        history: list[dict[str, Any]] = []
        while stop is None:
            if ctx.out_of_time():
                stop = "deadline"
                break
            if ev_state is None:
                ev_state = self._refresh(parent, rnd)
                if ev_state is None:
                    stop = "budget"
                    break
            if cfg.candidate_cap is not None and self.generated >= cfg.candidate_cap:
                stop = "candidate_cap"
                break
            if self._min_stage_cost(ev_state) > self.remaining():
                stop = "budget"
                break
            racers, generated = self._candidates(parent, ev_state, rnd)
            outcome = self._race(parent, ev_state, racers, generated, rnd)
            history.append({"round": rnd, "parent": parent.harness_id, "selected": outcome.selected,
                            "replaced": outcome.replaced, "stages": outcome.completed_stages,
                            "parent_score": outcome.parent_score, "best_child_score": outcome.best_child_score})
            if outcome.replaced:
                parent, ev_state, stall = self.harnesses[outcome.selected], None, 0
            else:
                stall += 1
            rnd += 1
            if stall >= cfg.patience:
                stop = "patience"
            elif outcome.stop_reason == "budget" or self.remaining() <= 0:
                stop = "budget"
            elif ctx.out_of_time():
                stop = "deadline"
        self.out.event("ssr.stop", {"reason": stop, "rounds": rnd, "incumbent": parent.harness_id,
                                    "executions_used": len(self.keys)}, round=rnd, harness_id=parent.harness_id)
        return self._summary(initial, parent, rnd, stop, history)

    def _summary(self, initial: Harness, final: Harness, rounds: int, stop: str, history: list) -> dict[str, Any]:
        """The run's summary: search facts, the test-split leaderboard rows of the final
        (and, with ``evaluate_initial``, the initial) harness in ``final_test``
        (``HarnessScore.as_dict()``; ``test_final``/``test_initial`` name the same rows),
        and the benchmark's ground truth when it has one."""
        from milo_ray.evaluation import summarize

        cfg = self.cfg
        # Ground truth (the surrogate's exact expected quality) when the benchmark has it.
        truth = {h.harness_id: self.bench.true_quality(h, cfg.test_split) for h in (initial, final)} \
            if hasattr(self.bench, "true_quality") else {}
        summary: dict[str, Any] = {
            "method": METHOD, "initial_harness": initial.harness_id, "final_harness": final.harness_id,
            "improved": final.harness_id != initial.harness_id, "rounds": rounds, "stop_reason": stop,
            "executions_used": len(self.keys), "execution_budget": self.cap, "candidates_generated": self.generated,
            "history": history, "evidence": cfg.evidence, "ordering": cfg.ordering, "racing": cfg.racing,
        }
        test_ids = [t.task_id for t in self.bench.tasks(cfg.test_split)]
        to_test = [("final", final)]
        if cfg.evaluate_initial and initial.harness_id != final.harness_id:
            to_test.append(("initial", initial))
        rows = []
        for label, h in to_test if test_ids else []:
            reqs = [self._req(h.harness_id, t, i, cfg.test_split, rounds, "test")
                    for t in test_ids for i in range(cfg.test_rollouts)]
            # Outside the budget B: the test split never informs a decision.
            results = self.sched.run(reqs, count_budget=False)
            row = summarize(f"ssr {label}", h, results, test_ids, cfg.test_rollouts,
                            true_score=float(truth[h.harness_id]["score"]) if truth else None).as_dict()
            rows.append(row)
            summary[f"test_{label}"] = row
        if rows and initial.harness_id == final.harness_id:
            summary["test_initial"] = summary["test_final"]  # the same harness: tested once
        summary["final_test"] = rows
        if truth:
            for label, h in (("initial", initial), ("final", final)):
                tq = truth[h.harness_id]
                summary[f"{label}_true_quality"] = float(tq["score"])
                if "resolve_rate" in tq:
                    summary[f"{label}_true_resolve"] = float(tq["resolve_rate"])
        self.out.event("ssr.summary", {k: v for k, v in summary.items() if k != "history"}, round=rounds,
                       harness_id=final.harness_id)
        self.store.flush()
        return summary
