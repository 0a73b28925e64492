"""Records of the instance-level track: the best construction a run found per problem.

    python -m milo_ray.einstein best RUN_DIR [--out DIR] [--problem NAME]

Reads the run's ``rollouts`` table and each rollout's trace from the store's blobs
(``RunStore.get_blob(trace_ref)``). An optimizer rollout's trace names its ``problem``,
its verified ``score`` (FFT; None when infeasible) and ``values`` (the final point).
Per problem the feasible candidates are re-scored from their values (FFT, cheap; the
trace's number is shown but never trusted for the order) and ordered; the best is
re-verified with exact direct convolution in float64 (``milo_ray.kernels.autocorr.verify``,
DESIGN §4.5), walking down the order past any that fail, and every other candidate
whose FFT score ties the best (relative 1e-9, where FFT rounding could reorder them)
is verified too, so the record is the lowest *exact* score. Identical constructions
are verified once.

Cost: the direct convolution is O(n^2) (``np.convolve``, float64). Measured on this
project's shared 2-core machine: n = 16,384 takes 0.6-1.3 s, n = 65,536 takes 2-20 s
depending on load (15-19 s for the autocorrelation problems under load). One record
per problem at the published sizes therefore costs under a minute: no faster exact
method is needed.

Prints per problem the exact best score, where it came from (run, harness, task,
rollout) and the published anchors (``ANCHORS``) with the margin ``best - anchor``
(negative: better than the anchor), and writes ``DIR/<problem>.json`` =
``{"problem", "values", "score"}`` (DIR defaults to ``RUN_DIR/records``).
Exit code 2 with a one-line error for a missing run directory, a run without einstein
rollouts, or one without any feasible construction.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from milo_ray.benchmarks.einstein.problems import ANCHORS, PROBLEMS, check, score
from milo_ray.kernels.autocorr import verify

TIE_REL = 1e-9  # stored (FFT) scores this close may order differently under exact summation


class RecordsError(Exception):
    """A run the command cannot report on; the message is the one-line error."""


@dataclass(frozen=True)
class Candidate:
    problem: str
    stored_score: float  # what the trace says
    fft_score: float  # recomputed here from the values: the order never trusts the trace's number
    values: np.ndarray
    run_id: str
    harness_id: str
    harness_name: str
    task_id: str
    rollout_idx: int


@dataclass(frozen=True)
class Record:
    """The best construction of one problem, exactly re-verified."""

    candidate: Candidate
    score: float  # exact (direct convolution, float64)
    verify_s: float  # seconds spent in exact verification for this problem
    n_candidates: int  # feasible constructions considered


@dataclass(frozen=True)
class RunRecords:
    run_id: str
    records: dict[str, Record]
    infeasible: dict[str, int]  # problem -> rollouts without a feasible point (problems with no record)
    n_rollouts: int  # einstein rollouts read


def _harness_names(store: Any) -> dict[str, str]:
    try:
        rows = store.read("harnesses").select(["harness_id", "name"]).to_pylist()
    except Exception:  # a run without a harnesses table still has records
        return {}
    return {r["harness_id"]: r["name"] or "" for r in rows}


def einstein_traces(rows: Iterable[dict[str, Any]], get_blob: Callable[[str], Any],
                    problem: str | None = None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(rollout row, decoded trace) of every einstein rollout among ``rows`` (optionally
    of one problem); ``get_blob`` reads a trace ref (a missing blob: raise or return None)."""
    for row in rows:
        ref = row.get("trace_ref")
        if not isinstance(ref, str) or not ref:
            continue
        try:
            trace = get_blob(ref)
        except Exception:  # a missing blob: that rollout has nothing to offer
            continue
        if isinstance(trace, dict) and "problem" not in trace:
            # An agent's rollout (benchmark=einstein_agent): the graded program's run is
            # in the verifier's details.
            trace = (trace.get("verifier") or {}).get("details")
        if not isinstance(trace, dict) or trace.get("problem") not in PROBLEMS:
            continue
        if problem is not None and trace["problem"] != problem:
            continue
        yield row, trace


def load_candidates(store: Any, problem: str | None = None) -> tuple[list[Candidate], dict[str, int], int]:
    """Feasible einstein constructions in ``store`` (optionally of one problem), the count
    of einstein rollouts without one per problem, and the number of einstein rollouts."""
    names = _harness_names(store)
    cands: list[Candidate] = []
    bad: dict[str, int] = {}
    n = 0
    for row, trace in einstein_traces(store.read("rollouts").to_pylist(), store.get_blob, problem):
        name = trace["problem"]
        n += 1
        values, stored = trace.get("values"), trace.get("score")
        if values is None or stored is None or check(name, values) is not None:
            bad[name] = bad.get(name, 0) + 1
            continue
        h = np.asarray(values, dtype=np.float64)
        cands.append(Candidate(name, float(stored), score(name, h), h, str(row.get("run_id") or ""),
                               row["harness_id"], names.get(row["harness_id"], ""), row["task_id"],
                               int(row["rollout_idx"])))
    return cands, bad, n


def best_of(cands: Sequence[Candidate]) -> Record | None:
    """The lowest exact score among ``cands`` (all of one problem); see module docstring."""
    order = sorted(cands, key=lambda c: c.fft_score)
    t0 = time.perf_counter()
    best: tuple[float, Candidate] | None = None
    seen: set[bytes] = set()
    for c in order:
        if best is not None and c.fft_score > best[1].fft_score + TIE_REL * abs(best[1].fft_score):
            break
        digest = hashlib.sha256(c.values.tobytes()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        try:
            exact = verify(c.problem, c.values)
        except ValueError:  # feasible under FFT tolerance but not under exact summation: not a record
            continue
        if math.isfinite(exact) and (best is None or exact < best[0]):
            best = (exact, c)
    if best is None:
        return None
    return Record(best[1], best[0], time.perf_counter() - t0, len(cands))


def best_records(run_dir: str | Path, problem: str | None = None) -> RunRecords:
    """Every problem's record in the run at ``run_dir``; RecordsError when there is none."""
    from milo_ray.store import open_run

    root = Path(run_dir)
    if not root.is_dir():
        raise RecordsError(f"run directory not found: {root}")
    store = open_run(root)
    cands, bad, n = load_candidates(store, problem)
    what = f"{problem} rollouts" if problem else "einstein rollouts"
    if n == 0:
        raise RecordsError(f"run {root} has no {what} (no stored trace names one of {', '.join(PROBLEMS)})")
    records: dict[str, Record] = {}
    for name in PROBLEMS:
        rec = best_of([c for c in cands if c.problem == name])
        if rec is not None:
            records[name] = rec
    if not records:
        raise RecordsError(f"run {root}: none of its {n} {what} has a feasible construction")
    infeasible = {p: k for p, k in bad.items() if p not in records}
    return RunRecords(store.run_id, records, infeasible, n)


def format_records(rr: RunRecords) -> str:
    lines = [f"run {rr.run_id}: {rr.n_rollouts} einstein rollouts (lower is better; margin = best - anchor, "
             "negative = better)"]
    for name, rec in rr.records.items():
        c = rec.candidate
        harness = c.harness_id + (f" ({c.harness_name})" if c.harness_name else "")
        lines += ["", f"{name}  n={c.values.size}  best {rec.score:.10f} (exact; stored {c.stored_score:.10f}; "
                      f"verified in {rec.verify_s:.2f} s)",
                  f"  from run {c.run_id or rr.run_id}, harness {harness}, task {c.task_id}, rollout {c.rollout_idx}; "
                  f"{rec.n_candidates} feasible constructions",
                  f"  {'anchor':<12} {'value':>14} {'margin':>14}"]
        for anchor, value in ANCHORS[name].items():
            if value is None:
                lines.append(f"  {anchor:<12} {'-':>14} {'-':>14}")
            else:
                lines.append(f"  {anchor:<12} {value:>14.10f} {rec.score - value:>+14.3e}")
    for name, k in rr.infeasible.items():
        lines += ["", f"{name}: no feasible construction ({k} rollouts)"]
    return "\n".join(lines)


def write_records(rr: RunRecords, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rec in rr.records.items():
        p = out / f"{name}.json"
        p.write_text(json.dumps({"problem": name, "values": rec.candidate.values.tolist(), "score": rec.score}))
        paths.append(p)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m milo_ray.einstein",
                                 description="Records of the instance-level track (EinsteinArena problems).")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("best", help="the best exactly re-verified construction per problem in a run")
    b.add_argument("run_dir", help="the run directory (a Parquet run store)")
    b.add_argument("--out", default=None, help="where to write <problem>.json (default: RUN_DIR/records)")
    b.add_argument("--problem", choices=PROBLEMS, default=None, help="only this problem")
    args = ap.parse_args(argv)
    try:
        rr = best_records(args.run_dir, args.problem)
    except (RecordsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_records(rr))
    for p in write_records(rr, args.out or Path(args.run_dir) / "records"):
        print(f"wrote {p}  (a run continues from it with benchmark.problem={p.stem} "
              f"benchmark.starts='[{{base: file, path: {p.resolve()}}}]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
