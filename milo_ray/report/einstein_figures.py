"""The instance-level (EinsteinArena) figure of the run report.

``figures(res)`` draws ``einstein_score_over_time``: per problem, the best verified
score found so far over the run's wall time, one line per island (MILO) or one for the
run (other methods), against the published anchors
(:data:`milo_ray.benchmarks.einstein.problems.ANCHORS`). Lower is better.

A rollout's trace (``executor=optimizer``) holds its verified final ``score`` (None
when its point was infeasible) and the ``trajectory`` ``[[t, score], ...]`` its runner
published inside the sandbox (t: seconds since the rollout started; the scores are the
runner's, not re-verified). The step lines use verified scores only, placed at the
rollout's ``finished_at``; the trajectories are drawn faintly behind them.

The y axis is the score minus the best (lowest) anchor on a symmetric log scale: the
anchors differ in the fourth to tenth decimal while a random start is off by tens of
percent, and a run that beats the record goes below zero. Traces are read with
:func:`milo_ray.einstein.einstein_traces`, the reader the records command uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure as MplFigure
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from milo_ray.benchmarks.einstein.problems import ANCHORS
from milo_ray.einstein import einstein_traces
from milo_ray.search.plugin import Figure

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
RUN_GROUP = "run"  # the group of a run without islands
NO_ISLAND = "no island"  # harnesses of an island run that got none (seeds not placed)
ANCHOR_GAP = 0.055  # anchors closer than this fraction of the axis height share one label


@dataclass(frozen=True)
class ScoredRollout:
    problem: str
    group: str  # "island <j>" or RUN_GROUP
    harness_id: str
    task_id: str
    started: float | None  # seconds since the run started
    finished: float | None
    score: float | None  # verified final score (None: infeasible)
    trajectory: list[tuple[float, float]]  # (seconds since the run started, runner score)


def _float(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _islands(res: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    h = res.harnesses
    for hid, j in zip(h["harness_id"], h["island"]):
        if hid not in out and _float(j) is not None:
            out[hid] = int(j)
    return out


def scored_rollouts(res: Any) -> list[ScoredRollout]:
    """Every einstein rollout of ``res`` with its times relative to the run's start."""
    rows = res.rollouts.to_dict("records")
    starts = [v for v in (_float(r.get("started_at")) for r in rows) if v is not None]
    t0 = _float(res.manifest.get("started_at")) or (min(starts) if starts else 0.0)
    islands = _islands(res)
    out = []
    for row, trace in einstein_traces(rows, res.trace):
        started, finished = _float(row.get("started_at")), _float(row.get("finished_at"))
        j = islands.get(row["harness_id"])
        traj = []
        if started is not None:
            for point in trace.get("trajectory") or []:
                t, s = (_float(v) for v in list(point)[:2])
                if t is not None and s is not None:
                    traj.append((started - t0 + t, s))
        group = f"island {j}" if j is not None else NO_ISLAND if islands else RUN_GROUP
        out.append(ScoredRollout(trace["problem"], group, row["harness_id"],
                                 str(row.get("task_id")), None if started is None else started - t0,
                                 None if finished is None else finished - t0, _float(trace.get("score")), traj))
    return out


def best_so_far(rollouts: list[ScoredRollout]) -> tuple[np.ndarray, np.ndarray]:
    """(finish time, lowest verified score up to then) over the feasible rollouts, by finish time."""
    done = sorted((r for r in rollouts if r.score is not None and r.finished is not None), key=lambda r: r.finished)
    t = np.array([r.finished for r in done], dtype=float)
    return t, np.minimum.accumulate(np.array([r.score for r in done], dtype=float))


def _group_key(group: str) -> tuple[int, int]:
    return (0, int(group.split()[-1])) if group.startswith("island ") else (1, 0)


def _anchor_labels(ax: Any, gaps: list[tuple[str, float, float]]) -> None:
    """Label anchor lines at the right edge, one label for anchors too close to read apart."""
    lo, hi = ax.get_ylim()
    tf = ax.yaxis.get_transform()
    a, b = tf.transform([lo, hi])

    def frac(y: float) -> float:
        return float((tf.transform([y])[0] - a) / (b - a))

    merged: list[list[tuple[str, float, float]]] = []
    for item in sorted(gaps, key=lambda g: g[1]):
        if merged and abs(frac(item[1]) - frac(merged[-1][-1][1])) < ANCHOR_GAP:
            merged[-1].append(item)
        else:
            merged.append([item])
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    for k, grp in enumerate(merged):
        text = "\n".join(f"{name} {value:.10g}" for name, _, value in grp)
        ax.text(1.01, grp[0][1], text, transform=trans, fontsize=7, va="center", ha="left", color="#444444")


def _problem_axes(ax: Any, problem: str, rollouts: list[ScoredRollout], color: dict[str, str], scale: float,
                  unit: str) -> None:
    anchors = {k: v for k, v in ANCHORS[problem].items() if v is not None}
    ref_name, ref = min(anchors.items(), key=lambda kv: kv[1])
    groups = sorted({r.group for r in rollouts}, key=_group_key)
    gaps: list[float] = []
    for r in rollouts:
        if r.trajectory:
            ts, ss = zip(*r.trajectory)
            ys = np.array(ss) - ref
            ax.plot(np.array(ts) / scale, ys, color=color[r.group], lw=0.7, alpha=0.25, marker=".", ms=2.5,
                    zorder=1)
            gaps += list(ys)
    for g in groups:
        t, best = best_so_far([r for r in rollouts if r.group == g])
        if t.size:
            ax.plot(t / scale, best - ref, drawstyle="steps-post", color=color[g], lw=2, marker="o", ms=3, zorder=3,
                    gid=f"best:{problem}:{g}", label=g)
            gaps += list(best - ref)
    if len(groups) > 1:
        t, best = best_so_far(rollouts)
        if t.size:
            ax.plot(t / scale, best - ref, drawstyle="steps-post", color="black", lw=1.2, ls="--", zorder=4,
                    gid=f"best:{problem}:all", label="whole run")
    for name, value in anchors.items():
        ax.axhline(value - ref, color="#888888", lw=0.9, ls=":", zorder=0)
    # The linear band around 0 (the record) ends a decade below the run's closest score:
    # anchors nearer the record than that share the band (and one label) instead of
    # stretching the axis over decades no score of this run reaches.
    data = np.abs([x for x in gaps if math.isfinite(x) and x != 0.0])
    near = float(data.min()) if data.size else max([abs(v - ref) for v in anchors.values() if v != ref] or [1e-6])
    linthresh = float(10 ** math.floor(math.log10(near)) / 10)
    ax.set_yscale("symlog", linthresh=linthresh)
    finite = [x for x in gaps if math.isfinite(x)] + [v - ref for v in anchors.values()]
    ax.set_ylim(min(min(finite) * 1.5, -0.5 * linthresh), max(finite) * 1.5 if max(finite) > 0 else linthresh)
    ax.set_ylabel(f"score − {ref_name}\n({ref:.10g})", fontsize=8)
    ax.grid(alpha=0.3, which="major")
    ax.set_title(f"{problem} (lower is better)", fontsize=10, loc="left")
    _anchor_labels(ax, [(name, value - ref, value) for name, value in anchors.items()])
    ax.set_xlabel(f"wall time since the run started ({unit})")


def figures(res: Any) -> list[Figure]:
    """The instance-level figure of ``res``; [] when the run has no einstein rollouts."""
    rolls = scored_rollouts(res)
    if not rolls:
        return []
    problems = [p for p in ANCHORS if any(r.problem == p for r in rolls)]
    times = [t for r in rolls for t in [r.finished, *(x for x, _ in r.trajectory)] if t is not None]
    scale, unit = (60.0, "min") if times and max(times) > 600 else (1.0, "s")
    fig = MplFigure(figsize=(11, 1.2 + 3.4 * len(problems)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(problems), 1, squeeze=False)[:, 0])
    groups = sorted({r.group for r in rolls}, key=_group_key)
    many = len(groups) > 1
    color = {g: COLORS[i % len(COLORS)] if many else "#555555" for i, g in enumerate(groups)}
    for ax, problem in zip(axes, problems):
        _problem_axes(ax, problem, [r for r in rolls if r.problem == problem], color, scale, unit)
    handles = [Line2D([], [], color=color[g], lw=2, marker="o", ms=3, label=f"best verified, {g}") for g in groups]
    if many:
        handles.append(Line2D([], [], color="black", lw=1.2, ls="--", label="best verified, whole run"))
    handles += [Line2D([], [], color="#999999", lw=0.7, marker=".", alpha=0.6, label="runner's published scores"),
                Line2D([], [], color="#888888", lw=0.9, ls=":", label="published anchor")]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle("Verified score over wall time against the published anchors", fontsize=11)
    n_ok = sum(r.score is not None for r in rolls)
    caption = (f"{len(rolls)} optimizer rollouts ({n_ok} feasible) on {', '.join(problems)}. Steps: the lowest "
               "verified score found so far, at each rollout's finish; faint: the scores each program's runner "
               "published while it ran (not re-verified). y: score minus the best published anchor on a symmetric "
               "log scale (below 0 beats it); dotted lines are the anchors. Groups: "
               + ", ".join(groups) + ".")
    return [Figure("einstein_score_over_time", "Instance level: score over time vs anchors", caption, fig)]
