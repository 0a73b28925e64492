"""Query layer over run directories (DESIGN §3): load a run, or every run of a sweep, as
pandas DataFrames, compute the leaderboard metrics of DESIGN §4.4 from the stored
rollouts, and open DuckDB views for SQL.

* :func:`load_run` reads one run directory (finished or still running) into a
  :class:`RunResults`: every table as a DataFrame (an absent table is an empty frame
  with the table's columns), the manifest, and blob lookups for traces and sources.
* :func:`find_runs` lists the run directories at or below a path (a Hydra sweep).
* :func:`harness_metrics` / :func:`final_test` give pass@k, PR@k, RR@k with
  task-clustered 95% intervals per harness, computed with ``milo_ray.kernels.metrics``
  exactly as the run's own summary does (``milo_ray.search.scores``).
* :func:`spend_by_role` and :func:`compare` summarize agent spend and whole runs.
* :func:`connect` opens DuckDB views ``rollouts``, ``harnesses``, ``events``,
  ``agent_calls``, ``experience`` and ``runs`` over a run or a sweep, each with a
  ``run`` column naming the run directory relative to the path given.

What is method-specific (the final test's split, k, tasks and rollouts, the leaderboard
rows of the summary, the variant label, the row a comparison shows) comes from the run's
method plugin (:mod:`milo_ray.methods`), found by the method name its manifest records.

Rows are read through the Parquet store's reader (``milo_ray.store.open_run``), so a
part superseded by a compaction is never counted twice and a part written by a newer
milo_ray is refused with a message naming it. Nothing here writes into a run.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa

from milo_ray import methods
from milo_ray.kernels.metrics import pass_at_k, pr_at_k, rr_at_k
from milo_ray.manifest import load_manifest
from milo_ray.search.plugin import FinalTestSpec, MethodPlugin, rebuilt_split, recorded_tasks
from milo_ray.search.scores import interval
from milo_ray.store import blobs, schema
from milo_ray.store.mirrored import blob_dir
from milo_ray.store.parquet import MANIFEST, open_run
from milo_ray.store.remote import is_uri, snapshot

if TYPE_CHECKING:  # duckdb is imported by connect() only
    import duckdb

__all__ = ["RunDirError", "RunResults", "load_run", "find_runs", "harness_metrics", "final_test",
           "spend_by_role", "compare", "connect", "TABLES", "METRIC_COLUMNS"]

TABLES = tuple(schema.SCHEMAS)  # rollouts, harnesses, events, experience, agent_calls
_METRICS = ("pass_at_k", "pr_at_k", "rr_at_k")
_STATISTIC = {"pass_at_k": "pass", "pr_at_k": "pr", "rr_at_k": "rr"}
# The columns harness_metrics and final_test share, in order.
METRIC_COLUMNS = ("harness_id", "name", "origin", "island", "round", "n_tasks", "k", "n_rollouts",
                  *(c for m in _METRICS for c in (m, f"{m}_lo", f"{m}_hi")),
                  "mean_input_tokens", "mean_output_tokens", "mean_seconds", "total_cost_usd", "timeouts", "errors")

class RunDirError(ValueError):
    """A path that cannot be read as a run (or a sweep of runs); the message names the
    path and what to do about it."""


# ---- loading ----------------------------------------------------------------------------
def _frame(table: pa.Table) -> pd.DataFrame:
    # Nullable integer and boolean dtypes: a null round or admitted stays null instead of
    # turning the column into floats or objects.
    mapping = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    return table.to_pandas(types_mapper=mapping.get)


def _local(path: str | os.PathLike) -> Path:
    """The directory to read: ``path`` itself, or for an object-store URI
    (``s3://BUCKET/PREFIX``, a run or a sweep) a local snapshot of its manifests and tables
    taken now (blobs are read from the bucket when asked for)."""
    if not is_uri(str(path)):
        return Path(path)
    try:
        return snapshot(str(path), field="path")
    except Exception as exc:  # a bad URI, a missing bucket or credentials, an unreachable endpoint
        raise RunDirError(str(exc).splitlines()[0] if str(exc) else f"{path}: {type(exc).__name__}") from None


def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise RunDirError(f"{path}: no such directory; pass the run.dir of a run")
    if not (path / MANIFEST).exists():
        below = _run_dirs_below(path)
        hint = (f"it holds {len(below)} run(s) below it (a sweep): use find_runs({str(path)!r}) or "
                f"connect({str(path)!r})") if below else "pass the run.dir of a run (the directory holding manifest.json)"
        raise RunDirError(f"{path}: not a run directory (no {MANIFEST}); {hint}")
    return load_manifest(path, where=str(path / MANIFEST), fail=RunDirError)


def _benchmark_name(manifest: dict[str, Any]) -> str:
    cfg = (manifest.get("config") or {}).get("benchmark") or {}
    if cfg.get("preset"):  # the surrogate benchmarks are named by their preset
        return str(cfg["preset"])
    target = str(cfg.get("_target_") or manifest.get("benchmark") or "")
    cls = target.rsplit(".", 1)[-1]
    return (cls[: -len("Benchmark")] if cls.endswith("Benchmark") else cls).lower() or "unknown"


@dataclass
class RunResults:
    """One run directory read into memory. Tables are DataFrames in write order (events
    by ``seq``); an absent table is an empty frame with the table's columns. Integer and
    boolean columns use pandas' nullable dtypes (``Int64``, ``boolean``). ``events.data``
    holds each payload decoded (``{}`` for none); ``payload`` stays the raw JSON text."""

    run_dir: Path
    manifest: dict
    method: str
    benchmark: str
    rollouts: pd.DataFrame
    harnesses: pd.DataFrame
    events: pd.DataFrame
    agent_calls: pd.DataFrame
    experience: pd.DataFrame
    _blobs: blobs.BlobDir = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    _split_tasks: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def status(self) -> str:
        """The manifest's status: ``running`` for a run in progress or killed, else how it ended."""
        return str(self.manifest.get("status", "unknown"))

    @property
    def config(self) -> dict:
        """The run's resolved config (``manifest["config"]``)."""
        return self.manifest.get("config") or {}

    @property
    def summary(self) -> dict:
        """What the run reported at its end (``manifest["summary"]``; ``{}`` while running)."""
        return self.manifest.get("summary") or {}

    @property
    def plugin(self) -> MethodPlugin:
        """The run's method plugin (``methods.UNKNOWN`` for a method none is registered for)."""
        return methods.plugin_named(self.method) or methods.plugin_for_manifest(self.manifest)

    @property
    def rung(self) -> str | None:
        """The variant the method settings match (MILO: its ablation rung A..E, or
        ``"custom"``), None for a method without variants."""
        return self.plugin.variant(self.config)

    def _blob(self, ref: str | None) -> Any:
        if ref is None or (isinstance(ref, float) and math.isnan(ref)):
            return None
        try:
            return blobs.decode(self._blobs.read(blobs.check_ref(ref)))
        except KeyError:
            return None

    def trace(self, trace_ref: str | None) -> dict | None:
        """The decoded trace blob of a rollout (``rollouts.trace_ref``), None if absent."""
        return self._blob(trace_ref)

    def source_files(self, source_ref: str | None) -> dict[str, str] | None:
        """A harness's files (relative path -> text) from ``harnesses.source_ref``, None if absent."""
        files = self._blob(source_ref)
        return None if files is None else dict(files)

    def source(self, source_ref: str | None) -> str | None:
        """A harness's source as one text: the file itself for a one-file harness, else
        every file under a ``# ---- <path> ----`` header, in path order."""
        files = self.source_files(source_ref)
        if files is None:
            return None
        if len(files) == 1:
            return next(iter(files.values()))
        return "\n".join(f"# ---- {p} ----\n{files[p]}" for p in sorted(files))

    def split_tasks(self, split: str) -> list[str] | None:
        """Task ids of one split of the run's benchmark: those the run's final test
        recorded, else rebuilt from the resolved config (benchmarks draw their splits
        deterministically). None, with a warning, when the benchmark cannot be built here
        (its data is elsewhere, a class is missing)."""
        if split not in self._split_tasks:
            recorded = recorded_tasks(self.summary, split)
            self._split_tasks[split] = recorded if recorded is not None else rebuilt_split(self, split)
        return self._split_tasks[split]

    def events_of(self, kind: str) -> list[dict]:
        """Decoded payloads of the events of one kind, in order."""
        return list(self.events.loc[self.events["kind"] == kind, "data"])

    def event_rows(self) -> list[dict[str, Any]]:
        """The ``events`` rows as stored (payload as JSON text, a null column None), in
        ``seq`` order: what ``EventTypes.decode_rows`` and a plugin's status view take."""
        cols = [c for c in self.events.columns if c != "data"]
        return [{c: (None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v)
                 for c, v in zip(cols, row)} for row in self.events[cols].itertuples(index=False, name=None)]


def load_run(run_dir: str | os.PathLike) -> RunResults:
    """Read one run directory. A running (or killed) run loads too: ``status`` says so.
    Raises :class:`RunDirError` for a missing directory, a directory without a manifest
    (naming the runs below it if it is a sweep), a corrupt manifest, and a table file
    this version cannot read (newer ``schema_version``, corrupt, foreign)."""
    path = _local(run_dir)
    manifest = _read_manifest(path)
    try:
        store = open_run(path)
        tables = {t: _frame(store.read(t)) for t in TABLES}
    except RunDirError:
        raise
    except (ValueError, OSError) as e:
        raise RunDirError(f"{path}: cannot read the run's tables: {e}") from None
    events = tables["events"].sort_values("seq", kind="stable").reset_index(drop=True)
    events["data"] = [{} if p is None else json.loads(p) for p in events["payload"]]
    return RunResults(run_dir=path, manifest=manifest, method=methods.plugin_for_manifest(manifest).name,
                      benchmark=_benchmark_name(manifest), rollouts=tables["rollouts"],
                      harnesses=tables["harnesses"], events=events, agent_calls=tables["agent_calls"],
                      experience=tables["experience"], _blobs=blob_dir(path))


def _natural(path: Path) -> list:
    # Sweep job directories are numbered: 2 sorts before 10.
    return [[(0, int(s)) if s.isdigit() else (1, s) for s in re.split(r"(\d+)", part) if s] for part in path.parts]


def _run_dirs_below(path: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(path):
        if MANIFEST in files:
            found.append(Path(root))
            dirs[:] = []  # a run's own subdirectories (tables, workspace) hold no runs
        else:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
    return sorted(found, key=_natural)


def find_runs(path: str | os.PathLike) -> list[Path]:
    """``[path]`` when ``path`` is a run directory, else every run directory below it
    (a sweep), in natural order (job 2 before job 10). An object-store URI is read from a
    snapshot (see :func:`load_run`)."""
    path = _local(path)
    if not path.is_dir():
        raise RunDirError(f"{path}: no such directory; pass a run directory or a sweep directory")
    if (path / MANIFEST).is_file():
        return [path]
    found = _run_dirs_below(path)
    if not found:
        raise RunDirError(f"{path}: no run directories at or below it (none holds {MANIFEST}); "
                          "pass the run.dir of a run or of a sweep")
    return found


# ---- metrics ----------------------------------------------------------------------------
def _settled(rollouts: pd.DataFrame) -> pd.DataFrame:
    """One row per (harness, task, rollout index): the last row that is not an infra
    failure, else the last row (as the store's cache lookup and a resumed run see it)."""
    if rollouts.empty:
        return rollouts
    ok = (rollouts["error_kind"] != "infra").fillna(True).astype(bool)
    ordered = rollouts.assign(_ok=ok.to_numpy(), _pos=np.arange(len(rollouts))).sort_values(
        ["_ok", "_pos"], kind="stable")
    last = ordered.groupby(["harness_id", "task_id", "rollout_idx"], sort=False).tail(1)
    return last.sort_values("_pos").drop(columns=["_ok", "_pos"])


def _score_row(rows: pd.DataFrame, k: int, tasks: list[str] | None = None) -> dict[str, Any]:
    """Metrics of one harness's settled rows: an (n_tasks, k) matrix over ``tasks``
    (None: the tasks it ran), a missing attempt scoring 0 (the rule of
    milo_ray.search.scores.score_matrix, which the run's own summary uses)."""
    rows = rows[rows["rollout_idx"] < k]
    if tasks is None:
        tasks = list(dict.fromkeys(rows["task_id"]))
    else:
        rows = rows[rows["task_id"].isin(tasks)]
    index = {t: i for i, t in enumerate(tasks)}
    S = np.zeros((len(tasks), k))
    S[[index[t] for t in rows["task_id"]], rows["rollout_idx"].to_numpy(dtype=int)] = rows["score"].to_numpy(float)
    out: dict[str, Any] = {"n_tasks": len(tasks), "k": k, "n_rollouts": len(rows)}
    for metric, fn in (("pass_at_k", pass_at_k), ("pr_at_k", pr_at_k), ("rr_at_k", rr_at_k)):
        out[metric] = fn(S) if len(tasks) else math.nan
        # No interval (fewer than 2 tasks: the run's summary shows none either) is NaN here.
        out[f"{metric}_lo"], out[f"{metric}_hi"] = interval(S, statistic=_STATISTIC[metric]) or (math.nan, math.nan)
    n = max(len(rows), 1)
    out["mean_input_tokens"] = float(rows["input_tokens"].fillna(0).sum()) / n
    out["mean_output_tokens"] = float(rows["output_tokens"].fillna(0).sum()) / n
    out["mean_seconds"] = float(rows["latency_s"].fillna(0.0).sum()) / n
    cost = rows["cost_usd"]
    out["total_cost_usd"] = None if cost.isna().any() else float(cost.sum())  # unknown is never 0
    out["timeouts"] = int(rows["timed_out"].fillna(False).sum())
    out["errors"] = int(rows["error_kind"].notna().sum())
    return out


def _harness_facts(res: RunResults) -> dict[str, dict[str, Any]]:
    # A harness recorded more than once (the same seed on several islands) is described
    # by its first record.
    facts: dict[str, dict[str, Any]] = {}
    for row in res.harnesses[["harness_id", "name", "origin", "island", "round"]].itertuples(index=False):
        if row.harness_id not in facts:
            facts[row.harness_id] = {c: (None if pd.isna(v) else v) for c, v in row._asdict().items()}
    return facts


def _check_k(k: Any) -> None:
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
        raise ValueError(f"k={k!r}: rollouts per task must be a positive integer (or None: each harness's own)")


def _metric_frame(res: RunResults, rows: pd.DataFrame, k: int | None, harness_ids: Iterable[str] | None = None,
                  tasks: list[str] | None = None) -> pd.DataFrame:
    """One metrics row per harness over its settled ``rows``."""
    rows = _settled(rows)
    facts = _harness_facts(res)
    wanted = list(dict.fromkeys(rows["harness_id"])) if harness_ids is None else list(harness_ids)
    out = []
    for hid in wanted:
        mine = rows[rows["harness_id"] == hid]
        kk = int(k) if k is not None else (int(mine["rollout_idx"].max()) + 1 if len(mine) else 1)
        f = facts.get(hid, {})
        out.append({"harness_id": hid, "name": f.get("name"), "origin": f.get("origin"), "island": f.get("island"),
                    "round": f.get("round"), **_score_row(mine, kk, tasks)})
    frame = pd.DataFrame(out, columns=list(METRIC_COLUMNS))
    for c in ("island", "round"):
        frame[c] = frame[c].astype("Int64")
    return frame


def harness_metrics(res: RunResults, *, split: str = "search", k: int | None = None) -> pd.DataFrame:
    """One row per harness with rollouts on ``split`` (in order of first rollout):
    name/origin/island/round (its first ``harnesses`` record), n_tasks (tasks it ran
    there), k, pass@k / PR@k / RR@k with task-clustered 95% intervals (``<metric>_lo``,
    ``<metric>_hi``; NaN with fewer than 2 tasks), mean input/output tokens and seconds
    per rollout, total USD (None if any rollout is unpriced), timeouts and errors.

    ``k``: attempts per task (rollout indices >= k are ignored, a missing one scores 0);
    None: each harness's own largest rollout index + 1.

    Rows count under the split they are stored with: a rollout is stored once, under
    the split of the request that first ran it, and a later request for the same
    rollout (same cache key) reuses it. :func:`final_test` follows the cache keys."""
    _check_k(k)
    return _metric_frame(res, res.rollouts[res.rollouts["split"] == split], k)


def _final_rows(res: RunResults, spec: FinalTestSpec) -> pd.DataFrame:
    """The rollouts a final test used: by the cache keys the spec holds, wherever they
    are stored (a test task the search also ran is stored under the search's split);
    without keys, the rows stored under its split."""
    if spec.cache_keys is None:
        return res.rollouts[res.rollouts["split"] == spec.split]
    return res.rollouts[res.rollouts["cache_key"].isin(spec.cache_keys)]


def final_test(res: RunResults, *, tasks: str = "all") -> pd.DataFrame:
    """The run's final test results, recomputed from its rollouts: the columns of
    :func:`harness_metrics` plus ``label`` (the name the summary gives the row, e.g.
    ``island-2:2-5`` or ``ssr final``) and ``true_score`` (the benchmark's ground truth
    from the summary; None on real tasks). Which harnesses, split, k, tasks and rollouts
    is the method plugin's :meth:`~milo_ray.search.plugin.MethodPlugin.final_test`: rows
    follow the summary's leaderboard (MILO: best first; SSR: final, then initial; eval:
    its seeds); a run without a summary yet (running, killed) gives every harness with
    rows on the test split. ``n_tasks`` is the number of tasks scored: a task without a
    rollout scores 0, as in the run.

    ``tasks``: ``"all"``, every task of the test split (the papers' "full benchmark",
    which may hold tasks the search ran); ``"held_out"``, only the test tasks no search
    rollout ran (the spec's ``held_out_task_ids``; ``n_tasks`` 0 and NaN metrics when
    the search ran them all; ``true_score`` None, the benchmark's being of a whole split)."""
    if tasks not in ("all", "held_out"):
        raise ValueError(f"tasks={tasks!r}: use 'all' (every test task) or 'held_out' (those the search never ran)")
    spec = res.plugin.final_test(res)
    ids = [h.harness_id for h in spec.harnesses]
    held_out = tasks == "held_out"
    if held_out:
        if spec.held_out_task_ids is None:
            why = ("it does not search (its harnesses were evaluated, not chosen)" if not res.plugin.searches
                   else "its test split's tasks or the tasks its search ran cannot be told from what it stored")
            raise ValueError(f"{res.run_dir}: no held-out final test: {why}; use tasks='all'")
        tasks = list(spec.held_out_task_ids)
    else:
        tasks = None if spec.task_ids is None or spec.cache_keys is None else list(spec.task_ids)
    frame = _metric_frame(res, _final_rows(res, spec), spec.k, ids, tasks)
    frame.insert(1, "label", [h.label if h.label is not None else name
                              for h, name in zip(spec.harnesses, frame["name"])])
    # Ground truth is the benchmark's over a whole split: none for a subset of it.
    frame["true_score"] = [None if held_out else h.true_score for h in spec.harnesses]
    # The island a tested harness was the best of (a seed sits on several), where the method says.
    frame["island"] = pd.array([h.island if h.island is not None else j
                                for h, j in zip(spec.harnesses, frame["island"])], dtype="Int64")
    return frame


def spend_by_role(res: RunResults) -> pd.DataFrame:
    """Agent calls grouped by role and model (roles in ``AGENT_ROLES`` order; a null
    model is its own group): calls, input/output tokens, USD (None when any call of the
    group is unpriced), unpriced calls, seconds, retries, errors."""
    cols = ["role", "model", "calls", "input_tokens", "output_tokens", "cost_usd", "unpriced_calls", "seconds",
            "retries", "errors"]
    calls = res.agent_calls
    out = []
    for (role, model), g in calls.groupby(["role", "model"], dropna=False, sort=False):
        unpriced = int(g["cost_usd"].isna().sum())
        out.append({"role": role, "model": None if pd.isna(model) else model, "calls": len(g),
                    "input_tokens": int(g["input_tokens"].fillna(0).sum()),
                    "output_tokens": int(g["output_tokens"].fillna(0).sum()),
                    "cost_usd": None if unpriced else float(g["cost_usd"].sum()), "unpriced_calls": unpriced,
                    "seconds": float(g["latency_s"].fillna(0.0).sum()), "retries": int(g["retries"].fillna(0).sum()),
                    "errors": int(g["error"].notna().sum())})
    frame = pd.DataFrame(out, columns=cols)
    order = {r: i for i, r in enumerate(schema.AGENT_ROLES)}
    return frame.sort_values(["role", "model"], key=lambda s: s.map(order) if s.name == "role" else s.fillna(""),
                             kind="stable").reset_index(drop=True)


# ---- runs side by side --------------------------------------------------------------------
def _wall_seconds(res: RunResults) -> float | None:
    """Seconds the run's sessions ran: each ends at its ``finished_at``, a killed (or
    still running) one at its last stored activity (``milo_ray.manifest.elapsed_before``)."""
    from milo_ray.manifest import elapsed_before

    history = res.manifest.get("history") or []
    if not history:
        return None
    activity = [*res.events["time"].dropna(), *res.rollouts["finished_at"].dropna()]
    # elapsed_before counts every session before the last; a sentinel session that starts
    # at infinity makes it count them all.
    return elapsed_before([*history, {"started_at": math.inf}], activity)


def _run_names(paths: list[Path]) -> list[str]:
    # Names relative to the runs' common directory: a sweep's jobs are "0", "1", ...
    if len(paths) < 2:
        return [p.name for p in paths]
    base = Path(os.path.commonpath([str(p.resolve()) for p in paths]))
    return [str(p.resolve().relative_to(base)) or p.name for p in paths]


#: compare()'s figures of the incumbent over the held-out test tasks alone.
HELD_OUT_COLUMNS = ("held_out_n_tasks", "held_out_pr_at_k", "held_out_pr_at_k_lo", "held_out_pr_at_k_hi")


def _held_out_of(res: RunResults, row: Any) -> dict[str, Any]:
    """The incumbent's held-out figures for compare() (None where the run has no
    held-out test: eval runs, runs whose split cannot be told)."""
    if row is None or res.plugin.final_test(res).held_out_task_ids is None:
        return dict.fromkeys(HELD_OUT_COLUMNS)
    held = final_test(res, tasks="held_out")
    mine = held[(held["harness_id"] == row["harness_id"]) & (held["label"] == row["label"])]
    if not len(mine):
        return dict.fromkeys(HELD_OUT_COLUMNS)
    first = mine.iloc[0]
    return {"held_out_n_tasks": int(first["n_tasks"]),
            **{f"held_out_{c}": first[c] for c in ("pr_at_k", "pr_at_k_lo", "pr_at_k_hi")}}


def compare(runs: Iterable[RunResults | str | os.PathLike]) -> pd.DataFrame:
    """One row per run: run (its directory relative to the runs' common directory),
    run_id, method, rung (the method's variant, e.g. MILO's ablation rung), benchmark, status, stop_reason, the
    incumbent's final-test row (the one the method plugin picks: ``final_test``'s first
    row; for ``eval`` the harness with the best PR@k) with intervals and true score, its PR@k over the
    held-out test tasks alone (``held_out_*``; None for eval), rollouts stored, agent spend (tokens,
    USD: None if any call is unpriced) and wall seconds. Paths are loaded with load_run."""
    runs = [r if isinstance(r, RunResults) else load_run(r) for r in runs]
    names = _run_names([r.run_dir for r in runs])
    metric_cols = ["label", "harness_id", "n_tasks", "k", *(c for m in _METRICS for c in (m, f"{m}_lo", f"{m}_hi")),
                   *HELD_OUT_COLUMNS, "mean_output_tokens", "mean_seconds", "true_score"]
    out = []
    for name, res in zip(names, runs):
        row = res.plugin.incumbent(final_test(res))
        best = {} if row is None else row.to_dict()
        best.update(_held_out_of(res, row))
        spend = spend_by_role(res)
        out.append({"run": name, "run_dir": str(res.run_dir), "run_id": res.manifest.get("run_id"),
                    "method": res.method, "rung": res.rung, "benchmark": res.benchmark, "status": res.status,
                    "stop_reason": res.summary.get("stop_reason"),
                    **{c: best.get(c) for c in metric_cols},
                    "rollouts": len(res.rollouts),
                    "agent_calls": int(spend["calls"].sum()),
                    "agent_input_tokens": int(spend["input_tokens"].sum()),
                    "agent_output_tokens": int(spend["output_tokens"].sum()),
                    "agent_cost_usd": None if spend["cost_usd"].isna().any() else float(spend["cost_usd"].sum()),
                    "wall_seconds": _wall_seconds(res)})
    return pd.DataFrame(out, columns=["run", "run_dir", "run_id", "method", "rung", "benchmark", "status",
                                      "stop_reason", *metric_cols, "rollouts", "agent_calls", "agent_input_tokens",
                                      "agent_output_tokens", "agent_cost_usd", "wall_seconds"])


# ---- SQL ---------------------------------------------------------------------------------------
def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(path: str | os.PathLike) -> "duckdb.DuckDBPyConnection":
    """An in-memory DuckDB connection with views ``rollouts``, ``harnesses``, ``events``,
    ``agent_calls``, ``experience`` over every run at or below ``path`` (see
    :func:`find_runs`), each with a ``run`` column: the run directory relative to
    ``path`` (``"."`` when ``path`` is the run). A view has every column of its table
    even where no run stored one. The view ``runs`` holds one row per run: run, run_dir,
    run_id, method, rung, benchmark, status, started_at, finished_at.

    Every table file's footer is checked first (a newer ``schema_version`` or a corrupt
    file raises :class:`RunDirError` naming it). The views read the table directories by
    glob, so queries follow a run that is still being written."""
    import duckdb

    root = _local(path)
    run_dirs = find_runs(root)
    con = duckdb.connect()
    meta = []
    parts: dict[str, list[str]] = {t: [] for t in TABLES}
    for d in run_dirs:
        rel = os.path.relpath(d, root)
        manifest = _read_manifest(d)
        try:
            store = open_run(d)
            live = {t: store.live_parts(t) for t in TABLES}
        except (ValueError, OSError) as e:
            raise RunDirError(f"{d}: cannot read the run's tables: {e}") from None
        for t in TABLES:
            if live[t]:
                glob = str(d / t / "*.parquet")
                parts[t].append(f"SELECT *, {_sql_str(rel)} AS run FROM read_parquet({_sql_str(glob)}, "
                                "union_by_name = true)")
        plugin = methods.plugin_for_manifest(manifest)
        meta.append({"run": rel, "run_dir": str(d), "run_id": manifest.get("run_id"), "method": plugin.name,
                     "rung": plugin.variant(manifest.get("config") or {}), "benchmark": _benchmark_name(manifest),
                     "status": str(manifest.get("status", "unknown")),
                     "started_at": manifest.get("started_at"), "finished_at": manifest.get("finished_at")})
    for t in TABLES:
        # The empty typed table fixes every column and its type, whatever the files hold.
        con.register(f"_empty_{t}", schema.empty_table(t).append_column("run", pa.array([], pa.string())))
        sql = " UNION ALL BY NAME ".join([f"SELECT * FROM _empty_{t}", *parts[t]])
        con.execute(f"CREATE VIEW {t} AS {sql}")
    runs = pa.Table.from_pylist(meta, schema=pa.schema([
        ("run", pa.string()), ("run_dir", pa.string()), ("run_id", pa.string()), ("method", pa.string()),
        ("rung", pa.string()), ("benchmark", pa.string()), ("status", pa.string()), ("started_at", pa.float64()),
        ("finished_at", pa.float64())]))
    con.register("_runs", runs)
    con.execute("CREATE VIEW runs AS SELECT * FROM _runs")
    return con
