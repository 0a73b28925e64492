"""What a task check leaves behind: the console table, ``verdicts.parquet`` (one row per
task), ``verdicts.md`` (the same table for a README or an issue) and, on request, a split
file of the ``ok`` tasks that ``benchmark.split_file=`` takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from milo_ray.tasks.check import CheckResult
from milo_ray.tasks.verdicts import OK, VERDICTS

REASON_CHARS = 160  # of a reason in the console and markdown tables (Parquet keeps it whole)


def _scores(xs: tuple[float, ...]) -> str:
    return " ".join(f"{x:.3g}" for x in xs) if xs else "-"


def _short(text: str, n: int = REASON_CHARS) -> str:
    one = " ".join(str(text).split())
    return one if len(one) <= n else one[: n - 3] + "..."


def rows(result: CheckResult) -> list[dict[str, Any]]:
    return [{"task_id": v.task_id, "verdict": v.verdict, "oracle_scores": list(v.oracle_scores),
             "noop_score": v.noop_score, "reason": v.reason, "notes": "; ".join(v.notes),
             "suite": result.suite, "format": result.kind, "sandbox": result.sandbox} for v in result.verdicts]


def counts_line(result: CheckResult) -> str:
    by = result.by_verdict()
    parts = [f"{len(by[v])} {v}" for v in VERDICTS if v in by]
    return (f"{len(result.verdicts)} tasks: {', '.join(parts)} (sandbox={result.sandbox}, "
            f"oracle x{result.repeat}, {result.seconds:.0f} s)")


def print_table(result: CheckResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"task check of {result.suite} ({result.kind})")
    for col in ("task", "verdict", "oracle", "no-op", "reason"):
        table.add_column(col, justify="right" if col in ("oracle", "no-op") else "left",
                         overflow="fold" if col == "reason" else "ellipsis")
    for v in result.verdicts:
        table.add_row(v.task_id, v.verdict, _scores(v.oracle_scores),
                      "-" if v.noop_score is None else f"{v.noop_score:.3g}", _short(v.reason))
    console = Console(width=160)
    console.print(table)
    console.print(counts_line(result))


def markdown(result: CheckResult) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| task | verdict | oracle | no-op | reason |", "|---|---|---|---|---|"]
    for v in result.verdicts:
        lines.append(f"| {cell(v.task_id)} | {v.verdict} | {_scores(v.oracle_scores)} | "
                     f"{'-' if v.noop_score is None else f'{v.noop_score:.3g}'} | {cell(_short(v.reason))} |")
    return "\n".join(lines) + f"\n\n{counts_line(result)}\n"


def write(result: CheckResult, out_dir: Path) -> dict[str, Path]:
    """``verdicts.parquet`` and ``verdicts.md`` under ``out_dir`` (created)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("task_id", pa.string()), ("verdict", pa.string()), ("oracle_scores", pa.list_(pa.float64())),
                        ("noop_score", pa.float64()), ("reason", pa.string()), ("notes", pa.string()),
                        ("suite", pa.string()), ("format", pa.string()), ("sandbox", pa.string())])
    table = pa.Table.from_pylist(rows(result), schema=schema).replace_schema_metadata(
        {"seconds": f"{result.seconds:.1f}", "repeat": str(result.repeat)})
    paths = {"parquet": out_dir / "verdicts.parquet", "markdown": out_dir / "verdicts.md"}
    pq.write_table(table, paths["parquet"])
    paths["markdown"].write_text(f"Task check of `{result.suite}`\n\n" + markdown(result))
    return paths


def write_split_file(result: CheckResult, path: Path) -> dict[str, list[str]]:
    """The ``ok`` tasks divided by the configured ``benchmark.splits`` and ``split_seed``
    (the run's own split rule, :func:`milo_ray.benchmarks.splits.assign_splits`), as JSON
    for ``benchmark.split_file=``. ``ValueError`` when the ok tasks cannot fill the splits."""
    from milo_ray.benchmarks.splits import resolve_splits

    ok = [v.task_id for v in result.verdicts if v.verdict == OK]
    if not ok:
        raise ValueError("no task is ok, so there is no split file to write")
    cfg = result.benchmark_cfg
    splits = resolve_splits(ok, sizes=cfg.get("splits") or None, seed=int(cfg.get("split_seed") or 0), split_file=None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(splits, indent=2) + "\n")
    return splits
