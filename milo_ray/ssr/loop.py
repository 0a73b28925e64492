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

Resume (DESIGN §5.11): every decision is a typed event (:mod:`milo_ray.ssr.events`),
stored and folded into :class:`~milo_ray.ssr.state.RecordedRun` in one call by the
run's :class:`~milo_ray.search.events.EventLog`, and a resumed run replays them and
fast-forwards. It re-walks the same deterministic procedure, but every paid step first
asks that projection (:mod:`milo_ray.ssr.state`): a judged record, an evidence order or an optimizer
answer already recorded is read back (children from their stored sources), so no
judge or optimizer call is made twice; only what was in flight at the kill is asked
again. Rollouts come back from the scheduler's cache (never executed again, never
charged), replayed race stages are checked against their records, and rows already
in the store are not written twice (the event log writes once, ``StoreWriter`` the
harness and experience rows).

Agent spend: every judge attempt, optimizer answer and embedder call is recorded in
``agent_calls`` under a deterministic call id. Before a round's judging or candidate
generation starts, the role's cap (``run.budget.roles.<role>``, and the run's
token/USD caps) must allow it; otherwise an ``ssr.role_budget`` event ends the search
and the incumbent is tested (stop reason ``budget:<role>``).

Rollout indices keep executions distinct by purpose: training refreshes use index
0; racing in round t uses 1 + t·R + i (fresh executions per race, so racing never
reuses a training trajectory and a new race never reuses an old race's rewards);
the test split uses 0..test_rollouts-1.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.seeds import derive_seed
from milo_ray.execution.budget import BudgetExceeded
from milo_ray.harness.diff import diff
from milo_ray.harness.model import Harness
from milo_ray.harness.validate import forbidden_fragments_for
from milo_ray.search.events import Event, EventLog
from milo_ray.search.mutation import build_agent
from milo_ray.ssr import evidence as ev
from milo_ray.ssr.children import ChildMaker
from milo_ray.ssr.config import SSRConfig
from milo_ray.ssr.events import (
    SSR_EVENTS, CandidatesChosen, RefreshAborted, RefreshUnaffordable, Refreshed, ResumeMarker, RoleBudget,
    RoundStarted, Selection, StageAborted, StageResult, StageStarted, Stopped, Summarized,
)
from milo_ray.ssr.judging import judge_round
from milo_ray.ssr.plugin import ROLES
from milo_ray.ssr.racing import Race, RaceCandidate, RaceConfig
from milo_ray.ssr.state import RecordedRun, check_parent, check_stage
from milo_ray.ssr.store_io import StoreWriter
from milo_ray.ssr.task_draw import population_rates

METHOD = "ssr"
GROUP = "ssr"


class SSRMethod:
    """Successive Scale Racing (built by Hydra from ``SSRConfig``)."""

    name = METHOD
    agent_roles = ROLES  # checked by the entry point before the run starts

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
        self.calls = ctx.agent_calls
        self.judge = build_agent(agents["judge"])
        self.embedder = build_agent(agents["embedder"])
        optimizer_spec = agents["optimizer"]
        # Its spec's ``name`` when given (as mutators are named), else its class.
        self.optimizer_name = optimizer_name = str(
            getattr(optimizer_spec, "name", None)
            or (optimizer_spec.get("name") or optimizer_spec.get("_target_", "") if isinstance(optimizer_spec, dict)
                else "")).rsplit(".", 1)[-1]
        self.train = self.bench.tasks(cfg.train_split)
        self.val = self.bench.tasks(cfg.val_split)
        if not self.train:
            raise ValueError(f"ssr: benchmark split {cfg.train_split!r} is empty (method.train_split)")
        self.tasks = {t.task_id: t for split in self.bench.splits().values() for t in split}
        self.race_cfg = RaceConfig(cfg.stages, tuple(cfg.b_v) if not isinstance(cfg.b_v, int) else (cfg.b_v,),
                                   cfg.b_s, cfg.b_f, cfg.rollouts, cfg.replace_alpha)
        self.cap = getattr(self.sched.budget, "executions", None)
        self.keys: set[str] = set()  # distinct rollouts this run asked for under the budget
        self.out = StoreWriter(self.store, resumed=bool(ctx.resumed))

        # What earlier sessions decided; kept current as this session decides more. A resumed
        # run re-walks its recorded decisions: their rows are stored already (write once).
        self.recorded = RecordedRun()
        self.events = EventLog(self.store, SSR_EVENTS, apply=self.recorded.apply, write_once=bool(ctx.resumed))
        if ctx.resumed:
            self.events.replay()
        self.children = ChildMaker(cfg=cfg, seed=ctx.seed, optimizer_spec=optimizer_spec, optimizer_name=optimizer_name,
                                   forbidden=forbidden_fragments_for(self.tasks.values()), tasks=self.tasks,
                                   store=self.store, calls=self.calls, emit=self.emit,
                                   work=Path(ctx.run_dir) / "workspace" / "ssr", scope=ctx.session,
                                   env=ctx.agent_env, entry=getattr(self.bench, "artifact_entry", "build_agent"),
                                   sandbox=ctx.sandbox)
        self.harnesses: dict[str, Harness] = {}
        self.generated = 0
        # What method.task_draw reads: every (harness, task, reward) this run executed for
        # its refreshes and races, and the runners of the last race. A resumed run rebuilds
        # both by re-walking its decisions on cached rollouts, so its draws are the same.
        self.cells: list[tuple[str, str, float]] = []
        self.last_runners: set[str] = set()

    def emit(self, ev_: Event) -> None:
        """Store a decision (once) and fold it into the projection."""
        self.events.append(ev_)

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

    def _role_allows(self, role: str, parent: Harness, rnd: int) -> bool:
        """Whether new work of ``role`` may start; if not, record why (once)."""
        if self.calls.allows(role):
            return True
        self.emit(RoleBudget(role, self.calls.exhausted_reason(role) or "refused", round=rnd,
                             harness_id=parent.harness_id))
        return False

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
    def _refresh(self, parent: Harness, rnd: int) -> tuple[dict | None, str | None]:
        """The parent's judged, ordered training evidence, or (None, stop reason)."""
        rec = self.recorded.round(rnd)
        # A round whose judging started was allowed to: finish it without asking again.
        if not rec.judged and not self._role_allows("judge", parent, rnd):
            return None, "budget:judge"
        reqs = [self._req(parent.harness_id, t.task_id, 0, self.cfg.train_split, rnd, "refresh") for t in self.train]
        need = self._charge(reqs)
        if need > self.remaining():
            self.emit(RefreshUnaffordable(rnd, parent.harness_id, need, self.remaining()))
            return None, "budget"
        try:
            results = self._run(reqs)
        except BudgetExceeded as e:
            # A token/cost cap ran out: the incumbent stands, the run stops cleanly.
            self.emit(RefreshAborted(rnd, parent.harness_id, str(e), len(e.partial)))
            return None, "budget"
        self.cells.extend((r.harness_id, r.task_id, r.score) for r in results)
        records = judge_round(judge=self.judge, embedder=self.embedder, results=results, recorded=rec, emit=self.emit,
                              out=self.out, store=self.store, calls=self.calls, parent_id=parent.harness_id, rnd=rnd,
                              retries=self.cfg.judge_retries, workers=self.cfg.judge_workers)
        if rec.refresh is not None:
            order = list(rec.refresh.order)
        else:
            rng = np.random.default_rng(derive_seed(self.ctx.seed, "order", rnd))
            order = ev.order_records(records, self.cfg.ordering_strategy, rng)
        self.emit(Refreshed(rnd, parent.harness_id, len(results), sum(1 for r in results if r.score >= 1.0),
                            float(np.mean([r.score for r in results])), [r.task_id for r in records if not r.ok],
                            order, self.cfg.ordering_strategy.name, len(self.keys)))
        return {"results": results, "records": records, "order": order}, None

    # ------------------------------------------------------------------ candidates
    def _candidates(self, parent: Harness, ev_state: dict, rnd: int) -> tuple[list[RaceCandidate], int] | None:
        """The children that race this round and how many were generated (M), or None
        when the optimizer's cap refuses a round not yet started."""

        cfg, rec = self.cfg, self.recorded.round(rnd)
        if not rec.draws and not self._role_allows("optimizer", parent, rnd):
            return None
        m = cfg.m if cfg.candidate_cap is None else min(cfg.m, cfg.candidate_cap - self.generated)
        sets = self.children.evidence_sets(ev_state["order"], m, rnd)
        drawn, redrawn = self.children.draw(parent, ev_state, sets, rnd, rec)
        self.generated += len(drawn)
        racers: list[RaceCandidate] = []
        seen = {parent.harness_id}
        errors: dict[int, str | None] = {}  # per candidate index, as the event records them
        for o, tasks in zip(drawn, sets):
            a, child, err = o.answer, o.child, o.error
            if child is not None and err is None and child.harness_id in seen:
                err = "duplicate: identical to the parent or to an earlier candidate of this round"
            errors[o.index] = err
            d = diff(parent, child) if child is not None else None
            if child is not None:
                self._add(child, {
                    "parent_id": parent.harness_id, "round": rnd, "origin": "ssr_candidate",
                    "mutator": self.optimizer_name, "evidence_scale": a.scale,
                    "diff_added": d.added, "diff_deleted": d.deleted, "validation_error": err,
                    "extra": {"candidate_index": a.index, "seed": a.seed, "redraws": redrawn.get(a.index, 0),
                              "evidence": cfg.evidence_strategy.name, "ordering": cfg.ordering_strategy.name,
                              "report": a.report},
                })
            if err is None:
                seen.add(child.harness_id)
                racers.append(RaceCandidate(child.harness_id, a.index, tuple(tasks), d.added + d.deleted))
        self.emit(CandidatesChosen(rnd, parent.harness_id, [
            {"index": o.index, "scale": o.answer.scale, "seed": o.answer.seed, "error": errors[o.index],
             "harness_id": o.child.harness_id if o.child else None, "redraws": redrawn.get(o.index, 0)}
            for o in drawn], [c.harness_id for c in racers], cfg.evidence_strategy.name))
        return racers, len(drawn)

    # ------------------------------------------------------------------ racing
    def _race(self, parent: Harness, ev_state: dict, racers: list[RaceCandidate], generated: int, rnd: int):
        rec = self.recorded.round(rnd)
        success = [r.task_id for r in ev_state["results"] if r.score >= 1.0]
        failure = [r.task_id for r in ev_state["results"] if r.score < 1.0]
        # The population whose pass rates steer method.task_draw: the parent and the last
        # race's runners (the parent's rivals and predecessors of the round before).
        rates = population_rates(self.cells, {parent.harness_id} | self.last_runners)
        # Every earlier harness's mean reward per task: the earlier races' matrices a
        # rule fitting the whole matrix (lowrank) may read (the Race drops its own runners).
        by: dict[str, dict[str, list[float]]] = {}
        for h, t, s in self.cells:
            by.setdefault(h, {}).setdefault(t, []).append(s)
        prior = {h: {t: float(np.mean(v)) for t, v in ts.items()} for h, ts in by.items()}
        runners: set[str] = set()
        race = Race(parent.harness_id, racers, order=ev_state["order"], parent_success=success, parent_failure=failure,
                    validation=[t.task_id for t in self.val], config=self.race_cfg,
                    rng=np.random.default_rng(derive_seed(self.ctx.seed, "race", rnd)), generated=generated,
                    rule=self.cfg.racing_strategy, task_draw=self.cfg.task_draw_strategy, rates=rates,
                    prior=prior)
        base = 1 + rnd * self.cfg.rollouts
        splits = {t.task_id: self.cfg.val_split for t in self.val} | {t: self.cfg.train_split for t in success + failure}
        while not self.ctx.out_of_time():
            left = self.remaining()
            req = race.next_stage(None if math.isinf(left) else int(left))
            if req is None:
                break
            started = StageStarted.from_payload(req.payload(), round=rnd, harness_id=parent.harness_id)
            check_stage(rec, started)
            self.emit(started)
            reqs = [self._req(h, t, base + i, splits[t], rnd, f"race-{req.stage}") for h, t, i in req.runs]
            try:
                results = self._run(reqs)
            except BudgetExceeded as e:
                race.abort("budget")
                self.emit(StageAborted(rnd, req.stage, str(e)))
                break
            report = race.record([(r.harness_id, r.task_id, r.rollout_idx - base, r.score) for r in results])
            self.cells.extend((r.harness_id, r.task_id, r.score) for r in results)
            runners.update(req.harnesses)
            result = StageResult.from_payload(report.payload(), round=rnd, harness_id=parent.harness_id)
            check_stage(rec, result)
            self.emit(result)
        if not race.finished and race.stage < self.cfg.stages:
            race.abort("deadline")
        outcome = race.decision()
        self.last_runners = runners
        self.emit(Selection.from_payload(outcome.payload(), round=rnd, harness_id=outcome.selected))
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
            self.emit(ResumeMarker("fast-forwarding through recorded decisions; cached rollouts are reused"))
        initial = self._initial()
        self._add(initial, {"round": 0, "origin": "seed", "name": initial.name})
        parent, ev_state, stall, rnd, stop = initial, None, 0, 0, None
        history: list[dict[str, Any]] = []
        while stop is None:
            if ctx.out_of_time():
                stop = "deadline"
                break
            check_parent(self.recorded.round(rnd), parent.harness_id)
            self.emit(RoundStarted(rnd, parent.harness_id, stall, len(self.keys)))
            if ev_state is None:
                ev_state, stop = self._refresh(parent, rnd)
                if ev_state is None:
                    break
            if cfg.candidate_cap is not None and self.generated >= cfg.candidate_cap:
                stop = "candidate_cap"
                break
            if self._min_stage_cost(ev_state) > self.remaining():
                stop = "budget"
                break
            drawn = self._candidates(parent, ev_state, rnd)
            if drawn is None:
                stop = "budget:optimizer"
                break
            outcome = self._race(parent, ev_state, *drawn, rnd)
            history.append({"round": rnd, "parent": parent.harness_id, "selected": outcome.selected,
                            "replaced": outcome.replaced, "stages": outcome.completed_stages,
                            "parent_score": outcome.parent_score, "best_child_score": outcome.best_child_score})
            if outcome.replaced:
                parent, ev_state, stall = self.harnesses[outcome.selected], None, 0
            else:
                stall += 1
            rnd += 1
            # A race the budget cut short ends the run on the budget, the reason its own
            # selection event records, even when patience ran out in the same round.
            if outcome.stop_reason == "budget" or self.remaining() <= 0:
                stop = "budget"
            elif stall >= cfg.patience:
                stop = "patience"
            elif ctx.out_of_time():
                stop = "deadline"
        self.emit(Stopped(stop, round=rnd, harness_id=parent.harness_id, rounds=rnd, incumbent=parent.harness_id,
                          executions_used=len(self.keys)))
        return self._summary(initial, parent, rnd, stop, history)

    def _summary(self, initial: Harness, final: Harness, rounds: int, stop: str, history: list) -> dict[str, Any]:
        """The run's summary: search facts, the test-split leaderboard rows of the final
        (and, with ``evaluate_initial``, the initial) harness in ``final_test``
        (``HarnessScore.as_dict()``; ``test_final``/``test_initial`` name the same rows),
        and the benchmark's ground truth when it has one."""
        from milo_ray.search.final_test import FinalTest, true_quality
        from milo_ray.search.plugin import SPEC_KEY

        cfg = self.cfg
        # Ground truth (the surrogate's exact expected quality) when the benchmark has it.
        truth = {h.harness_id: true_quality(self.bench, h, cfg.test_split) for h in (initial, final)}
        summary: dict[str, Any] = {
            "method": METHOD, "initial_harness": initial.harness_id, "final_harness": final.harness_id,
            "improved": final.harness_id != initial.harness_id, "rounds": rounds, "stop_reason": stop,
            "executions_used": len(self.keys), "execution_budget": self.cap, "candidates_generated": self.generated,
            "history": history, "evidence": cfg.evidence_strategy.name, "ordering": cfg.ordering_strategy.name,
            "racing": cfg.racing_strategy.name, "task_draw": cfg.task_draw_strategy.name,
            "spend_by_role": self.calls.by_role(),
        }
        to_test = [("ssr final", final)]
        if cfg.evaluate_initial and initial.harness_id != final.harness_id:
            to_test.append(("ssr initial", initial))
        # Outside the budget B: the test split never informs a decision.
        final_test = FinalTest(self.sched, self.bench, split=cfg.test_split, k=cfg.test_rollouts, seed=self.ctx.seed,
                               method=METHOD, stage="test", group=GROUP)
        rows = [r.as_dict() for r in final_test.rows(to_test, round=rounds)]
        for (label, _), row in zip(to_test, rows):
            summary[f"test_{label.split()[1]}"] = row
        if rows and initial.harness_id == final.harness_id:
            summary["test_initial"] = summary["test_final"]  # the same harness: tested once
        summary["final_test"] = rows
        summary["final_test_held_out"] = [r.as_dict() for r in final_test.held_out]
        summary[SPEC_KEY] = final_test.record()
        for label, h in (("initial", initial), ("final", final)):
            tq = truth[h.harness_id]
            if tq is not None:
                summary[f"{label}_true_quality"] = float(tq["score"])
                if "resolve_rate" in tq:
                    summary[f"{label}_true_resolve"] = float(tq["resolve_rate"])
        # Spend holds wall-clock seconds: the agent_calls table is its record, not this event
        # (a resumed run must store the same summary event as an uninterrupted one).
        self.emit(Summarized({k: v for k, v in summary.items() if k not in ("history", "spend_by_role")},
                             round=rounds, harness_id=final.harness_id))
        self.store.flush()
        return summary
