"""The racing audit's replays, vectorized: every racing rule on many task orders at once.

A replay is one race on a fixed reward matrix (harness 0 the parent, every audit task in
the validation pool, no training-class quotas) whose validation permutation is one row
of ``perms``. :func:`replay_rule` carries out, for all rows at once with numpy, exactly
the decisions :class:`~milo_ray.ssr.racing.Race` takes under the rule: the budget gate
per stage (a stage that does not fit ends that replay's race), cumulative scores over
the tasks raced, the ranking (higher score, fewer diff lines, lower index), the rule's
eliminations, ``paired``'s early stop, the protected parent and the optional
parent-replacement gate. :func:`race_once` runs the ``Race`` object itself on one
permutation; the tests hold the two to the same selections and spend (ties agree exactly
whenever sums of rewards are exact, e.g. dyadic rewards; otherwise summation order can
differ in the last bit, which only matters for float-level ties).

Cost: one (harnesses × replays × tasks) gather and cumulative sum per rule and budget;
``paired`` adds one (children × replays × tasks-so-far) array per stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from milo_ray.ssr.audit_stepwise import replay_stepwise
from milo_ray.ssr.racing import (GeometricHalving, NoElimination, PairedElimination, Race, RaceCandidate, RaceConfig,
                                 SuccessiveHalving, keep_count, paired_t, t_critical)
from milo_ray.ssr.racing_bandit import SuccessiveEliminationBandit
from milo_ray.ssr.racing_lowrank import LowRankRacing
from milo_ray.ssr.racing_paired import PairedSuccessiveRejects, rejects_keep
from milo_ray.ssr.task_draw import TASK_DRAWS

RULE_NAMES = ("uniform", "successive_halving", "halving", "paired", "paired_rejects", "bandit", "lowrank")
# Rules replayed stage by stage with the rule object itself (milo_ray.ssr.audit_stepwise).
STEPWISE = ("paired_rejects", "bandit", "lowrank")


@dataclass(frozen=True)
class RuleSpec:
    """One rule as the audit runs it.

    label: the table's name for it. rule: a racing rule name (:data:`RULE_NAMES`).
    stages: K (``uniform`` with one stage is the uniform subset). block: ``paired``'s
    tasks per stage (its stages are then as many blocks as the audit tasks hold).
    alpha / min_tasks: ``paired``'s and ``paired_rejects``' test (alpha is ``bandit``'s δ,
    min_tasks also ``lowrank``'s). rank / z: ``lowrank``'s interaction rank and
    elimination threshold. replace_alpha: the parent-replacement gate. ``bandit`` and
    ``lowrank`` race ``block``-task stages until the budget gate stops them;
    ``paired_rejects`` runs its K = ``stages`` schedule with the largest batch that fits.
    draw: the race's task draw (``uniform`` or ``discriminative``, :mod:`~milo_ray.ssr.task_draw`),
    the latter ordering each replay's tasks by the matrix's history. prior: ``lowrank``
    fits the matrix's history (earlier harnesses on the same tasks) beside the race's cells.
    """

    label: str
    rule: str
    stages: int = 2
    block: int = 5
    alpha: float = 0.05
    min_tasks: int = 10
    replace_alpha: float | None = None
    rank: int = 1
    z: float = 2.5
    draw: str = "uniform"
    prior: bool = False

    def __post_init__(self) -> None:
        if self.rule not in RULE_NAMES:
            raise ValueError(f"audit rule {self.label!r}: rule={self.rule!r}; choose one of {list(RULE_NAMES)}")
        if self.draw not in TASK_DRAWS.names:
            raise ValueError(f"audit rule {self.label!r}: draw={self.draw!r}; choose one of {list(TASK_DRAWS.names)}")
        if self.stages < 1 or self.block < 1:
            raise ValueError(f"audit rule {self.label!r}: stages and block must be >= 1")

    def racing_rule(self) -> Any:
        if self.rule == "successive_halving":
            return SuccessiveHalving()
        if self.rule == "halving":
            return GeometricHalving()
        if self.rule == "paired":
            return PairedElimination(self.alpha, self.min_tasks)
        if self.rule == "paired_rejects":
            return PairedSuccessiveRejects(self.alpha, self.min_tasks)
        if self.rule == "bandit":
            return SuccessiveEliminationBandit(self.alpha)
        if self.rule == "lowrank":
            return LowRankRacing(self.rank, self.z, self.min_tasks, prior=self.prior)
        return NoElimination()

    def active_schedule(self, m: int, stages: int) -> list[int]:
        """Children running each stage when the rule's counts are fixed (not ``paired``)."""
        if self.rule == "successive_halving":
            return [m] + [keep_count(m, stages, r) for r in range(1, stages)]
        if self.rule == "halving":
            return [m] + [GeometricHalving().keep(generated=m, stages=stages, stage=r, active=m)
                          for r in range(1, stages)]
        if self.rule == "paired_rejects":  # the quota; evidence can only drop more
            return [m] + [rejects_keep(m, stages, r) for r in range(1, stages)]
        return [m] * stages

    def plan(self, harnesses: int, tasks: int, rollouts: int, budget: int) -> RaceConfig:
        """The race configuration at ``budget`` executions: ``paired`` runs fixed blocks
        until the budget gate stops it; the others get the largest per-stage batch b with
        R·Σ_r (n_{r−1} + 1)·b ≤ budget, so a full race fits."""
        m = harnesses - 1
        if self.rule in ("paired", "bandit", "lowrank"):
            stages = max(1, tasks // self.block)
            return RaceConfig(stages, (self.block,), 0, 0, rollouts, self.replace_alpha)
        per_task = rollouts * sum(a + 1 for a in self.active_schedule(m, self.stages))
        return RaceConfig(self.stages, (max(0, budget // per_task),), 0, 0, rollouts, self.replace_alpha)


@dataclass(frozen=True)
class ReplayResult:
    """Per replay: the selected harness (index into the matrix), executions spent,
    whether the truly best child (``best_child``) was still racing at the decision, and
    the race's per-stage batch size."""

    selected: np.ndarray
    executions: np.ndarray
    best_kept: np.ndarray
    batch: int


def permutations(tasks: int, replays: int, rng: np.random.Generator) -> np.ndarray:
    """``replays`` independent uniform task orders (rows), shared by every rule so their
    regrets are paired."""
    return rng.permuted(np.tile(np.arange(tasks), (replays, 1)), axis=1)


def draw_permutations(history: np.ndarray | None, tasks: int, replays: int, rng: np.random.Generator,
                      draw: str = "discriminative") -> np.ndarray:
    """``replays`` task orders (rows) under ``draw``, its rates being each task's mean over
    ``history`` (earlier harnesses × tasks × rollouts; the race's own cells never inform
    the order of the tasks it has not run, so one order per replay is the whole draw)."""
    if draw == "uniform":
        return permutations(tasks, replays, rng)
    if history is None or not history.size:
        raise ValueError(f"task draw {draw!r}: the matrix has no history (an earlier population's executions on its "
                         f"tasks) to read pass rates from; generate it with one (racing_audit.py --history)")
    n = history.shape[0] * history.shape[2]
    rates = {j: (float(p), n) for j, p in enumerate(history.mean(axis=(0, 2)))}
    strategy = TASK_DRAWS.resolve(draw, key="audit draw")
    ids = list(range(tasks))
    return np.array([strategy.order(ids, rates, rng) for _ in range(replays)], dtype=np.int64)


def _ranking(scores: np.ndarray, active: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """Children per row in race order: active first, higher score, fewer diff lines,
    lower index (np.lexsort's last key is the primary one)."""
    n, m = scores.shape
    idx = np.broadcast_to(np.arange(m), (n, m))
    return np.lexsort((idx, np.broadcast_to(diff, (n, m)), -scores, ~active), axis=-1)


def replay_rule(rewards: np.ndarray, spec: RuleSpec, budget: int, perms: np.ndarray, *,
                diff_sizes: np.ndarray | None = None, best_child: int | None = None,
                history: np.ndarray | None = None) -> ReplayResult:
    """Every row of ``perms`` raced under ``spec`` within ``budget`` executions.

    ``rewards``: (H, T, R), harness 0 the parent. ``diff_sizes``: per harness (the
    parent's ignored) for the ranking's tie-break. ``best_child``: a harness index whose
    survival to the decision is reported. ``history``: the matrix's earlier harnesses,
    read only by a spec with ``prior``.
    """
    H, T, R = rewards.shape
    M, N = H - 1, perms.shape[0]
    diff = np.zeros(M) if diff_sizes is None else np.asarray(diff_sizes, dtype=float)[1:]
    cfg = spec.plan(H, T, R, budget)
    if spec.rule in STEPWISE:
        if spec.prior and (history is None or not history.size):
            raise ValueError(f"audit rule {spec.label!r}: prior needs the matrix's history (earlier harnesses "
                             f"on its tasks); generate it with one (racing_audit.py --history-rollouts)")
        sel, spent, kept = replay_stepwise(rewards, spec.racing_rule(), cfg, budget, perms, diff,
                                           None if best_child is None or best_child < 1 else best_child,
                                           history if spec.prior else None)
        return ReplayResult(sel, spent, kept, int(cfg.b_v[0]))
    G = np.take(rewards.sum(axis=2), perms, axis=1)  # (H, N, T): task sums in each replay's order
    C = np.cumsum(G, axis=2)
    Gm = G / R  # per-task means, the arithmetic of Race.per_task
    rows = np.arange(N)
    active = np.ones((N, M), dtype=bool)
    alive = np.ones(N, dtype=bool)
    left = np.full(N, int(budget))
    spent = np.zeros(N, dtype=np.int64)
    completed = np.zeros(N, dtype=np.int64)
    last = np.zeros((N, H))
    rule = spec.rule
    crit = {}
    end = 0
    for r in range(1, cfg.stages + 1):
        size = min(cfg.b_v[r - 1], T - end)
        if size <= 0:  # no unused task: the race is exhausted
            break
        need = R * (active.sum(axis=1) + 1) * size
        run = alive & (need <= left)
        alive = run  # a refused stage ends that replay's race
        if not run.any():
            break
        left = left - np.where(run, need, 0)
        spent += np.where(run, need, 0)
        end += size
        score = (C[:, :, end - 1] / (end * R)).T  # (N, H)
        last[run] = score[run]
        completed[run] = r
        if r == cfg.stages:
            break
        order = _ranking(score[:, 1:], active, diff)
        keep = np.zeros_like(active)
        if rule in ("successive_halving", "halving"):
            n = spec.racing_rule().keep(generated=M, stages=cfg.stages, stage=r, active=M)
            keep[rows[:, None], order[:, :n]] = True
            keep &= active
        elif rule == "uniform":
            keep = active.copy()
        else:  # paired: drop children significantly below the leader, stop at one
            keep = active.copy()
            if end >= spec.min_tasks:
                leader = order[:, 0]
                d = Gm[1:, :, :end] - Gm[1 + leader, rows, :end][None]
                crit.setdefault(end, t_critical(spec.alpha, end))
                worse = (paired_t(d) < -crit[end]).T  # (N, M)
                worse[rows, leader] = False
                test = active.sum(axis=1) >= 2
                keep &= ~(worse & test[:, None])
        active = np.where(run[:, None], keep, active)
        if rule == "paired":
            alive &= active.sum(axis=1) > 1  # one child left: settled
    # The decision on each replay's last completed stage; no stage: the parent stays.
    sel = np.zeros(N, dtype=np.int64)
    best = _ranking(last[:, 1:], active, diff)[:, 0]
    b_score, p_score = last[rows, 1 + best], last[:, 0]
    replaced = (completed > 0) & (b_score > p_score)
    if cfg.replace_alpha is not None:
        ends = _stage_ends(cfg, T)
        for k in np.unique(completed[replaced]):
            at = replaced & (completed == k)
            e = ends[k - 1]
            d = Gm[1 + best[at], rows[at], :e] - Gm[0, rows[at], :e]
            replaced[at] = (paired_t(d) > t_critical(cfg.replace_alpha, e)) if e >= 2 else False
    sel[replaced] = 1 + best[replaced]
    kept = np.zeros(N, dtype=bool) if best_child is None or best_child < 1 else active[:, best_child - 1]
    return ReplayResult(sel, spent, kept & (completed > 0), int(cfg.b_v[0]))


def _stage_ends(cfg: RaceConfig, tasks: int) -> list[int]:
    ends, end = [], 0
    for b in cfg.b_v:
        end = min(tasks, end + b)
        ends.append(end)
    return ends


def race_once(rewards: np.ndarray, spec: RuleSpec, budget: int, perm: np.ndarray, *,
              diff_sizes: np.ndarray | None = None) -> tuple[int, int]:
    """One replay by the ``Race`` object itself: (selected harness index, executions).
    ``perm`` becomes the race's validation order (the race permutes its pool with a
    generator; here the pool is given pre-permuted and the generator's draw undone)."""
    H, T, R = rewards.shape
    ids = [f"h{i}" for i in range(H)]
    diff = np.zeros(H) if diff_sizes is None else np.asarray(diff_sizes)
    cands = [RaceCandidate(ids[i], i - 1, (), int(diff[i])) for i in range(1, H)]
    seed = 0
    inverse = np.argsort(np.random.default_rng(seed).permutation(T))
    pool = [f"x{perm[j]}" for j in inverse]  # Race's own permutation of this pool gives perm's order
    race = Race(ids[0], cands, order=[], parent_success=[], parent_failure=[], validation=pool,
                config=spec.plan(H, T, R, budget), rng=np.random.default_rng(seed), rule=spec.racing_rule())
    out = race.run(lambda h, t, i: float(rewards[int(h[1:]), int(t[1:]), i]), remaining_budget=budget)
    return ids.index(out.selected), out.executions
