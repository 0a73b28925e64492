"""Evaluating fixed harnesses: the ``eval`` method and the leaderboard table that every
method prints (pass@k, PR@k, RR@k with task-clustered 95% intervals, tokens, seconds).
"""

from __future__ import annotations

from typing import Any, Sequence

from milo_ray.context import RunContext
from milo_ray.execution.budget import BudgetExceeded
from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.harness.model import Harness
from milo_ray.search.events import already_stored
from milo_ray.search.final_test import true_score
from milo_ray.search.plugin import SPEC_KEY, final_test_record
from milo_ray.search.recording import HarnessRecorder
from milo_ray.search.scores import HarnessScore, print_scores, summarize

EVAL_SUMMARY, ORACLE_SUMMARY = "eval_summary", "oracle_summary"  # the method's records in ``events``
# How an oracle run's one leaderboard row is named, and the split its test spans.
ORACLE_LABEL, ORACLE_SPLIT = "oracle (reference solutions)", "every split"
EVAL_EVENT_KINDS = (EVAL_SUMMARY, ORACLE_SUMMARY)


class EvalMethod:
    """Evaluate the benchmark's seed harnesses (or the named subset) on one split; with
    ``executor.agent=oracle`` validate the task suite instead (every task once).

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

        if oracle_mode(ctx.scheduler):
            return self._validate_suite(ctx)
        resolve_split(ctx.benchmark, self.split, field="method.split")
        seeds = self._seeds(ctx.benchmark)
        task_ids = [t.task_id for t in ctx.benchmark.tasks(self.split)]
        recorder = HarnessRecorder(ctx.store, resumed=ctx.resumed)
        for h in seeds:
            ctx.scheduler.add_harness(h)
            recorder.record(h, origin="seed", admitted=True)
        results: list[RolloutResult] = []
        k_done = 0
        stop = "finished"
        for i in range(self.k):
            if ctx.out_of_time():
                stop = "time limit"
                break
            try:
                results += ctx.scheduler.run([RolloutRequest(h.harness_id, t, i, ctx.seed, split=self.split,
                                                             method="eval", group=h.name or h.harness_id)
                                              for h in seeds for t in task_ids])
            except BudgetExceeded:
                # The run's budget ran out before or during this wave (its rollouts are
                # stored): the summary reports the waves that completed.
                stop = "budget"
                break
            k_done = i + 1
        by_harness: dict[str, list[RolloutResult]] = {}
        for r in results:
            by_harness.setdefault(r.harness_id, []).append(r)
        rows = [summarize(h.name, h, by_harness.get(h.harness_id, []), task_ids, k_done,
                          true_score=true_score(ctx.benchmark, h, self.split)) for h in seeds] if k_done else []
        if rows:
            print_scores(f"{ctx.benchmark.name}: {self.split} split, k={k_done}", rows)
        _record_once(ctx, EVAL_SUMMARY, {"split": self.split, "k": k_done, "k_requested": self.k,
                                         "stop_reason": stop, "rows": [r.as_dict() for r in rows]})
        summary = {"method": "eval", "split": self.split, "k": k_done, "k_requested": self.k, "stop_reason": stop,
                   "harnesses": [r.as_dict() for r in rows]}
        if k_done:  # what the read side tests against: these tasks, these rollouts
            summary[SPEC_KEY] = final_test_record(self.split, k_done, task_ids, results)
        return summary


    def _validate_suite(self, ctx: RunContext) -> dict[str, Any]:
        """``executor.agent=oracle``: the reference solutions run instead of any harness, so
        every harness would score the same. Validate the suite instead: every task of every
        split once (``method.split``, ``method.k`` and ``method.names`` do not apply), one
        row per task, and the tasks whose oracle is not resolved listed by name (a reference
        solution that failed scores 0 with its reason). The fuller check -- a do-nothing
        agent, repeats, images, one verdict per task -- is ``python -m milo_ray.tasks check``."""
        seed_h = self._seeds(ctx.benchmark)[0]  # a rollout names a harness; the oracle ignores it
        ctx.scheduler.add_harness(seed_h)
        HarnessRecorder(ctx.store, resumed=ctx.resumed).record(seed_h, origin="seed", admitted=True)
        tasks: dict[str, str] = {}
        for split, split_tasks in ctx.benchmark.splits().items():
            for t in split_tasks:
                tasks.setdefault(t.task_id, split)
        results = ctx.scheduler.run([RolloutRequest(seed_h.harness_id, tid, 0, ctx.seed, split=split, method="eval",
                                                    stage="oracle", group="oracle")
                                     for tid, split in tasks.items()])
        rows = sorted(({"task_id": r.task_id, "split": tasks.get(r.task_id, ""), "score": r.score,
                        "resolved": r.score >= 1.0, "error_kind": r.error_kind, "error": r.error} for r in results),
                      key=lambda row: row["task_id"])
        failing = [row for row in rows if not row["resolved"]]
        print_oracle_table(ctx.benchmark.name, rows)
        summary = {"method": "eval", "mode": "oracle", "tasks": len(rows), "resolved": len(rows) - len(failing),
                   "failing": [row["task_id"] for row in failing], "rows": rows}
        _record_once(ctx, ORACLE_SUMMARY, summary)
        # What the read side (report, comparison, milo_ray.results) scores: every task of every
        # split once, under the oracle's name -- not the seed harness the requests carry.
        summary.update(stop_reason="finished", k=1,
                       harnesses=[{"harness_id": seed_h.harness_id, "name": ORACLE_LABEL}])
        summary[SPEC_KEY] = final_test_record(ORACLE_SPLIT, 1, list(tasks), results)
        return summary


def _record_once(ctx: RunContext, kind: str, payload: dict[str, Any]) -> None:
    """Store the summary event unless a resumed run already holds the same one: a session
    killed after storing it, before the run was marked finished, must not leave it twice."""
    if ctx.resumed and already_stored(ctx.store, kind, payload):
        return
    ctx.store.event(kind, payload)


def oracle_mode(scheduler: Any) -> bool:
    """Whether the run's executor runs the tasks' reference solutions (``executor.agent=oracle``)."""
    config = getattr(scheduler, "executor_config", None)
    agent = config.get("agent") if isinstance(config, dict) else getattr(config, "agent", None)
    return agent == "oracle"


def print_oracle_table(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}: reference solutions (executor.agent=oracle), every task once")
    for col in ("task", "split", "score", "error"):
        table.add_column(col, justify="right" if col == "score" else "left")
    for row in rows:
        table.add_row(row["task_id"], row["split"], _fmt(row["score"]),
                      "-" if not row["error"] else f"{row['error_kind']}: {str(row['error'])[:100]}")
    console = Console(width=160)
    console.print(table)
    console.print(f"{sum(r['resolved'] for r in rows)}/{len(rows)} tasks resolved by their reference solution")
    # This mode answers one question; the task check also grades a do-nothing agent,
    # repeats the oracle for flaky verifiers and looks for missing images.
    console.print("for a verdict per task (trivial, flaky, needs-network, ...): python -m milo_ray.tasks check PATH")


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, (int, float)) else str(value)


def final_test_titles(summary: dict[str, Any]) -> tuple[str, str]:
    """The console titles of a search's final-test tables: every task of the test split
    (saying how many the search also ran), and the held-out tasks alone."""
    spec = summary.get(SPEC_KEY) or {}
    split, k = spec.get("split", "test"), spec.get("k")
    tasks, held_out = spec.get("task_ids"), spec.get("held_out_task_ids")
    fresh = f"{k} fresh rollout(s) per task" if k is not None else "fresh rollouts"
    if tasks is None or held_out is None:
        return f"final test on the {split} split ({fresh})", f"final test on the held-out {split} tasks ({fresh})"
    shared = len(tasks) - len(held_out)
    full = (f"final test: all {len(tasks)} tasks of the {split} split, {fresh}; "
            + (f"{shared} of them the search also ran (the papers' full benchmark, not held out)" if shared
               else "none of them run by the search (held out)"))
    return full, f"final test: the {len(held_out)} {split} tasks the search never ran (held out), {fresh}"


def print_run_summary(summary: dict[str, Any]) -> None:
    """The end-of-run console report of any method: MILO's per-island table, the final
    test leaderboard rows (``final_test``: ``HarnessScore.as_dict()`` rows) and the
    headline figures. ``eval`` prints its own table while it runs."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    islands = summary.get("islands") or {}
    if islands:
        table = Table(title="MILO islands (search = B_search accuracy, held-out = B_val accuracy; tokens and "
                            "seconds: the best harness's means per rollout on B_search)")
        for col in ("island", "mutator", "rounds", "best", "search acc", "held-out acc", "out tokens/rollout",
                    "s/rollout", "true quality"):
            table.add_column(col, justify="left" if col in ("island", "mutator", "best") else "right")
        for j, row in sorted(islands.items(), key=lambda kv: int(kv[0])):
            table.add_row(str(j), str(row.get("mutator", "-")), _fmt(row.get("rounds"), "d"),
                          str(row.get("harness_id", "-"))[:10], _fmt(row.get("search_accuracy")),
                          _fmt(row.get("heldout_accuracy")), _fmt(row.get("output_tokens"), ",.0f"),
                          _fmt(row.get("seconds"), ",.0f"), _fmt(row.get("true_quality")))
        console.print(table)
    full_title, held_out_title = final_test_titles(summary)
    for key, title in (("final_test", full_title), ("final_test_held_out", held_out_title)):
        rows = summary.get(key) or []
        if rows:
            fields = set(HarnessScore.__dataclass_fields__)
            print_scores(title, [HarnessScore(**{k: (tuple(v) if isinstance(v, list) else v)
                                                 for k, v in r.items() if k in fields}) for r in rows])
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
