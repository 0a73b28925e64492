"""The evidence directory a mutator reads about a parent harness (MILO App. C.1).

Layout written by ``write_evidence_dir``:

* ``report.md`` — aggregate accuracy (mean score), resolve rate, timeouts, mean tokens
  and seconds, then one row per task: pass/fail, tests passed (worst rollout), mean
  score, tokens, seconds, timeouts. Where a model ran (the rollouts counted them), also
  the invalid tool calls -- the model's tool calls whose arguments did not parse, which
  the agent never ran -- in all and per task; the calls themselves (tool, raw arguments,
  parse error) are the ``invalid_tool_calls`` of the trajectory's steps.
* ``ctrf.json`` — one merged ctrf report: the worst rollout's tests of every task,
  test names prefixed with the task id, summary totals.
* ``traces/<task_id>/trajectory.json`` and ``traces/<task_id>/ctrf.json`` — the worst
  rollout of the task (lowest score, then lowest rollout index). With k > 1 rollouts
  every rollout is also kept as ``traces/<task_id>/rollout-<i>/{trajectory,ctrf}.json``;
  the top-level files are copies of the worst one, so a reader that only knows the
  ``traces/<task>/trajectory.json`` convention still sees the most telling failure.
* ``traces/<task_id>/result.json`` — for failed tasks only (a task fails when any
  rollout is not fully resolved): the verifier reward per rollout and errors, invalid
  tool calls where counted (for real tasks also what the verifier said: its reward
  values, error and output tail).
  A trace without a CTRF report (a verifier that wrote none) leaves no ``ctrf.json``.
* files a task's format adds from its verifier's record, beside the trajectory (and per
  rollout with k > 1), for every task whether it failed or not: the format's
  ``evidence_files(verifier, task)`` names them (a PaperBench paper's ``graded.md``: each
  rubric leaf with its verdict and the grader's reason).

Traces come from ``result.trace`` when still inline, else ``store.get_blob(result.trace_ref)``.

Every file is written below ``path`` without following a link (:mod:`milo_ray.boundary.nofollow`),
and a task id that is not a plain relative path (``..``, an absolute path) is quoted into one
directory name: the directory is copied into a coding agent's workspace, and a task's id is
the task's text, not the run's.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import quote

from milo_ray.boundary.nofollow import UnsafePath, safe_relpath, write_file_nofollow
from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task


def _trace(result: RolloutResult, store: Any) -> dict[str, Any] | None:
    if result.trace is not None:
        return result.trace
    if result.trace_ref and store is not None:
        try:
            return store.get_blob(result.trace_ref)
        except Exception:  # a missing blob is missing evidence, not a crash of the round
            return None
    return None


log = logging.getLogger(__name__)


def _dump(root: Path, rel: str, obj: Any) -> None:
    """Write ``obj`` as JSON at ``root/rel``; nothing for None (a verifier that wrote no
    CTRF report leaves no ctrf.json rather than a file saying null). A link or special file
    in the way is never written through: that file of the evidence is left out."""
    if obj is None:
        return
    _write(root, rel, json.dumps(obj, indent=1, sort_keys=False))


def _write(root: Path, rel: str, text: str) -> None:
    try:
        write_file_nofollow(root, rel, text.encode("utf-8"))
    except UnsafePath as e:
        log.warning("evidence %s: %s not written: %s", root, rel, e.reason)


def task_dir_name(task_id: str) -> str:
    """``traces/<this>``: the task id when it is a plain relative path, else the id
    quoted into one name (``..`` or ``/`` never leave ``traces/``)."""
    try:
        safe_relpath(task_id)
        return task_id
    except UnsafePath:
        return quote(task_id, safe="") or "%00"


def _tests_passed(trace: dict[str, Any] | None) -> tuple[int, int] | None:
    try:
        s = trace["ctrf"]["results"]["summary"]  # type: ignore[index]
        return int(s["passed"]), int(s["tests"])
    except (KeyError, TypeError):
        return None


# What an optimizer run's trace says about its grading (the rest of it, the values, is
# the construction itself: large, and no help in a diagnosis).
_RUN_FIELDS = ("problem", "n", "start_score", "score", "reason", "status", "publishes")


def _grading(trace: dict[str, Any] | None, task: Task | None) -> dict[str, Any]:
    """How a rollout was graded, for ``result.json``: a real task's ``verifier`` (its
    reward values, error and output tail), or an optimizer run's ``run`` (start and final
    score, why a point was rejected, the run's budget)."""
    trace = trace or {}
    if trace.get("verifier"):
        return {"verifier": trace["verifier"]}
    if trace.get("problem"):
        run = {k: trace.get(k) for k in _RUN_FIELDS if k in trace}
        budget = (getattr(task, "metadata", None) or {}).get("budget_s")
        return {"run": {**run, **({"budget_s": budget} if budget is not None else {})}}
    return {}


def _format_files(root: Path, tdir: str, task: Task | None, trace: dict[str, Any] | None) -> None:
    """The files ``task``'s format adds to its evidence from a rollout's verifier record
    (module docstring), written under ``tdir``. A format without the hook adds nothing;
    a hook that fails leaves its files out rather than the round without evidence."""
    hook = getattr(getattr(task, "format", None), "evidence_files", None)
    verifier = (trace or {}).get("verifier")
    if hook is None or not verifier:
        return
    try:
        files = hook(verifier, task)
    except Exception as e:  # noqa: BLE001 -- evidence is advisory; the mutation still runs
        log.warning("evidence %s: %s's extra files not written: %s", root, tdir, e)
        return
    for name, text in files.items():
        _write(root, f"{tdir}/{name}", text)


def write_evidence_dir(path: str | Path, harness: Any, results: Iterable[RolloutResult],
                       tasks: Mapping[str, Task] | Iterable[Task], store: Any = None) -> Path:
    """Write the evidence directory of ``harness`` from its rollout ``results``; returns ``path``."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    task_map = dict(tasks) if isinstance(tasks, Mapping) else {t.task_id: t for t in tasks}
    by_task: dict[str, list[RolloutResult]] = defaultdict(list)
    for r in results:
        by_task[r.task_id].append(r)
    order = [t for t in task_map if t in by_task] + sorted(t for t in by_task if t not in task_map)
    merged_tests: list[dict[str, Any]] = []
    rows: list[str] = []
    # Only rollouts of a model count invalid tool calls (None elsewhere: a surrogate or an
    # oracle run, or a run stored before the count): the figures below say how many did.
    counted = [r for rs in by_task.values() for r in rs if r.invalid_tool_calls is not None]
    n_roll = n_res = n_timeouts = 0
    sum_score = sum_tok = sum_sec = 0.0
    for tid in order:
        rs = sorted(by_task[tid], key=lambda r: r.rollout_idx)
        worst = min(rs, key=lambda r: (r.score, r.rollout_idx))
        traces = {r.rollout_idx: _trace(r, store) for r in rs}
        tdir = f"traces/{task_dir_name(tid)}"
        if len(rs) > 1:
            for r in rs:
                tr = traces[r.rollout_idx]
                if tr is not None:
                    _dump(root, f"{tdir}/rollout-{r.rollout_idx}/trajectory.json", tr.get("trajectory"))
                    _dump(root, f"{tdir}/rollout-{r.rollout_idx}/ctrf.json", tr.get("ctrf"))
                    _format_files(root, f"{tdir}/rollout-{r.rollout_idx}", task_map.get(tid), tr)
        wt = traces[worst.rollout_idx]
        if wt is not None:
            _dump(root, f"{tdir}/trajectory.json", wt.get("trajectory"))
            _dump(root, f"{tdir}/ctrf.json", wt.get("ctrf"))
            _format_files(root, tdir, task_map.get(tid), wt)
            for t in ((wt.get("ctrf") or {}).get("results") or {}).get("tests", []):
                merged_tests.append({**t, "name": f"{tid}::{t.get('name')}"})
        failed = any(not r.resolved for r in rs)
        if failed:
            _dump(root, f"{tdir}/result.json", {
                "task_id": tid, "reward": sum(r.score for r in rs) / len(rs),
                "rollouts": [{"rollout_idx": r.rollout_idx, "reward": r.score, "resolved": r.resolved,
                              "timed_out": r.timed_out, "error_kind": r.error_kind, "error": r.error,
                              **({"invalid_tool_calls": r.invalid_tool_calls} if r.invalid_tool_calls is not None
                                 else {}),
                              "output_tokens": r.output_tokens, "seconds": r.latency_s,
                              **_grading(traces[r.rollout_idx], task_map.get(tid))} for r in rs]})
        tp = _tests_passed(wt)
        mean = sum(r.score for r in rs) / len(rs)
        tok = sum(r.output_tokens for r in rs) / len(rs)
        sec = sum(r.latency_s for r in rs) / len(rs)
        tos = sum(r.timed_out for r in rs)
        errs = sorted({r.error_kind for r in rs if r.error_kind})
        invalid = [r.invalid_tool_calls for r in rs if r.invalid_tool_calls is not None]
        invalid_cell = f" {sum(invalid)} |" if invalid else " - |"
        rows.append(f"| {tid} | {'FAIL' if failed else 'pass'} | {f'{tp[0]}/{tp[1]}' if tp else '-'} | {mean:.3f} | "
                    f"{sum(r.resolved for r in rs)}/{len(rs)} | {tok:,.0f} | {sec:,.0f} | {tos} |"
                    f"{invalid_cell if counted else ''} {','.join(errs) or '-'} |")
        n_roll += len(rs)
        n_res += sum(r.resolved for r in rs)
        n_timeouts += tos
        sum_score += sum(r.score for r in rs)
        sum_tok += sum(r.output_tokens for r in rs)
        sum_sec += sum(r.latency_s for r in rs)
    n = max(n_roll, 1)
    name = getattr(harness, "name", "") or ""
    head = [
        f"# Evidence for harness {getattr(harness, 'harness_id', '?')} {f'({name})' if name else ''}".rstrip(),
        "",
        f"- tasks: {len(order)}, rollouts: {n_roll}",
        f"- accuracy (mean fraction of tests passed): {sum_score / n:.3f}",
        f"- resolve rate: {n_res / n:.3f}",
        f"- timeouts: {n_timeouts}",
        f"- mean output tokens: {sum_tok / n:,.0f}",
        f"- mean agent seconds: {sum_sec / n:,.0f}",
        *([f"- invalid tool calls (the model's tool calls whose arguments did not parse; not run): "
           f"{sum(r.invalid_tool_calls for r in counted)} in all, in {sum(bool(r.invalid_tool_calls) for r in counted)} "
           f"of the {len(counted)} rollouts that counted them"] if counted else []),
        "",
        "Per task (tests passed = the worst rollout, whose trace is in traces/<task>/"
        f"{'; invalid tool calls: the sum over its rollouts' if counted else ''}):",
        "",
        "| task | status | tests passed | mean score | resolved | output tokens | seconds | timeouts |"
        f"{' invalid tool calls |' if counted else ''} errors |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if counted else ""),
    ]
    _write(root, "report.md", "\n".join(head + rows) + "\n")
    passed = sum(t.get("status") == "passed" for t in merged_tests)
    _dump(root, "ctrf.json", {"results": {
        "tool": {"name": "milo_ray-evidence"},
        "summary": {"tests": len(merged_tests), "passed": passed, "failed": len(merged_tests) - passed,
                    "skipped": 0, "pending": 0, "other": 0},
        "tests": merged_tests}})
    return root
