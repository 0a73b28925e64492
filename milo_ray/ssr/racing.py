"""Candidate performance racing (SSR §4.3, App. 9): a pure decision object.

``Race`` decides, stage by stage, which tasks form the shared batch, who runs them,
who is eliminated and who wins. It never executes anything and never calls Ray: the
driver (``milo_ray.ssr.loop``) asks ``next_stage(remaining_budget)`` for a
``StageRequest``, runs the listed (harness, task, rollout) triples through the
scheduler, hands the rewards back with ``record`` and finally reads ``decision()``.
This is the Ray Tune ``TrialScheduler`` split: policies return decisions, drivers
carry them out, so every rule below is unit-tested without a cluster.

Rules (DESIGN §4.3):
* Stage batch B_r = b_v[r] unused validation tasks (prefixes of one order drawn at
  construction: a uniform permutation, i.e. uniform without replacement, unless a
  ``task_draw`` orders the pool by the population's pass rates) + b_s
  parent-success and b_f parent-failure training tasks. Each training class is taken
  first from the intersection of the surviving candidates' evidence sets in RER
  order, then from outside it in RER order (tasks missing from the ordering, e.g. a
  judge failure, come last in the order given); never a task used earlier in the
  round; a short class is not refilled from the other class. A ``task_draw`` other than
  the uniform one puts its preferred tasks first within each of those two parts (RER
  order breaking its ties).
* Every surviving child and the protected parent run every task of B_r R times.
* Cumulative score = mean reward over every (task, rollout) of P_r = B_1 ∪ … ∪ B_r.
* After an intermediate stage r < K the racing rule (a ``RacingRule`` object, chosen by
  ``method.racing``) says which children stay and whether the race stops early:
  successive halving keeps n_r = max(1, M − round(r·M/K)) (round half up; the paper's),
  ``halving`` keeps ⌈M/2^r⌉, ``paired`` drops every child significantly worse than the
  leader on paired per-task differences and stops at one survivor, the uniform
  ablation keeps all. Ranking ties: higher score, fewer diff lines, lower index.
* A stage starts only if R·(|A|+1)·|B_r| fits the remaining budget; otherwise the
  race ends and selects on the last completed stage (none → keep the parent).
* The best surviving child replaces the parent only on a strictly higher score (and,
  with ``replace_alpha`` set, a significant paired advantage over the parent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from milo_ray.ssr.racing_rules import (RACING_RULES, GeometricHalving, NoElimination, PairedElimination, RacingRule,
                                       RuleDecision, StageView, SuccessiveHalving, keep_count, paired_t, t_critical)
from milo_ray.ssr.task_draw import Rates, TaskDraw, UniformDraw

__all__ = ["RACING_RULES", "GeometricHalving", "NoElimination", "PairedElimination", "Race", "RaceCandidate",
           "RaceConfig", "RaceOutcome", "RacingRule", "RuleDecision", "StageView", "SuccessiveHalving", "UniformRace",
           "keep_count", "paired_t", "t_critical"]

Run = tuple[str, str, int]  # (harness_id, task_id, rollout_idx)


@dataclass(frozen=True)
class RaceCandidate:
    """One child: its harness id, fixed candidate index, evidence set and diff size.

    ``evidence`` is the tuple of training task ids whose records produced the child
    (an RER prefix for SSR proper; any subset for the fixed-strategy ablations).
    ``diff_size`` is added + deleted lines relative to the parent.
    """

    harness_id: str
    index: int
    evidence: tuple[str, ...]
    diff_size: int = 0


@dataclass(frozen=True)
class RaceConfig:
    """K stages, per-stage validation quota b_v, class quotas b_s/b_f, R rollouts.

    ``replace_alpha``: the parent-replacement gate (None: off, the paper's rule). When
    set, the best child replaces the parent only when, besides a strictly higher
    cumulative score, its paired per-task difference to the parent is significantly
    positive (one-sided paired t test at this level over the tasks raced): fewer
    regressions accepted on noise, more true improvements left on the table."""

    stages: int = 2
    b_v: tuple[int, ...] = (10, 10)
    b_s: int = 5
    b_f: int = 5
    rollouts: int = 2
    replace_alpha: float | None = None

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"race.stages must be >= 1, got {self.stages}")
        b_v = tuple(int(x) for x in (self.b_v if isinstance(self.b_v, Sequence) else [self.b_v]))
        if len(b_v) == 1 and self.stages > 1:
            b_v = b_v * self.stages  # one number means the same quota every stage
        if len(b_v) != self.stages:
            raise ValueError(f"race.b_v must have one entry per stage ({self.stages}), got {list(b_v)}")
        object.__setattr__(self, "b_v", b_v)
        if min(b_v + (self.b_s, self.b_f)) < 0:
            raise ValueError("race quotas b_v, b_s, b_f must be >= 0")
        if self.rollouts < 1:
            raise ValueError(f"race.rollouts (R) must be >= 1, got {self.rollouts}")
        if self.replace_alpha is not None and not 0.0 < float(self.replace_alpha) < 0.5:
            raise ValueError(f"race.replace_alpha must be in (0, 0.5) or null, got {self.replace_alpha}")


@dataclass(frozen=True)
class BatchComposition:
    """The tasks of one stage, by source, plus how many training tasks came from the
    survivors' evidence intersection (the rest came from outside it)."""

    validation: tuple[str, ...]
    success: tuple[str, ...]
    failure: tuple[str, ...]
    success_in_intersection: int = 0
    failure_in_intersection: int = 0

    @property
    def tasks(self) -> tuple[str, ...]:
        return self.validation + self.success + self.failure

    def payload(self) -> dict[str, Any]:
        return {
            "validation": list(self.validation),
            "success": list(self.success),
            "failure": list(self.failure),
            "success_in_intersection": self.success_in_intersection,
            "failure_in_intersection": self.failure_in_intersection,
        }


@dataclass(frozen=True)
class StageRequest:
    """Stage ``stage`` (1-based): the batch, the harnesses that run it (surviving
    children by candidate index, then the parent) and the runs to execute."""

    stage: int
    batch: BatchComposition
    harnesses: tuple[str, ...]
    runs: tuple[Run, ...]

    @property
    def executions(self) -> int:
        return len(self.runs)

    def payload(self) -> dict[str, Any]:
        return {"stage": self.stage, "batch": self.batch.payload(), "harnesses": list(self.harnesses),
                "executions": self.executions}


@dataclass(frozen=True)
class StageReport:
    """After a completed stage: cumulative scores of every harness that ran it, the
    children eliminated and the children still racing."""

    stage: int
    scores: dict[str, float]
    eliminated: tuple[str, ...]
    survivors: tuple[str, ...]
    cumulative_tasks: int

    def payload(self) -> dict[str, Any]:
        return {"stage": self.stage, "scores": dict(self.scores), "eliminated": list(self.eliminated),
                "survivors": list(self.survivors), "cumulative_tasks": self.cumulative_tasks}


@dataclass(frozen=True)
class RaceOutcome:
    """The race's decision. ``selected`` is the new incumbent (the parent when kept).

    ``stop_reason``: ``completed`` (all K stages ran), ``settled`` (the racing rule
    stopped early, e.g. one child left under ``paired``), ``budget`` (a stage did not
    fit), ``exhausted`` (no unused task left for the next stage), ``no_candidates``.
    """

    parent_id: str
    selected: str
    replaced: bool
    completed_stages: int
    stop_reason: str
    parent_score: float | None
    best_child: str | None
    best_child_score: float | None
    executions: int
    scores: dict[str, float] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return {
            "parent_id": self.parent_id, "selected": self.selected, "replaced": self.replaced,
            "completed_stages": self.completed_stages, "stop_reason": self.stop_reason,
            "parent_score": self.parent_score, "best_child": self.best_child,
            "best_child_score": self.best_child_score, "executions": self.executions,
            "scores": dict(self.scores),
        }


class Race:
    """A race of M children against a protected parent, successive halving unless
    another ``rule`` is given.

    Parameters
    ----------
    parent_id: the incumbent H_t (always runs, never eliminated, never counted in n_r).
    candidates: the M children (distinct harness ids, none equal to the parent).
    order: training task ids in RER order (π); tasks of the success/failure sets that
        are absent from it are used after it, in the order the sets were given.
    parent_success / parent_failure: the parent's training outcome labels, fixed for
        the round.
    validation: validation task ids.
    config: ``RaceConfig``.
    rng: seeded ``numpy.random.Generator`` (only used to permute the validation pool).
    generated: the M children generated this round when some of them did not make it
        to the race (invalid, duplicate); the keep counts n_r are based on M
        (default: ``len(candidates)``).
    rule: the ``RacingRule`` saying how many children survive each intermediate stage
        (default: successive halving).
    task_draw: how the pools are ordered for drawing (:mod:`milo_ray.ssr.task_draw`;
        default: uniform, the paper's), from ``rates``: the current population's pass
        rate and observed executions per task (the driver computes them each round).
    prior: earlier harnesses' mean reward per task (earlier races of the same pool),
        shown to the rule as :attr:`StageView.prior` on the tasks raced so far.
    """

    def __init__(
        self,
        parent_id: str,
        candidates: Sequence[RaceCandidate],
        *,
        order: Sequence[str],
        parent_success: Iterable[str],
        parent_failure: Iterable[str],
        validation: Sequence[str],
        config: RaceConfig,
        rng: np.random.Generator,
        generated: int | None = None,
        rule: RacingRule | None = None,
        task_draw: TaskDraw | None = None,
        rates: Rates | None = None,
        prior: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        self.rule: RacingRule = SuccessiveHalving() if rule is None else rule
        self.task_draw: TaskDraw = UniformDraw() if task_draw is None else task_draw
        rates = {} if rates is None else dict(rates)
        ids = [c.harness_id for c in candidates]
        if generated is not None and generated < len(ids):
            raise ValueError(f"race: generated={generated} is fewer than the {len(ids)} candidates racing")
        # M of the keep counts n_r: the children generated this round, including any
        # that failed validation (they count as eliminated before the first stage).
        self.generated = len(ids) if generated is None else generated
        if len(set(ids)) != len(ids):
            raise ValueError("race candidates: duplicate harness ids (deduplicate identical children first)")
        if parent_id in ids:
            raise ValueError("race candidates: a child identical to the parent cannot race against it")
        self.parent_id = parent_id
        # Earlier harnesses' per-task means (not this race's runners), for rules that fit the matrix.
        self._prior = {h: dict(v) for h, v in (prior or {}).items() if h != parent_id and h not in ids}
        self.candidates = sorted(candidates, key=lambda c: c.index)
        self.config = config
        success, failure = list(dict.fromkeys(parent_success)), list(dict.fromkeys(parent_failure))
        if set(success) & set(failure):
            raise ValueError("race: a training task cannot be both a parent success and a parent failure")
        rank = {t: i for i, t in enumerate(dict.fromkeys(order))}
        # Tasks not in the ordering follow it, keeping the order the caller gave.
        tail = {t: len(rank) + i for i, t in enumerate(success + failure) if t not in rank}
        self._rank = {**rank, **tail}
        # The draw's preference first, RER order within it (the uniform draw's key is constant).
        self._success = sorted(success, key=lambda t: (self.task_draw.key(rates.get(t)), self._rank[t]))
        self._failure = sorted(failure, key=lambda t: (self.task_draw.key(rates.get(t)), self._rank[t]))
        self._val_perm = self.task_draw.order(list(validation), rates, rng)
        self._val_pos = 0
        self._used: set[str] = set()
        self._active: list[RaceCandidate] = list(self.candidates)
        self._rewards: dict[tuple[str, str], list[float]] = {}
        self._tasks: list[str] = []  # P_r, cumulative
        self._pending: StageRequest | None = None
        self._reports: list[StageReport] = []
        self._stop_reason: str | None = None if self.candidates else "no_candidates"
        self._executions = 0

    # ----------------------------------------------------------------- state
    @property
    def stage(self) -> int:
        """Number of completed stages."""
        return len(self._reports)

    @property
    def active(self) -> list[RaceCandidate]:
        return list(self._active)

    @property
    def reports(self) -> list[StageReport]:
        return list(self._reports)

    @property
    def finished(self) -> bool:
        return self._stop_reason is not None

    @property
    def executions(self) -> int:
        return self._executions

    # ----------------------------------------------------------------- batches
    def _take_class(self, pool: list[str], quota: int, inter: set[str]) -> tuple[list[str], int]:
        free = [t for t in pool if t not in self._used]
        inside = [t for t in free if t in inter]
        outside = [t for t in free if t not in inter]
        picked = (inside + outside)[:quota]
        return picked, sum(1 for t in picked if t in inter)

    def _compose(self, r: int) -> BatchComposition:
        cfg = self.config
        # Validation: the next unused positions of the fixed uniform permutation.
        val = []
        while len(val) < cfg.b_v[r - 1] and self._val_pos < len(self._val_perm):
            t = self._val_perm[self._val_pos]
            self._val_pos += 1
            if t not in self._used:
                val.append(t)
        evidence_sets = [set(c.evidence) for c in self._active]
        inter = set.intersection(*evidence_sets) if evidence_sets else set()
        succ, s_in = self._take_class(self._success, cfg.b_s, inter)
        fail, f_in = self._take_class(self._failure, cfg.b_f, inter)
        return BatchComposition(tuple(val), tuple(succ), tuple(fail), s_in, f_in)

    def _runners(self) -> tuple[str, ...]:
        return tuple(c.harness_id for c in self._active) + (self.parent_id,)

    def next_stage(self, remaining_budget: int | None = None) -> StageRequest | None:
        """The next stage to run, or None when the race is over.

        ``remaining_budget`` is the number of executions still allowed (None =
        unlimited). A stage that does not fit is not started and ends the race.
        Calling again before ``record`` returns the same pending request.
        """
        if self._pending is not None:
            return self._pending
        if self.finished:
            return None
        r = self.stage + 1
        if r > self.config.stages:
            self._stop_reason = "completed"
            return None
        # Composition is computed on a copy of the cursor so a refused stage leaves
        # no trace (the race simply ends on the last completed stage).
        saved = (self._val_pos,)
        batch = self._compose(r)
        if not batch.tasks:
            self._val_pos, = saved
            self._stop_reason = "exhausted"
            return None
        runners = self._runners()
        need = self.config.rollouts * len(runners) * len(batch.tasks)
        if remaining_budget is not None and need > remaining_budget:
            self._val_pos, = saved
            self._stop_reason = "budget"
            return None
        runs = tuple((h, t, i) for h in runners for t in batch.tasks for i in range(self.config.rollouts))
        self._used.update(batch.tasks)
        self._pending = StageRequest(r, batch, runners, runs)
        return self._pending

    # ----------------------------------------------------------------- results
    def record(self, results: Iterable[Any]) -> StageReport:
        """Feed the pending stage's rewards and apply eliminations.

        ``results``: objects with ``harness_id``, ``task_id``, ``rollout_idx``,
        ``score`` (e.g. ``RolloutResult``) or (harness_id, task_id, rollout_idx, score)
        tuples. Every requested run must be present exactly once; a partial stage
        never enters the cumulative comparison.
        """
        req = self._pending
        if req is None:
            raise RuntimeError("Race.record: no stage pending (call next_stage first)")
        got: dict[Run, float] = {}
        for res in results:
            if isinstance(res, tuple):
                h, t, i, s = res
            else:
                h, t, i, s = res.harness_id, res.task_id, res.rollout_idx, res.score
            key = (h, t, int(i))
            if key in got:
                raise ValueError(f"Race.record: run {key} reported twice")
            got[key] = float(s)
        missing = set(req.runs) - set(got)
        extra = set(got) - set(req.runs)
        if missing or extra:
            raise ValueError(f"Race.record: stage {req.stage} results do not match the request "
                             f"(missing {sorted(missing)[:3]}, unexpected {sorted(extra)[:3]})")
        for (h, t, i), s in got.items():
            if not 0.0 <= s <= 1.0:
                raise ValueError(f"Race.record: reward {s} for {(h, t, i)} outside [0, 1]")
            self._rewards.setdefault((h, t), []).append(s)
        self._tasks.extend(req.batch.tasks)
        self._executions += len(req.runs)
        self._pending = None

        scores = {h: self.score(h) for h in req.harnesses}
        eliminated: tuple[str, ...] = ()
        settled = False
        if req.stage < self.config.stages:
            ranked = tuple(c.harness_id for c in sorted(self._active, key=lambda c: self._rank_key(c, scores)))
            view = StageView(req.stage, self.config.stages, self.generated, ranked, self.parent_id,
                             tuple(self._tasks), {h: self.per_task(h) for h in req.harnesses}, scores,
                             self._prior_view())
            decision = self.rule.after_stage(view)
            kept = set(decision.keep)
            if not kept or not kept <= set(ranked):
                raise ValueError(f"racing rule {self.rule.name!r}: kept {sorted(kept)}, which is not a non-empty "
                                 f"subset of the children racing {list(ranked)}")
            eliminated = tuple(h for h in ranked if h not in kept)
            self._active = [c for c in self._active if c.harness_id in kept]
            settled = decision.stop
        report = StageReport(req.stage, scores, eliminated, tuple(c.harness_id for c in self._active), len(self._tasks))
        self._reports.append(report)
        if req.stage >= self.config.stages:
            self._stop_reason = "completed"
        elif settled:
            self._stop_reason = "settled"
        return report

    def abort(self, reason: str = "budget") -> None:
        """Drop the pending stage (it could not be completed, e.g. a token/cost cap
        stopped it): it never enters the comparison and the race ends."""
        self._pending = None
        self._stop_reason = reason

    def _prior_view(self) -> dict[str, np.ndarray]:
        """The prior rows on P_r (NaN where a harness never ran the task); rows with no
        task of P_r are left out."""
        rows = {h: np.array([v.get(t, np.nan) for t in self._tasks], dtype=float) for h, v in self._prior.items()}
        return {h: r for h, r in rows.items() if np.isfinite(r).any()}

    @staticmethod
    def _rank_key(c: RaceCandidate, scores: dict[str, float]) -> tuple[float, int, int]:
        return (-scores[c.harness_id], c.diff_size, c.index)

    def per_task(self, harness_id: str) -> np.ndarray:
        """Mean reward per task of P_r (in P_r's order): the sum of the task's R rollouts
        over R, the same arithmetic as the audit's vectorized replay."""
        R = self.config.rollouts
        return np.array([sum(self._rewards[(harness_id, t)]) for t in self._tasks]) / R

    def score(self, harness_id: str) -> float:
        """Cumulative μ̂ over every (task, rollout) of P_r, all tasks equally weighted."""
        vals = [s for t in self._tasks for s in self._rewards.get((harness_id, t), [])]
        if not vals:
            raise KeyError(f"no rewards recorded for harness {harness_id}")
        return float(np.mean(vals))

    def decision(self) -> RaceOutcome:
        """Final selection on the last completed stage (call once the race is over;
        calling earlier ends it there, as a budget stop would)."""
        if self._pending is not None:
            raise RuntimeError("Race.decision: a stage is pending; record it first")
        if self._stop_reason is None:
            self._stop_reason = "budget"
        if not self._reports:
            return RaceOutcome(self.parent_id, self.parent_id, False, 0, self._stop_reason, None, None, None,
                               self._executions)
        last = self._reports[-1].scores
        best = min(self._active, key=lambda c: self._rank_key(c, last))
        p, b = last[self.parent_id], last[best.harness_id]
        replaced = b > p
        if replaced and self.config.replace_alpha is not None:
            d = self.per_task(best.harness_id) - self.per_task(self.parent_id)
            replaced = len(d) >= 2 and bool(paired_t(d) > t_critical(self.config.replace_alpha, len(d)))
        return RaceOutcome(self.parent_id, best.harness_id if replaced else self.parent_id, replaced, self.stage,
                           self._stop_reason, p, best.harness_id, b, self._executions, dict(last))

    def run(self, reward, remaining_budget: int | None = None) -> RaceOutcome:
        """Drive the race with a synchronous reward function ``reward(h, t, i) -> float``
        (audits, tests). ``remaining_budget`` is decremented by each stage's runs."""
        left = remaining_budget
        while (req := self.next_stage(left)) is not None:
            self.record([(h, t, i, reward(h, t, i)) for h, t, i in req.runs])
            if left is not None:
                left -= req.executions
        return self.decision()


class UniformRace(Race):
    """A race under :class:`NoElimination`: same batches and budget gate, every child
    runs every stage (the uniform-allocation ablation / audit baseline)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, rule=NoElimination(), **kwargs)
