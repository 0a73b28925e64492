"""Racing audit (SSR §6.5): the fixed reward matrix, the truth it is scored against, and
the matrix generator.

A ``RewardMatrix`` holds rewards[h, t, i] of one parent (harness 0) and its children on
the audit tasks; the replays (:mod:`milo_ray.ssr.audit_replay`) select from it. What a
selection is *worth* never comes from the cells that chose it: ``truth`` is each
harness's exact expected quality where the benchmark has ground truth (the surrogate:
its expectation on the test split), or its mean over fresh held-out executions
(:class:`HeldOut`: other tasks or rollout indices, checked disjoint from the selection
cells). The in-sample matrix mean (:meth:`RewardMatrix.quality`) is reported beside it,
labelled as such: on 20 tasks the harness that looks best on the matrix is rarely the
truly best one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from milo_ray.core.seeds import derive_seed
from milo_ray.harness.diff import diff
from milo_ray.harness.validate import forbidden_fragments_for, validate

Cell = tuple[str, str, int]  # (harness_id, task_id, rollout_idx)


@dataclass(frozen=True)
class HeldOut:
    """Held-out quality: per harness, the mean over its held-out executions (each task's
    rollouts averaged first), with the cells they came from so that
    :meth:`RewardMatrix.check_truth` can refuse any overlap with the selection cells."""

    values: tuple[float, ...]
    cells: frozenset[Cell]

    @classmethod
    def from_results(cls, harness_ids: Sequence[str], results: Iterable[tuple[str, str, int, float]]) -> "HeldOut":
        by: dict[str, dict[str, list[float]]] = {h: {} for h in harness_ids}
        cells: set[Cell] = set()
        for h, t, i, s in results:
            if h in by:
                by[h].setdefault(t, []).append(float(s))
                cells.add((h, t, int(i)))
        missing = [h for h, tasks in by.items() if not tasks]
        if missing:
            raise ValueError(f"held-out scoring: no held-out executions for {missing[:3]}; run every harness "
                             f"on the held-out tasks (e.g. the test split) first")
        return cls(tuple(float(np.mean([np.mean(v) for v in by[h].values()])) for h in harness_ids), frozenset(cells))


@dataclass(frozen=True)
class RewardMatrix:
    """rewards[h, t, i] for harness_ids[h], task_ids[t], rollout i; harness 0 is the parent.

    truth: per-harness quality the selections are scored by (None: none known; the audit
    then refuses to report regret). truth_source says where it came from
    (``exact:<split>`` or ``held-out:<what>``). held_out: the held-out cells when truth is
    a held-out mean. cells: the (harness, task, rollout index) of every reward when the
    indices are not 0..R−1 (a run's rollouts table). history: rewards[g, t, i] of an
    earlier population (other harnesses, or the parent at other rollout indices) on the
    same tasks, never selection cells: what a race's ``task_draw`` and ``lowrank``'s prior
    may read without paying for it (None: none recorded).
    """

    harness_ids: tuple[str, ...]
    task_ids: tuple[str, ...]
    rewards: np.ndarray
    diff_sizes: tuple[int, ...] = ()
    truth: tuple[float, ...] | None = None
    truth_source: str = ""
    held_out: HeldOut | None = None
    cells: frozenset[Cell] | None = None
    history: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.rewards.shape[:2] != (len(self.harness_ids), len(self.task_ids)) or self.rewards.ndim != 3:
            raise ValueError(f"RewardMatrix: rewards shape {self.rewards.shape} does not match "
                             f"{len(self.harness_ids)} harnesses × {len(self.task_ids)} tasks × R")
        if len(self.harness_ids) < 2:
            raise ValueError("RewardMatrix: need a parent and at least one child")
        if self.truth is not None and len(self.truth) != len(self.harness_ids):
            raise ValueError(f"RewardMatrix: truth has {len(self.truth)} values for {len(self.harness_ids)} harnesses")
        if self.held_out is not None:
            self.check_truth(self.held_out)
        if self.history is not None and (self.history.ndim != 3 or self.history.shape[1] != len(self.task_ids)):
            raise ValueError(f"RewardMatrix: history shape {self.history.shape} is not (harnesses × "
                             f"{len(self.task_ids)} tasks × rollouts)")

    @property
    def full_cost(self) -> int:
        return int(self.rewards.size)

    def quality(self) -> np.ndarray:
        """In-sample: each harness's mean over the whole matrix (the cells selection sees)."""
        return self.rewards.mean(axis=(1, 2))

    def selection_cells(self) -> set[Cell]:
        if self.cells is not None:
            return set(self.cells)
        R = self.rewards.shape[2]
        return {(h, t, i) for h in self.harness_ids for t in self.task_ids for i in range(R)}

    def check_truth(self, held_out: HeldOut) -> None:
        """``ValueError`` when a held-out cell is one the selection could see."""
        shared = held_out.cells & self.selection_cells()
        if shared:
            raise ValueError(f"held-out scoring: {len(shared)} held-out executions are selection cells of the "
                             f"matrix (e.g. {sorted(shared)[0]}); score on other tasks or rollout indices")

    def with_truth(self, truth: Sequence[float] | HeldOut, source: str) -> "RewardMatrix":
        from dataclasses import replace

        if isinstance(truth, HeldOut):
            return replace(self, truth=truth.values, truth_source=source, held_out=truth)
        return replace(self, truth=tuple(float(x) for x in truth), truth_source=source, held_out=None)

    def true_values(self) -> np.ndarray:
        if self.truth is None:
            raise ValueError("RewardMatrix: no truth (exact quality or held-out executions) to score selections "
                             "by; generate on a benchmark with ground truth or give held-out rollouts")
        return np.asarray(self.truth, dtype=float)

    def save(self, path: Any) -> None:
        np.savez(path, harness_ids=np.array(self.harness_ids), task_ids=np.array(self.task_ids), rewards=self.rewards,
                 diff_sizes=np.array(self.diff_sizes or (0,) * len(self.harness_ids)),
                 truth=np.array(self.truth if self.truth is not None else [], dtype=float),
                 truth_source=np.array(self.truth_source),
                 history=self.history if self.history is not None else np.zeros((0, len(self.task_ids), 0)))

    @classmethod
    def load(cls, path: Any) -> "RewardMatrix":
        z = np.load(path)
        truth = z["truth"].tolist() if "truth" in z and z["truth"].size else None
        history = z["history"] if "history" in z and z["history"].size else None
        return cls(tuple(z["harness_ids"].tolist()), tuple(z["task_ids"].tolist()), z["rewards"],
                   tuple(int(x) for x in z["diff_sizes"]), None if truth is None else tuple(truth),
                   str(z["truth_source"]) if "truth_source" in z else "", history=history)


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
    used = {(h, t): sorted(cells[(h, t)])[:rollouts] for h in chosen for t in tasks}
    R = np.array([[[cells[(h, t)][i] for i in used[(h, t)]] for t in tasks] for h in chosen])
    return RewardMatrix(tuple(chosen), tuple(tasks), R,
                        cells=frozenset((h, t, i) for (h, t), idx in used.items() for i in idx))


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
                              audit_splits: Sequence[str] | None = None, rollouts: int = 2, seed: int = 0,
                              parent: Any = None, truth_split: str = "test",
                              held_out_rollouts: int = 2) -> RewardMatrix:
    """Build the audit's fixed matrix on a benchmark (offline: the surrogate).

    The parent (default: the first seed harness) runs once on every training task;
    the judge, embedder and RER ordering give the nested prefixes; ``per_scale``
    children per scale are independent optimizer edits (distinct derived seeds), as in
    the paper's 12-candidate audit. Parent and children then run ``rollouts`` times on
    every task of ``audit_splits`` (default: the benchmark's ``audit`` split when it has
    one, else its validation split; disjoint from the training evidence and the test
    split, see :func:`audit_tasks`), executed in this
    process by ``executor`` (an executor, or the ``_target_`` spec of one, e.g. the
    surrogate's ``benchmark.executor_config()``). Invalid or duplicate children are
    dropped and replaced by further seeds (up to 3·per_scale tries per scale), so a
    scale may end up with fewer children when the optimizer keeps repeating itself.

    Truth: with ground truth (``benchmark.true_quality``) each harness's exact expected
    score on ``truth_split``; otherwise ``held_out_rollouts`` fresh executions per task
    of ``truth_split`` with rollout indices after the matrix's, never a selection cell.
    """
    from pathlib import Path

    from milo_ray.agents.protocols import MutationRequest
    from milo_ray.execution.workers import build_executor
    from milo_ray.ssr import evidence as ev

    if audit_splits is None:
        audit_splits = ("audit",) if "audit" in benchmark.splits() else ("val",)
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
    m = RewardMatrix(tuple(h.harness_id for h in harnesses), tuple(t.task_id for t in audit_set), R,
                     (0,) + tuple(sizes))
    if callable(getattr(benchmark, "true_quality", None)):
        exact = [benchmark.true_quality(h, truth_split)["score"] for h in harnesses]
        return m.with_truth(exact, f"exact:{truth_split}")
    fresh = range(rollouts, rollouts + held_out_rollouts)  # indices the matrix never used
    runs = [(h.harness_id, t.task_id, i, executor.execute(h, t, i, seed).score)
            for h in harnesses for t in benchmark.tasks(truth_split) for i in fresh]
    return m.with_truth(HeldOut.from_results(m.harness_ids, runs),
                        f"held-out:{truth_split} x{held_out_rollouts} rollouts")


def held_out_from_rollouts(m: RewardMatrix, rows: Sequence[dict[str, Any]], *,
                           split: str | None = None) -> RewardMatrix:
    """``m`` scored by a run's other executions of its harnesses: every row of a
    ``rollouts`` table (of ``split``, when given) that is not a selection cell (other
    tasks, or the same tasks at other rollout indices)."""
    picked = m.selection_cells()
    runs = [(r["harness_id"], r["task_id"], int(r["rollout_idx"]), float(r["score"])) for r in rows
            if (split is None or r.get("split") == split)
            and (r["harness_id"], r["task_id"], int(r["rollout_idx"])) not in picked]
    return m.with_truth(HeldOut.from_results(m.harness_ids, runs), f"held-out:{split or 'other cells'}")


def seed_history(m: RewardMatrix, benchmark: Any, *, executor: Any, rollouts: int = 1, seed: int = 0,
                 first_index: int = 100) -> RewardMatrix:
    """``m`` with a history: every seed harness of ``benchmark`` (the population a run
    starts from, the parent among them) run ``rollouts`` times on each of ``m``'s tasks at
    rollout indices from ``first_index`` on, which the matrix never uses (checked)."""
    from dataclasses import replace

    from milo_ray.execution.workers import build_executor

    R = m.rewards.shape[2]
    if first_index < R:
        raise ValueError(f"seed_history: first_index={first_index} reuses the matrix's rollout indices 0..{R - 1}")
    tasks = {t.task_id: t for split in benchmark.splits().values() for t in split}
    missing = [t for t in m.task_ids if t not in tasks]
    if missing:
        raise ValueError(f"seed_history: {len(missing)} of the matrix's tasks (e.g. {missing[0]}) are not in the "
                         f"benchmark; build it with the preset and seed the matrix was generated on")
    executor = build_executor(executor)
    hist = np.array([[[executor.execute(h, tasks[t], first_index + i, seed).score for i in range(rollouts)]
                      for t in m.task_ids] for h in benchmark.seed_harnesses()])
    return replace(m, history=hist)
