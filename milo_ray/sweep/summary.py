"""A sweep's summary: ``<sweep dir>/summary.parquet`` and ``summary.md``, one row per job
(its overrides and setting, how the job ended and why it failed, and the incumbent's
final-test metrics with task-clustered 95% intervals), plus the comparison page
``<sweep dir>/comparison/comparison.html`` (what ``python -m milo_ray.report --compare
<sweep dir>`` writes).

The metrics are :func:`milo_ray.results.compare`'s rows (each the run's
:func:`milo_ray.results.final_test`), never recomputed here. Every job's run directory is
read: a job whose run cannot be read has the job's columns only, with ``run_problem``
saying why and ``driver_node`` where its driver ran; one that Ray calls SUCCEEDED is
reported as ``RUN_MISSING`` (a failure), never as a success with empty metrics (its
driver wrote it on a disk the summary does not see: another node's), and the comparison
page names it.

It reads the run directories, so it runs where they are: in the launcher's process for a
Ray on this machine, as a last Ray job on a cluster
(``python -m milo_ray.sweep.summary SWEEP_DIR OUTCOMES``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import socket
import sys
import zlib
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from milo_ray.report import write_comparison
from milo_ray.sweep.jobs import RUN_MISSING, SUCCEEDED, JobOutcome
from milo_ray.sweep.placement import run_dir_is_durable

log = logging.getLogger(__name__)

SUMMARY_PARQUET, SUMMARY_MD, COMPARISON_DIR = "summary.parquet", "summary.md", "comparison"
JOB_COLUMNS = ["job", "overrides", "setting", "status", "exit_code", "error", "submission_id", "run_dir", "log_path",
               "started_at", "finished_at", "driver_node", "run_problem"]
# From results.compare, in this order (the run's own status is ``run_status``).
RUN_COLUMNS = ["run_status", "method", "rung", "benchmark", "stop_reason", "label", "harness_id", "n_tasks", "k",
               "pass_at_k", "pass_at_k_lo", "pass_at_k_hi", "pr_at_k", "pr_at_k_lo", "pr_at_k_hi",
               "rr_at_k", "rr_at_k_lo", "rr_at_k_hi", "true_score", "mean_output_tokens", "mean_seconds",
               "rollouts", "agent_calls", "agent_cost_usd", "wall_seconds", "stopped_by_sweep_cap"]


def _read_run(run_dir: str) -> tuple[dict[str, Any] | None, str | None]:
    """compare()'s row of the run in ``run_dir``, or None and why it cannot be read here."""
    from milo_ray import results
    from milo_ray.report.compare import setting

    path = Path(run_dir)
    if run_dir_is_durable(run_dir):  # on object storage: results reads it from there
        path = run_dir
    elif not path.is_dir():
        return None, f"its run directory {run_dir} does not exist"
    elif not (path / "manifest.json").is_file():
        return None, f"its run directory {run_dir} has no manifest.json"
    try:
        row = results.compare([path]).iloc[0].to_dict()
    except Exception as exc:  # a half-written or foreign directory: this job's problem only
        return None, f"its run in {run_dir} cannot be read ({type(exc).__name__}: {exc})"
    row["run_status"] = row.pop("status")
    row["setting"] = setting(row)
    row["stopped_by_sweep_cap"] = sweep_cap_stopped(path)
    return row, None


def sweep_cap_stopped(run_dir: str | Path) -> bool:
    """Whether the sweep's spend cap (``hydra.launcher.max_usd``) stopped this run: its
    ``run_budget_exhausted`` event says the sweep's ledger refused (scope ``sweep``), not
    the run's own budget."""
    from milo_ray.store.parquet import open_run

    for event in open_run(run_dir).read("events").to_pylist():
        if event["kind"] == "run_budget_exhausted" and json.loads(event["payload"] or "{}").get("scope") == "sweep":
            return True
    return False


def check_runs(outcomes: Sequence[JobOutcome]) -> dict[int, dict[str, Any]]:
    """Read every job's run; returns compare()'s row by job number for those that can be
    read, and records on each other outcome why not (``run_problem``). A job Ray calls
    SUCCEEDED whose run cannot be read becomes ``RUN_MISSING``."""
    host = socket.gethostname()
    rows = {}
    for o in outcomes:
        row, problem = _read_run(o.run_dir)
        if row is not None:
            rows[o.num] = row
            continue
        where = f"on {o.driver_node}" if o.driver_node else "on a node Ray did not name"
        o.run_problem = f"{problem} on {host}, where the summary reads the runs; its driver ran {where}"
        if o.status == SUCCEEDED:
            o.status = RUN_MISSING
    return rows


def summary_frame(outcomes: Sequence[JobOutcome], runs: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """One row per job, in job order (``runs``: :func:`check_runs`)."""
    rows = []
    for o in sorted(outcomes, key=lambda o: o.num):
        run = runs.get(o.num, {})
        rows.append({"job": o.num, "overrides": " ".join(o.overrides), "setting": run.get("setting"),
                     "status": o.status, "exit_code": o.exit_code, "error": o.error(),
                     "submission_id": o.submission_id, "run_dir": o.run_dir, "log_path": o.log_path,
                     "started_at": o.started_at, "finished_at": o.finished_at, "driver_node": o.driver_node,
                     "run_problem": o.run_problem, **{c: run.get(c) for c in RUN_COLUMNS}})
    frame = pd.DataFrame(rows, columns=[*JOB_COLUMNS, *RUN_COLUMNS])
    return frame.astype({"job": "int64", "exit_code": "Int64", "n_tasks": "Int64", "k": "Int64",
                         "rollouts": "Int64", "agent_calls": "Int64"})


def missing_notes(outcomes: Sequence[JobOutcome]) -> list[str]:
    """One line per job whose run cannot be read: the job, its status and why."""
    return [f"Job {o.num} ({' '.join(o.overrides) or 'no overrides'}) is not on this page: {o.status}, "
            f"{o.run_problem}." for o in sorted(outcomes, key=lambda o: o.num) if o.run_problem]


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _interval(row: pd.Series, metric: str) -> str:
    value = row[metric]
    if value is None or pd.isna(value):
        return "-"
    return f"{value:.3f} [{row[f'{metric}_lo']:.3f}, {row[f'{metric}_hi']:.3f}]"


def _sweep_cap_lines(frame: pd.DataFrame) -> list[str]:
    """The jobs the sweep's spend cap stopped (each resumes with run.resume=<its run_dir>
    once the cap is raised), or nothing when it stopped none."""
    stopped = frame[frame["stopped_by_sweep_cap"].fillna(False).astype(bool)]
    if stopped.empty:
        return []
    jobs = ", ".join(f"job {r['job']} ({r['overrides'] or 'no overrides'})" for _, r in stopped.iterrows())
    return [f"Stopped by the sweep's spend cap (hydra.launcher.max_usd): {jobs}. Each run is resumable "
            "(run.resume=<its run_dir>) once the cap is raised.", ""]


def markdown(frame: pd.DataFrame, outcomes: Sequence[JobOutcome], comparison: Path | None,
             comparison_error: str | None = None) -> str:
    failed = frame[frame["status"] != "SUCCEEDED"]
    missing = int((frame["status"] == RUN_MISSING).sum())
    lost = f" ({missing} of them {RUN_MISSING}: Ray says the job succeeded, but its run cannot be read)" \
        if missing else ""
    lines = [f"# Sweep summary", "",
             f"{len(frame)} job(s): {len(frame) - len(failed)} succeeded, {len(failed)} failed{lost}. Metrics: the "
             "incumbent's final test (milo_ray.results.compare), value [task-clustered 95% interval].", "",
             *_sweep_cap_lines(frame),
             "| job | overrides | setting | status | pass@k | PR@k | RR@k | k | tasks | true score | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in frame.iterrows():
        true = "-" if r["true_score"] is None or pd.isna(r["true_score"]) else f"{r['true_score']:.4f}"
        lines.append(f"| {r['job']} | {_cell(r['overrides'])} | {_cell(r['setting'])} | {_cell(r['status'])} "
                     f"| {_interval(r, 'pass_at_k')} | {_interval(r, 'pr_at_k')} | {_interval(r, 'rr_at_k')} "
                     f"| {_cell(r['k'])} | {_cell(r['n_tasks'])} | {true} | {_cell(r['error'])} |")
    by_num = {o.num: o for o in outcomes}
    if len(failed):
        lines += ["", "## Failed jobs", ""]
        for _, r in failed.iterrows():
            o = by_num[int(r["job"])]
            lines += [f"### job {o.num}: {o.status}" + (f" (exit code {o.exit_code})" if o.exit_code is not None
                                                       else ""),
                      "", f"overrides: `{' '.join(o.overrides)}`", ""]
            if o.run_problem:
                lines += [f"run: {o.run_problem}", ""]
            if o.message:  # its first line: the rest quotes the log, shown below
                lines += [f"Ray: {o.message.strip().splitlines()[0]}", ""]
            if o.log_tail:
                lines += [f"last lines of its log" + (f" ({o.log_path})" if o.log_path else "") + ":", "",
                          "```", o.log_tail, "```", ""]
    lines += [""]
    if comparison is not None:
        lines.append(f"Comparison page: {comparison} (rewrite it with `python -m milo_ray.report --compare "
                     f"{comparison.parent.parent}`).")
    elif comparison_error:
        lines.append(f"No comparison page: {comparison_error}")
    return "\n".join(lines) + "\n"


def write_summary(sweep_dir: str | Path, outcomes: Sequence[JobOutcome]) -> dict[str, Path]:
    """Write summary.parquet, summary.md and the comparison page; returns their paths. The
    comparison page is skipped (and summary.md says why) when no run can be compared."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    runs = check_runs(outcomes)
    frame = summary_frame(outcomes, runs)
    paths = {"parquet": sweep_dir / SUMMARY_PARQUET, "markdown": sweep_dir / SUMMARY_MD}
    frame.to_parquet(paths["parquet"], index=False)
    comparison, why = None, None
    if runs:
        readable = [o.run_dir for o in sorted(outcomes, key=lambda o: o.num) if o.num in runs]
        try:
            comparison = write_comparison(readable, sweep_dir / COMPARISON_DIR, notes=missing_notes(outcomes))
            paths["comparison"] = comparison
        except Exception as exc:  # the summary stands without the page; say why
            why = f"{type(exc).__name__}: {exc}"
            log.warning("no comparison page written (%s)", why)
    else:
        why = "no job's run can be read" + (f" ({'; '.join(missing_notes(outcomes))})" if any(
            o.run_problem for o in outcomes) else "")
    paths["markdown"].write_text(markdown(frame, outcomes, comparison, why), encoding="utf-8")
    return paths


RUN_PROBLEM_LINE = "run_problem: "  # main's line for a job whose run cannot be read

# One argument of a command line is at most 128 KiB on Linux (MAX_ARG_STRLEN).
_MAX_ARG = 100_000


def pack_outcomes(outcomes: Sequence[JobOutcome]) -> str:
    """The outcomes as one command-line argument (JSON, zlib, base64); log tails are cut
    to their last lines when the whole would not fit."""
    for keep in (None, 5, 1, 0):
        rows = [dataclasses.asdict(o) for o in outcomes]
        if keep is not None:
            for r in rows:
                r["log_tail"] = "\n".join(r["log_tail"].splitlines()[-keep:]) if keep else ""
                r["message"] = (r["message"] or "")[-500:] or None
        packed = base64.b64encode(zlib.compress(json.dumps(rows).encode())).decode()
        if len(packed) <= _MAX_ARG:
            break
    return packed


def unpack_outcomes(packed: str) -> list[JobOutcome]:
    rows = json.loads(zlib.decompress(base64.b64decode(packed)))
    return [JobOutcome(**{**d, "overrides": tuple(d["overrides"])}) for d in rows]


def main(argv: list[str] | None = None) -> int:
    """``python -m milo_ray.sweep.summary SWEEP_DIR OUTCOMES`` (:func:`pack_outcomes`): the
    summary as a Ray job on the cluster that holds the run directories."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m milo_ray.sweep.summary SWEEP_DIR OUTCOMES", file=sys.stderr)
        return 2
    outcomes = unpack_outcomes(args[1])
    for name, path in write_summary(args[0], outcomes).items():
        print(f"{name}: {path}")
    for o in outcomes:  # what the launcher reports and counts (it cannot read the runs itself)
        if o.run_problem:
            print(f"{RUN_PROBLEM_LINE}{json.dumps({'job': o.num, 'status': o.status, 'run_problem': o.run_problem})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
