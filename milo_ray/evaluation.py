"""Evaluating fixed harnesses: the ``eval`` method and the leaderboard table that every
method prints (pass@k, PR@k, RR@k with task-clustered 95% intervals, tokens, seconds).
"""

from __future__ import annotations

from typing import Any, Sequence

from milo_ray.context import RunContext
from milo_ray.execution.types import RolloutRequest, RolloutResult
from milo_ray.harness.model import Harness
from milo_ray.search.final_test import true_score
from milo_ray.search.recording import HarnessRecorder
from milo_ray.search.scores import HarnessScore, print_scores, summarize


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
        recorder = HarnessRecorder(ctx.store, resumed=ctx.resumed)
        for h in seeds:
            ctx.scheduler.add_harness(h)
            recorder.record(h, origin="seed", admitted=True)
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
    spend = summary.get("spend_by_role") or {}
    if spend:
        table = Table(title="agent spend by role (agent_calls)")
        for col in ("role", "calls", "input tokens", "output tokens", "USD", "seconds", "errors"):
            table.add_column(col, justify="left" if col == "role" else "right")
        for role, s in spend.items():
            usd = _fmt(s.get("cost_usd"), ",.4f")
            if s.get("unpriced_calls"):
                usd += f" (+{s['unpriced_calls']} unpriced)"
            table.add_row(role, _fmt(s.get("calls"), ",d"), _fmt(s.get("input_tokens"), ",d"),
                          _fmt(s.get("output_tokens"), ",d"), usd, _fmt(s.get("seconds"), ",.1f"),
                          _fmt(s.get("errors"), "d"))
        console.print(table)
    headline = {k: summary[k] for k in ("executions_used", "best_seed_true_quality", "initial_true_quality",
                                        "final_true_quality", "rounds", "stop_reason") if k in summary}
    if headline:
        console.print("  ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in headline.items()))
