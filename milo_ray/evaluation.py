"""Evaluating fixed harnesses: the ``eval`` method and the leaderboard table that every
method prints (pass@k, PR@k, RR@k with task-clustered 95% intervals, tokens, seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from milo_ray.benchmarks.base import GroundTruth
from milo_ray.context import RunContext
from milo_ray.execution.types import RolloutRequest, RolloutResult
from milo_ray.harness.model import Harness
from milo_ray.kernels.metrics import clustered_ci, pass_at_k, pr_at_k, rr_at_k


@dataclass(frozen=True)
class HarnessScore:
    """One leaderboard row. CIs are (low, high) of the task-clustered 95% interval."""

    name: str
    harness_id: str
    n_tasks: int
    k: int
    pass_at_k: float
    pr_at_k: float
    pr_ci: tuple[float, float]
    rr_at_k: float
    rr_ci: tuple[float, float]
    mean_output_tokens: float
    mean_seconds: float
    timeouts: int
    errors: int
    true_score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def score_matrix(results: Iterable[RolloutResult], task_ids: Sequence[str], k: int) -> np.ndarray:
    """(n_tasks, k) scores in task order; a missing rollout counts as 0 (never silently dropped
    from the denominator)."""
    index = {t: i for i, t in enumerate(task_ids)}
    S = np.zeros((len(task_ids), k))
    for r in results:
        if r.task_id in index and r.rollout_idx < k:
            S[index[r.task_id], r.rollout_idx] = r.score
    return S


def summarize(name: str, harness: Harness, results: Sequence[RolloutResult], task_ids: Sequence[str], k: int,
              *, true_score: float | None = None) -> HarnessScore:
    S = score_matrix(results, task_ids, k)
    resolved = (S >= 1.0).astype(float)
    _, pr_lo, pr_hi = clustered_ci(S)
    _, rr_lo, rr_hi = clustered_ci(resolved)
    n = max(len(results), 1)
    return HarnessScore(
        name=name,
        harness_id=harness.harness_id,
        n_tasks=len(task_ids),
        k=k,
        pass_at_k=float(pass_at_k(S)),
        pr_at_k=float(pr_at_k(S)),
        pr_ci=(float(pr_lo), float(pr_hi)),
        rr_at_k=float(rr_at_k(S)),
        rr_ci=(float(rr_lo), float(rr_hi)),
        mean_output_tokens=sum(r.output_tokens for r in results) / n,
        mean_seconds=sum(r.latency_s for r in results) / n,
        timeouts=sum(r.timed_out for r in results),
        errors=sum(r.error_kind is not None for r in results),
        true_score=true_score,
    )


def print_scores(title: str, rows: Sequence[HarnessScore]) -> None:
    """A rich table on the console (plain text when not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("harness", "id", "pass@k", "PR@k [95% CI]", "RR@k [95% CI]", "out tokens", "seconds",
                "timeouts", "errors", "true score"):
        table.add_column(col, justify="left" if col in ("harness", "id") else "right")
    for r in rows:
        table.add_row(
            r.name, r.harness_id[:10], f"{r.pass_at_k:.3f}",
            f"{r.pr_at_k:.3f} [{r.pr_ci[0]:.3f}, {r.pr_ci[1]:.3f}]",
            f"{r.rr_at_k:.3f} [{r.rr_ci[0]:.3f}, {r.rr_ci[1]:.3f}]",
            f"{r.mean_output_tokens:,.0f}", f"{r.mean_seconds:,.1f}", str(r.timeouts), str(r.errors),
            "-" if r.true_score is None else f"{r.true_score:.3f}",
        )
    Console(width=160).print(table)


def record_harness(ctx: RunContext, harness: Harness, **columns: Any) -> None:
    """Store a harness row and its source once per run (resume does not duplicate it)."""
    known = ctx.extras.setdefault("_stored_harnesses", None)
    if known is None:
        table = ctx.store.read("harnesses")
        known = set(table.column("harness_id").to_pylist()) if table.num_rows else set()
        ctx.extras["_stored_harnesses"] = known
    if harness.harness_id in known:
        return
    ref = ctx.store.put_harness_source(harness.files)
    ctx.store.append("harnesses", [{"harness_id": harness.harness_id, "name": harness.name, "source_ref": ref,
                                    **columns}])
    known.add(harness.harness_id)


def true_score(benchmark: Any, harness: Harness, split: str) -> float | None:
    if isinstance(benchmark, GroundTruth):
        return float(benchmark.true_quality(harness, split)["score"])
    return None


class EvalMethod:
    """Evaluate the benchmark's seed harnesses (or the named subset) on one split.

    Rollouts run in waves of one rollout index (every harness on every task); past the
    run's time limit no new wave starts, and the table reports the k completed waves,
    so every row is a complete pass@k / PR@k / RR@k over the same tasks."""

    name = "eval"
    agent_roles = ()  # eval runs no search agents

    def __init__(self, k: int = 5, split: str = "test", names: Sequence[str] = ()):
        if k < 1:
            raise ValueError(f"method.k={k}: need at least one rollout per task")
        self.k = k
        self.split = split
        self.names = list(names)

    def _seeds(self, benchmark: Any) -> list[Harness]:
        seeds = benchmark.seed_harnesses()
        if self.names:
            unknown = set(self.names) - {h.name for h in seeds}
            if unknown:
                raise ValueError(f"method.names: unknown seed(s) {sorted(unknown)}; "
                                 f"available: {[h.name for h in seeds]}")
            seeds = [h for h in seeds if h.name in self.names]
        return seeds

    def preflight(self, benchmark: Any, agents: dict[str, Any]) -> None:
        """Refuse a split or seed name the benchmark lacks (before anything is written)."""
        from milo_ray.benchmarks.base import resolve_split

        resolve_split(benchmark, self.split, field="method.split")
        self._seeds(benchmark)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from milo_ray.benchmarks.base import resolve_split

        resolve_split(ctx.benchmark, self.split, field="method.split")
        seeds = self._seeds(ctx.benchmark)
        task_ids = [t.task_id for t in ctx.benchmark.tasks(self.split)]
        for h in seeds:
            ctx.scheduler.add_harness(h)
            record_harness(ctx, h, origin="seed", admitted=True)
        results: list[RolloutResult] = []
        k_done = 0
        for i in range(self.k):
            if ctx.out_of_time():
                break
            results += ctx.scheduler.run([RolloutRequest(h.harness_id, t, i, ctx.seed, split=self.split, method="eval",
                                                         group=h.name or h.harness_id)
                                          for h in seeds for t in task_ids])
            k_done = i + 1
        stop = "finished" if k_done == self.k else "time limit"
        by_harness: dict[str, list[RolloutResult]] = {}
        for r in results:
            by_harness.setdefault(r.harness_id, []).append(r)
        rows = [summarize(h.name, h, by_harness.get(h.harness_id, []), task_ids, k_done,
                          true_score=true_score(ctx.benchmark, h, self.split)) for h in seeds] if k_done else []
        if rows:
            print_scores(f"{ctx.benchmark.name}: {self.split} split, k={k_done}", rows)
        ctx.store.event("eval_summary", {"split": self.split, "k": k_done, "k_requested": self.k, "stop_reason": stop,
                                         "rows": [r.as_dict() for r in rows]})
        return {"method": "eval", "split": self.split, "k": k_done, "k_requested": self.k, "stop_reason": stop,
                "harnesses": [r.as_dict() for r in rows]}


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, (int, float)) else str(value)


def print_run_summary(summary: dict[str, Any]) -> None:
    """The end-of-run console report of any method: MILO's per-island table, the final
    test leaderboard rows (``final_test``: ``HarnessScore.as_dict()`` rows) and the
    headline figures. ``eval`` prints its own table while it runs."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    islands = summary.get("islands") or {}
    if islands:
        table = Table(title="MILO islands (search = B_search accuracy, held-out = B_val)")
        for col in ("island", "mutator", "rounds", "best", "search acc", "held-out acc", "out tokens", "seconds",
                    "true quality"):
            table.add_column(col, justify="left" if col in ("island", "mutator", "best") else "right")
        for j, row in sorted(islands.items(), key=lambda kv: int(kv[0])):
            table.add_row(str(j), str(row.get("mutator", "-")), _fmt(row.get("rounds"), "d"),
                          str(row.get("harness_id", "-"))[:10], _fmt(row.get("search_accuracy")),
                          _fmt(row.get("heldout_accuracy")), _fmt(row.get("output_tokens"), ",.0f"),
                          _fmt(row.get("seconds"), ",.0f"), _fmt(row.get("true_quality")))
        console.print(table)
    rows = summary.get("final_test") or []
    if rows:
        fields = set(HarnessScore.__dataclass_fields__)
        scores = [HarnessScore(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in r.items() if k in fields})
                  for r in rows]
        print_scores("final evaluation on the test split", scores)
    headline = {k: summary[k] for k in ("executions_used", "best_seed_true_quality", "initial_true_quality",
                                        "final_true_quality", "rounds", "stop_reason") if k in summary}
    if headline:
        console.print("  ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in headline.items()))
