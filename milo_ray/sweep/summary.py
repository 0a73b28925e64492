"""A sweep's summary: ``<sweep dir>/summary.parquet`` and ``summary.md``, one row per job
(its overrides and setting, how the job ended and why it failed, and the incumbent's
final-test metrics with task-clustered 95% intervals), plus the comparison page
``<sweep dir>/comparison/comparison.html`` (what ``python -m milo_ray.report --compare
<sweep dir>`` writes).

The metrics are :func:`milo_ray.results.compare`'s rows (each the run's
:func:`milo_ray.results.final_test`), never recomputed here. A job whose driver died
before it wrote a manifest has no run: its row has the job's columns only.

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
import sys
import zlib
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from milo_ray.report import write_comparison
from milo_ray.sweep.jobs import JobOutcome

log = logging.getLogger(__name__)

SUMMARY_PARQUET, SUMMARY_MD, COMPARISON_DIR = "summary.parquet", "summary.md", "comparison"
JOB_COLUMNS = ["job", "overrides", "setting", "status", "exit_code", "error", "submission_id", "run_dir", "log_path",
               "started_at", "finished_at"]
# From results.compare, in this order (the run's own status is ``run_status``).
RUN_COLUMNS = ["run_status", "method", "rung", "benchmark", "stop_reason", "label", "harness_id", "n_tasks", "k",
               "pass_at_k", "pass_at_k_lo", "pass_at_k_hi", "pr_at_k", "pr_at_k_lo", "pr_at_k_hi",
               "rr_at_k", "rr_at_k_lo", "rr_at_k_hi", "true_score", "mean_output_tokens", "mean_seconds",
               "rollouts", "agent_calls", "agent_cost_usd", "wall_seconds"]


def _run_rows(sweep_dir: Path) -> dict[Path, dict[str, Any]]:
    """compare()'s row of every run below the sweep directory, by resolved run directory."""
    from milo_ray import results
    from milo_ray.report.compare import setting

    try:
        run_dirs = results.find_runs(sweep_dir)
    except results.RunDirError:
        return {}  # no job got as far as writing a manifest
    frame = results.compare(run_dirs)
    out = {}
    for _, row in frame.iterrows():
        values = row.to_dict()
        values["run_status"] = values.pop("status")
        values["setting"] = setting(row)
        out[Path(values["run_dir"]).resolve()] = values
    return out


def summary_frame(sweep_dir: str | Path, outcomes: Sequence[JobOutcome]) -> pd.DataFrame:
    """One row per job, in job order."""
    runs = _run_rows(Path(sweep_dir))
    rows = []
    for o in sorted(outcomes, key=lambda o: o.num):
        run = runs.get(Path(o.run_dir).resolve(), {})
        rows.append({"job": o.num, "overrides": " ".join(o.overrides), "setting": run.get("setting"),
                     "status": o.status, "exit_code": o.exit_code, "error": o.error(),
                     "submission_id": o.submission_id, "run_dir": o.run_dir, "log_path": o.log_path,
                     "started_at": o.started_at, "finished_at": o.finished_at,
                     **{c: run.get(c) for c in RUN_COLUMNS}})
    frame = pd.DataFrame(rows, columns=[*JOB_COLUMNS, *RUN_COLUMNS])
    return frame.astype({"job": "int64", "exit_code": "Int64", "n_tasks": "Int64", "k": "Int64",
                         "rollouts": "Int64", "agent_calls": "Int64"})


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _interval(row: pd.Series, metric: str) -> str:
    value = row[metric]
    if value is None or pd.isna(value):
        return "-"
    return f"{value:.3f} [{row[f'{metric}_lo']:.3f}, {row[f'{metric}_hi']:.3f}]"


def markdown(frame: pd.DataFrame, outcomes: Sequence[JobOutcome], comparison: Path | None,
             comparison_error: str | None = None) -> str:
    failed = frame[frame["status"] != "SUCCEEDED"]
    lines = [f"# Sweep summary", "",
             f"{len(frame)} job(s): {len(frame) - len(failed)} succeeded, {len(failed)} failed. Metrics: the "
             "incumbent's final test (milo_ray.results.compare), value [task-clustered 95% interval].", "",
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
    frame = summary_frame(sweep_dir, outcomes)
    paths = {"parquet": sweep_dir / SUMMARY_PARQUET, "markdown": sweep_dir / SUMMARY_MD}
    frame.to_parquet(paths["parquet"], index=False)
    comparison, why = None, None
    if frame["run_status"].notna().any():
        try:
            comparison = write_comparison([sweep_dir], sweep_dir / COMPARISON_DIR)
            paths["comparison"] = comparison
        except Exception as exc:  # the summary stands without the page; say why
            why = f"{type(exc).__name__}: {exc}"
            log.warning("no comparison page written (%s)", why)
    else:
        why = "no job wrote a run"
    paths["markdown"].write_text(markdown(frame, outcomes, comparison, why), encoding="utf-8")
    return paths


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
    for name, path in write_summary(args[0], unpack_outcomes(args[1])).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
