"""Racing cost–quality audit (SSR §6.5): replay selection on a fixed reward matrix.

Given a complete matrix of rewards (harnesses × tasks × rollouts) — one parent and
its children — the audit replays two selection rules at several validation-budget
levels (fractions of the full-matrix cost H·T·R), over several task-order replays:

* **Racing**: the ``Race`` decision object (successive halving, protected parent)
  with every audit task in the validation pool; the per-stage batch size b_v is the
  largest that keeps the whole race within the budget given the elimination quotas.
* **Uniform subset**: every harness runs the same uniformly drawn task subset of the
  size the budget allows (``UniformRace`` with one stage), then the same selection
  rule (best child, replaces the parent only on a strictly higher score).

Quality of a selection is the selected harness's mean over the *full* matrix; the
reference is the full-matrix best. Rewards come from the matrix, never from new
executions, so the audit works on any run's ``rollouts`` table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from milo_ray.core.seeds import derive_seed
from milo_ray.harness.diff import diff
from milo_ray.harness.validate import forbidden_fragments_for, validate
from milo_ray.ssr.racing import Race, RaceCandidate, RaceConfig, UniformRace, keep_count


@dataclass(frozen=True)
class RewardMatrix:
    """rewards[h, t, i] for harness_ids[h], task_ids[t], rollout i; harness 0 is the parent."""

    harness_ids: tuple[str, ...]
    task_ids: tuple[str, ...]
    rewards: np.ndarray
    diff_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.rewards.shape[:2] != (len(self.harness_ids), len(self.task_ids)) or self.rewards.ndim != 3:
            raise ValueError(f"RewardMatrix: rewards shape {self.rewards.shape} does not match "
                             f"{len(self.harness_ids)} harnesses × {len(self.task_ids)} tasks × R")
        if len(self.harness_ids) < 2:
            raise ValueError("RewardMatrix: need a parent and at least one child")

    @property
    def full_cost(self) -> int:
        return int(self.rewards.size)

    def quality(self) -> np.ndarray:
        return self.rewards.mean(axis=(1, 2))


def matrix_from_rollouts(rows: Sequence[dict[str, Any]], *, rollouts: int = 2, parent: str | None = None,
                         split: str | None = None, min_tasks: int = 10) -> RewardMatrix:
    """The largest complete sub-matrix of a ``rollouts`` table (rows as dicts).

    A (harness, task) cell is complete with ≥ ``rollouts`` distinct rollout indices
    (the lowest are used). Harnesses with the fewest complete tasks are dropped
    until at least ``min_tasks`` tasks are complete for every remaining harness.
    ``parent`` (default: the harness complete on the most tasks) goes first.
    """
    cells: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        if split is not None and r.get("split") != split:
            continue
        cells.setdefault((r["harness_id"], r["task_id"]), {})[int(r["rollout_idx"])] = float(r["score"])
    complete: dict[str, set[str]] = {}
    for (h, t), by_idx in cells.items():
        if len(by_idx) >= rollouts:
            complete.setdefault(h, set()).add(t)
    hs = sorted(complete, key=lambda h: (-len(complete[h]), h))
    if parent is None and hs:
        parent = hs[0]
    if parent not in complete:
        raise ValueError(f"rollouts table: parent {parent!r} has no complete (task, {rollouts} rollouts) cell")
    chosen = [h for h in hs]
    common = set.intersection(*(complete[h] for h in chosen))
    while len(common) < min_tasks and len(chosen) > 2:
        worst = min((h for h in chosen if h != parent), key=lambda h: (len(complete[h] & complete[parent]), h))
        chosen.remove(worst)
        common = set.intersection(*(complete[h] for h in chosen))
    if len(common) < 1 or len(chosen) < 2:
        raise ValueError("rollouts table: no complete sub-matrix with a parent and a child; "
                         "run the candidates on a shared task set (e.g. scripts/racing_audit.py --generate)")
    chosen = [parent] + [h for h in chosen if h != parent]
    tasks = sorted(common)
    R = np.array([[[cells[(h, t)][i] for i in sorted(cells[(h, t)])[:rollouts]] for t in tasks] for h in chosen])
    return RewardMatrix(tuple(chosen), tuple(tasks), R)


def _candidates(m: RewardMatrix) -> list[RaceCandidate]:
    sizes = m.diff_sizes or (0,) * len(m.harness_ids)
    return [RaceCandidate(h, i - 1, (), int(sizes[i])) for i, h in enumerate(m.harness_ids) if i > 0]


def racing_batch_size(m: RewardMatrix, budget: int, stages: int) -> int:
    """Largest per-stage batch b with R·Σ_r (n_{r-1} + 1)·b ≤ budget."""
    M, R = len(m.harness_ids) - 1, m.rewards.shape[2]
    active = [M] + [keep_count(M, stages, r) for r in range(1, stages)]
    per_task = R * sum(a + 1 for a in active)
    return max(0, budget // per_task)


def _reward_fn(m: RewardMatrix):
    hi = {h: i for i, h in enumerate(m.harness_ids)}
    ti = {t: i for i, t in enumerate(m.task_ids)}
    return lambda h, t, i: float(m.rewards[hi[h], ti[t], i])


def replay(m: RewardMatrix, fraction: float, rule: str, *, stages: int = 2, seed: int = 0) -> dict[str, Any]:
    """One replay of ``rule`` ('racing' or 'uniform') at ``fraction`` of the full cost."""
    R = m.rewards.shape[2]
    budget = int(fraction * m.full_cost)
    rng = np.random.default_rng(seed)
    if rule == "racing":
        b = racing_batch_size(m, budget, stages)
        cfg = RaceConfig(stages, (b,), 0, 0, R)
        race: Race = Race(m.harness_ids[0], _candidates(m), order=[], parent_success=[], parent_failure=[],
                          validation=list(m.task_ids), config=cfg, rng=rng)
    elif rule == "uniform":
        b = budget // (R * len(m.harness_ids))
        cfg = RaceConfig(1, (b,), 0, 0, R)
        race = UniformRace(m.harness_ids[0], _candidates(m), order=[], parent_success=[], parent_failure=[],
                           validation=list(m.task_ids), config=cfg, rng=rng)
    else:
        raise ValueError(f"rule={rule!r}; choose racing or uniform")
    out = race.run(_reward_fn(m), remaining_budget=budget)
    q = m.quality()
    return {"rule": rule, "fraction": fraction, "batch": b, "selected": out.selected,
            "selected_quality": float(q[m.harness_ids.index(out.selected)]), "executions": out.executions}


def audit(m: RewardMatrix, fractions: Sequence[float] = (0.2, 0.3, 0.4, 0.5, 0.6), *, replays: int = 3,
          stages: int = 2, seed: int = 0) -> list[dict[str, Any]]:
    """Mean over ``replays`` task orders of each rule at each budget level."""
    q = m.quality()
    best = float(q.max())
    rows = []
    for f in fractions:
        for rule in ("racing", "uniform"):
            reps = [replay(m, f, rule, stages=stages, seed=seed + k) for k in range(replays)]
            sel = float(np.mean([r["selected_quality"] for r in reps]))
            rows.append({"fraction": f, "rule": rule, "batch": reps[0]["batch"], "selected_quality": sel,
                         "full_matrix_best": best, "gap": best - sel, "parent_quality": float(q[0]),
                         "executions": float(np.mean([r["executions"] for r in reps])),
                         "cost_fraction": float(np.mean([r["executions"] for r in reps])) / m.full_cost})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    head = f"{'budget':>7} {'rule':>8} {'b/stage':>7} {'selected':>9} {'best':>7} {'gap':>7} {'execs':>8} {'cost':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['fraction']:>7.0%} {r['rule']:>8} {r['batch']:>7d} {r['selected_quality']:>9.4f} "
                     f"{r['full_matrix_best']:>7.4f} {r['gap']:>7.4f} {r['executions']:>8.0f} {r['cost_fraction']:>6.1%}")
    return "\n".join(lines)


def audit_tasks(benchmark: Any, audit_splits: Sequence[str], *, train_split: str = "train",
                test_split: str = "test") -> list[Any]:
    """The audit's task set: every task of ``audit_splits``, which must be disjoint from the
    candidate-generation (``train_split``) and test tasks (papers/002 §6.5: "a 160-task
    audit matrix, disjoint from candidate-generation and test sets"); selection quality
    measured on tasks that also chose or will report the harness would be optimistic.
    ``ValueError`` names ``audit_splits`` and the overlap."""
    tasks = [t for split in audit_splits for t in benchmark.tasks(split)]
    names = set(benchmark.splits())
    for other in (train_split, test_split):
        if other not in names:
            continue
        shared = sorted({t.task_id for t in tasks} & {t.task_id for t in benchmark.tasks(other)})
        if shared:
            raise ValueError(f"audit_splits={list(audit_splits)}: {len(shared)} audit tasks are also in the "
                             f"{other!r} split (e.g. {shared[0]}); the audit set must be disjoint from the "
                             f"candidate-generation and test tasks")
    if not tasks:
        raise ValueError(f"audit_splits={list(audit_splits)}: no tasks")
    return tasks


def generate_surrogate_matrix(benchmark: Any, *, executor: Any, optimizer: Any, judge: Any, embedder: Any,
                              workdir: Any, per_scale: int = 3, scales: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
                              audit_splits: Sequence[str] = ("val",), rollouts: int = 2, seed: int = 0,
                              parent: Any = None) -> RewardMatrix:
    """Build the audit's fixed matrix on a benchmark (offline: the surrogate).

    The parent (default: the first seed harness) runs once on every training task;
    the judge, embedder and RER ordering give the nested prefixes; ``per_scale``
    children per scale are independent optimizer edits (distinct derived seeds), as in
    the paper's 12-candidate audit. Parent and children then run ``rollouts`` times on
    every task of ``audit_splits`` (default: the validation split; disjoint from the
    training evidence and the test split, see :func:`audit_tasks`), executed in this
    process by ``executor`` (an executor, or the ``_target_`` spec of one, e.g. the
    surrogate's ``benchmark.executor_config()``). Invalid or duplicate children are
    dropped and replaced by further seeds (up to 3·per_scale tries per scale), so a
    scale may end up with fewer children when the optimizer keeps repeating itself.
    """
    from pathlib import Path

    from milo_ray.agents.protocols import MutationRequest
    from milo_ray.execution.workers import build_executor
    from milo_ray.ssr import evidence as ev

    audit_set = audit_tasks(benchmark, audit_splits)
    executor = build_executor(executor)
    parent = parent or benchmark.seed_harnesses()[0]
    train = benchmark.tasks("train")
    results = [executor.execute(parent, t, 0, seed) for t in train]

    class _Traces:  # judge_items reads traces from a store; here they are inline
        def get_blob(self, ref):
            raise KeyError(ref)

    for r in results:
        r.trace_ref = None
    items = ev.judge_items(results, _Traces())
    records = ev.judge_records(judge, items, round=0, harness_id=parent.harness_id)
    ev.embed_records(records, embedder)
    order = ev.order_records(records, "rer", np.random.default_rng(seed))
    sets = ev.evidence_sets(order, scales, "rer", np.random.default_rng(seed))
    by_task = {r.task_id: r for r in records}
    root = Path(workdir)
    parent_dir = parent.write_to(root / "parent")
    all_tasks = [t for split in benchmark.splits().values() for t in split]
    forbidden = forbidden_fragments_for(all_tasks)
    children, sizes, seen = [], [], {parent.harness_id}
    for s, tasks in enumerate(sets):
        recs = [by_task[t] for t in tasks]
        got = 0
        for j in range(3 * per_scale):  # the offline optimizer repeats itself: try more seeds
            if got == per_scale:
                break
            cdir = root / f"candidate-{s}-{j}"
            (cdir / "work").mkdir(parents=True, exist_ok=True)
            (cdir / "evidence").mkdir(parents=True, exist_ok=True)
            req = MutationRequest(parent=parent, parent_dir=parent_dir, evidence_dir=cdir / "evidence",
                                  memory_markdown=ev.render_memory(recs, k=len(tasks), n=len(order)),
                                  workdir=cdir / "work", seed=derive_seed(seed, "audit", s, j),
                                  context={"records": [r.as_dict() for r in recs], "scale": len(tasks)})
            child = optimizer.mutate(req).child
            if child is None or child.harness_id in seen or not validate(child, forbidden_fragments=forbidden).ok:
                continue
            seen.add(child.harness_id)
            got += 1
            children.append(child)
            d = diff(parent, child)
            sizes.append(d.added + d.deleted)
    harnesses = [parent] + children
    R = np.array([[[executor.execute(h, t, i, seed).score for i in range(rollouts)] for t in audit_set]
                  for h in harnesses])
    return RewardMatrix(tuple(h.harness_id for h in harnesses), tuple(t.task_id for t in audit_set), R,
                        (0,) + tuple(sizes))
