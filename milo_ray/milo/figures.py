"""MILO's figures of the run report (papers/000 Table 3b, Table 2d/e), for its plugin.

``figures(res)`` draws, for a MILO run:

* ``milo_island_trajectories``: per island, the best admitted search accuracy and the
  held-out accuracy of the island's incumbent after every round, above an orchestrator
  swimlane (the mutator each island ran, Reassign / Speciate / Graft / Curriculum moves
  and refused decisions);
* ``milo_lineage_island_<j>``: island j's lineage tree (admitted vs rejected children,
  edges labelled with the mutation, Δaccuracy and diff size);
* ``milo_pareto``: every evaluated harness, search accuracy against mean output tokens
  and against mean agent seconds, the admitted harnesses and their front highlighted;
* ``milo_true_quality`` (benchmarks with ground truth, i.e. the surrogate): each
  harness's exact expected test score beside its measured search accuracy.

Everything is read from the ``milo.*`` events, replayed into a
:class:`~milo_ray.milo.state.MiloState` exactly as a resumed run rebuilds its state,
so speciated subtrees sit on their new island and curriculum re-fits relabel nodes.
The data each figure plots is also returned by :func:`replay`, :func:`pareto_points`
and :func:`true_qualities` (tests compare them with the tables); artists carry a
``gid`` naming their series.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure as MplFigure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, PercentFormatter

from milo_ray.milo.events import (MILO_EVENTS, CurriculumChanged, DecisionInvalid, Init, IslandFounded, NodeRecorded,
                                  Progress, Reassign, SeedScore)
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.state import MiloState
from milo_ray.search.plugin import Figure

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
          "#7f7f7f")
MUTATOR_COLORS = ("#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#d9d9d9", "#fde0ef", "#ccebc5")
# Swimlane markers, and the x offset (rounds) that keeps the moves of one decision apart:
# a move happens when its island's round closes, so the first sits on the round itself.
MOVES = {"reassign": ("^", "#333333", 0.0, "Reassign"), "speciate": ("*", "#d62728", 0.16, "Speciate"),
         "graft": ("D", "#2ca02c", 0.32, "Graft"), "curriculum": ("P", "#9467bd", 0.0, "Curriculum"),
         "invalid": ("x", "#999999", -0.16, "refused decision")}


def island_color(j: int) -> str:
    return COLORS[int(j) % len(COLORS)]


@dataclass(frozen=True)
class SeriesPoint:
    """An island after round ``round``: its best admitted search accuracy and its
    incumbent (highest held-out, then search accuracy) with that node's scores."""

    round: int
    best_search: float | None
    heldout: float | None
    incumbent: str | None  # node id
    incumbent_search: float | None


@dataclass(frozen=True)
class LaneEvent:
    """An orchestrator move on an island's lane (``island`` None: the curriculum lane),
    at the island's own round count when it happened."""

    island: int | None
    round: int
    kind: str  # a key of MOVES
    label: str


@dataclass
class MiloReplay:
    state: MiloState
    series: dict[int, list[SeriesPoint]]
    lane_events: list[LaneEvent]
    mutators: dict[int, list[tuple[int, str]]]  # island -> [(from round, mutator)]
    seeds: list[SeedScore] = field(default_factory=list)


def _best_search(state: MiloState, j: int) -> float | None:
    accs = [n.accuracy for n in state.islands[j].lineage.admitted() if n.evaluated]
    return max(accs) if accs else None


def _point(state: MiloState, j: int, r: int) -> SeriesPoint:
    b = state.islands[j].best()
    return SeriesPoint(r, _best_search(state, j), b.val_accuracy if b else None, b.node_id if b else None,
                       b.accuracy if b else None)


def replay(res: Any) -> MiloReplay | None:
    """Replay the run's MILO events; None when it has no lineage node (nothing to draw)."""
    events = MILO_EVENTS.decode_rows(res.event_rows())
    if not any(isinstance(e, NodeRecorded) for e in events):
        return None
    method = (res.manifest.get("config") or {}).get("method") or {}
    state = MiloState(eps=float(method.get("eps", 0.02)), temperature=float(method.get("temperature", 1.0)))
    points: dict[int, dict[int, SeriesPoint]] = {}
    lanes: list[LaneEvent] = []
    mutators: dict[int, list[tuple[int, str]]] = {}
    seeds: list[SeedScore] = []
    for e in events:
        # An island's round-0 point: its state just before its first round's work lands.
        touched = (e.node.island if isinstance(e, NodeRecorded) and e.node.origin != "seed" else
                   e.island if isinstance(e, Progress) else None)
        if touched is not None and touched not in points and touched in state.islands:
            points[touched] = {0: _point(state, touched, 0)}
        if isinstance(e, Reassign):
            lanes.append(LaneEvent(e.island, state.rounds_done(e.island), "reassign", e.mutator))
            mutators.setdefault(e.island, []).append((state.rounds_done(e.island), e.mutator))
        elif isinstance(e, IslandFounded):
            lanes.append(LaneEvent(e.from_island, state.rounds_done(e.from_island), "speciate",
                                   f"{e.node_id} → island {e.island}"))
        elif isinstance(e, CurriculumChanged):
            d = state.decisions.get(e.decision_id)
            r = state.rounds_done(d.trigger) if d is not None and d.trigger in state.islands else 0
            lanes.append(LaneEvent(None, r, "curriculum", f"v{e.version}: {len(e.tasks)} tasks"))
        elif isinstance(e, DecisionInvalid) and e.trigger in state.islands:
            lanes.append(LaneEvent(e.trigger, state.rounds_done(e.trigger), "invalid", e.error[:60]))
        elif isinstance(e, NodeRecorded) and e.node.origin == "graft":
            src = state.node_island.get(e.node.co_parent or "")
            lanes.append(LaneEvent(e.node.island, e.node.round, "graft",
                                   f"{e.node.node_id} ← island {src}" if src is not None else e.node.node_id))
        state.apply(e)
        if isinstance(e, Init):
            seeds = list(e.seeds)
            for j, m in e.assignment.items():
                mutators.setdefault(j, []).append((0, m))
        elif isinstance(e, IslandFounded):
            mutators.setdefault(e.island, []).append((0, e.mutator))
        elif isinstance(e, Progress):
            points.setdefault(e.island, {})[e.rounds_done] = _point(state, e.island, e.rounds_done)
    for j in state.islands:
        if j not in points:
            points[j] = {state.rounds_done(j): _point(state, j, state.rounds_done(j))}
    series = {j: [p[r] for r in sorted(p)] for j, p in sorted(points.items())}
    return MiloReplay(state, series, lanes, mutators, seeds)


# --------------------------------------------------------------------------- trajectories
def _trajectories(rp: MiloReplay) -> Figure:
    islands = sorted(rp.series)
    has_curriculum = any(ev.island is None for ev in rp.lane_events)
    lanes: list[int | None] = [*islands, *([None] if has_curriculum else [])]
    fig = MplFigure(figsize=(11, 5.2 + 0.32 * len(lanes)), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3.0, 0.7 + 0.3 * len(lanes)])
    for j in islands:
        pts, c = rp.series[j], island_color(j)
        xs = [p.round for p in pts]
        top.plot(xs, [np.nan if p.best_search is None else p.best_search for p in pts], drawstyle="steps-post",
                 color=c, lw=2, marker="o", ms=3.5, gid=f"best_search:{j}")
        top.plot(xs, [np.nan if p.heldout is None else p.heldout for p in pts], drawstyle="steps-post",
                 color=c, lw=1.4, ls="--", marker="s", ms=3, alpha=0.85, gid=f"heldout:{j}")
    top.set_ylabel("accuracy")
    top.yaxis.set_major_formatter(PercentFormatter(1.0))
    top.grid(alpha=0.3)
    handles = [Line2D([], [], color=island_color(j), lw=2, label=f"island {j}") for j in islands]
    handles += [Line2D([], [], color="k", lw=2, marker="o", ms=3.5, label="best search accuracy (admitted)"),
                Line2D([], [], color="k", lw=1.4, ls="--", marker="s", ms=3, label="held-out accuracy of incumbent")]
    top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    top.set_title("Best search and held-out accuracy per island, by round", fontsize=11)

    lane_y = {lane: i for i, lane in enumerate(lanes)}
    last = max([p.round for s in rp.series.values() for p in s] + [ev.round for ev in rp.lane_events] + [1])
    names = sorted({m for segs in rp.mutators.values() for _, m in segs})
    mcolor = {m: MUTATOR_COLORS[i % len(MUTATOR_COLORS)] for i, m in enumerate(names)}
    for j in islands:
        segs = sorted(rp.mutators.get(j, []), key=lambda s: s[0])
        for k, (start, m) in enumerate(segs):
            end = segs[k + 1][0] if k + 1 < len(segs) else last + 0.5
            if end > start:
                bottom.broken_barh([(start, end - start)], (lane_y[j] - 0.32, 0.64), color=mcolor[m], lw=0)
    for kind, (marker, color, dx, label) in MOVES.items():
        evs = [ev for ev in rp.lane_events if ev.kind == kind]
        if not evs:
            continue
        bottom.scatter([ev.round + dx for ev in evs], [lane_y[ev.island] for ev in evs], marker=marker, s=130 if marker == "*" else 55,
                       color=color, edgecolor="white" if marker != "x" else None, lw=0.6, zorder=3, label=label,
                       gid=f"lane:{kind}")
        if kind in ("speciate", "graft", "curriculum"):
            for ev in evs:
                bottom.annotate(ev.label, (ev.round + dx, lane_y[ev.island]), xytext=(5, 6),
                                textcoords="offset points", fontsize=7, color=color)
    bottom.set_yticks(range(len(lanes)), [f"island {lane}" if lane is not None else "curriculum" for lane in lanes],
                      fontsize=8)
    bottom.set_ylim(len(lanes) - 0.5, -0.5)
    bottom.set_xlim(-0.3, last + 0.5)
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("round (each island counts its own rounds)")
    bottom.set_title("Orchestrator swimlane (lane colour: the island's mutator)", fontsize=9, loc="left")
    proxies = [Line2D([], [], lw=7, color=mcolor[m], label=f"mutator {m}") for m in names]
    move_h, move_l = bottom.get_legend_handles_labels()
    bottom.legend(handles=[*move_h, *proxies], labels=[*move_l, *(p.get_label() for p in proxies)],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False)
    n_moves = {k: sum(ev.kind == k for ev in rp.lane_events) for k in MOVES}
    caption = ("Solid: the highest search accuracy among each island's admitted harnesses after each round; dashed: "
               "the held-out (B_val) accuracy of the island's incumbent. Speciated islands start at round 0 with the "
               "subtree they received. Swimlane: " + ", ".join(f"{n} {MOVES[k][3]}" for k, n in n_moves.items() if n)
               + (" " if any(n_moves.values()) else "no orchestrator moves ") + "over the run.")
    return Figure("milo_island_trajectories", "MILO: per-island accuracy by round", caption, fig)


# --------------------------------------------------------------------------- lineage trees
ROW_IN, DEPTH_IN, MAX_WIDTH_IN = 0.44, 2.7, 20.0  # inches per tree row, per generation; widest tree


def _layout(nodes: list[LineageNode]) -> tuple[dict[str, tuple[float, float]], int]:
    """(depth, row) of every node; leaves take consecutive rows in depth-first order and
    a parent sits midway between its first and last child."""
    ids = {n.node_id for n in nodes}
    kids: dict[str | None, list[LineageNode]] = {}
    for n in nodes:
        kids.setdefault(n.parent if n.parent in ids else None, []).append(n)
    pos: dict[str, tuple[float, float]] = {}
    row = 0

    def place(n: LineageNode, depth: int) -> float:
        nonlocal row
        ch = kids.get(n.node_id, [])
        if not ch:
            y = float(row)
            row += 1
        else:
            ys = [place(c, depth + 1) for c in ch]
            y = (ys[0] + ys[-1]) / 2
        pos[n.node_id] = (float(depth), y)
        return y

    for root in kids.get(None, []):
        place(root, 0)
    return pos, row


def _short(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _lineage(rp: MiloReplay, j: int, acc_range: tuple[float, float]) -> Figure:
    lin = rp.state.islands[j].lineage
    nodes = lin.nodes()
    pos, rows = _layout(nodes)
    depth = int(max((p[0] for p in pos.values()), default=0))
    # Deep trees get narrower generations (and shorter edge labels) so the figure stays readable on a page.
    gen_in = min(DEPTH_IN, MAX_WIDTH_IN / (depth + 1))
    label_chars = int(gen_in * 0.66 / 0.048)
    width_in = gen_in * (depth + 1) + 2.6
    fig = MplFigure(figsize=(width_in, ROW_IN * max(rows, 3) + 1.9), layout="constrained")
    ax = fig.subplots()
    best = rp.state.islands[j].best()
    cmap, norm = mpl.colormaps["viridis"], mpl.colors.Normalize(*acc_range)
    for n in nodes:
        e = lin.edge(n.node_id)
        if e is None:
            continue
        (px, py), (cx, cy) = pos[e.parent], pos[n.node_id]
        mid = px + 0.3
        ax.plot([px, mid, mid, cx], [py, py, cy, cy], color="#2ca02c" if n.admitted else "#b0b0b0",
                lw=1.6 if n.admitted else 1.0, ls="-" if n.admitted else (0, (3, 2)), zorder=1,
                gid=f"edge:{e.parent}->{n.node_id}")
        if n.mutation:
            ax.annotate(_short(n.mutation, label_chars), (mid, cy), xytext=(3, 1.5), textcoords="offset points", fontsize=6.5,
                        color="#555555", va="bottom", ha="left", style="italic")
        delta = [] if e.delta_acc is None else [f"Δacc {100 * e.delta_acc:+.1f} pp"]
        delta.append(f"+{e.diff_added}/−{e.diff_deleted} lines")
        dcolor = "#555555" if e.delta_acc is None else "#1a7f37" if e.delta_acc > 0 else "#c62828"
        ax.annotate("  ".join(delta), (mid, cy), xytext=(3, -2), textcoords="offset points", fontsize=6.5,
                    color=dcolor, va="top", ha="left")
    groups = {"admitted": [n for n in nodes if n.admitted and n.evaluated],
              "rejected": [n for n in nodes if not n.admitted and n.evaluated],
              "failed": [n for n in nodes if not n.evaluated]}
    for kind, ns in groups.items():
        if not ns:
            continue
        xy = np.array([pos[n.node_id] for n in ns])
        if kind == "admitted":
            ax.scatter(xy[:, 0], xy[:, 1], s=70, c=[n.accuracy for n in ns], cmap=cmap, norm=norm,
                       edgecolor="black", lw=0.8, zorder=3, gid="nodes:admitted")
        elif kind == "rejected":
            ax.scatter(xy[:, 0], xy[:, 1], s=55, facecolor="white", edgecolor=cmap(norm([n.accuracy for n in ns])),
                       lw=1.6, zorder=3, gid="nodes:rejected")
        else:
            ax.scatter(xy[:, 0], xy[:, 1], s=40, marker="x", color="#999999", zorder=3, gid="nodes:failed")
    if best is not None:
        bx, by = pos[best.node_id]
        ax.scatter([bx], [by], s=260, marker="o", facecolor="none", edgecolor="#e6a700", lw=2.2, zorder=2,
                   gid="nodes:incumbent")
    for n in nodes:
        x, y = pos[n.node_id]
        acc = "—" if n.accuracy is None else f"{100 * n.accuracy:.1f}%"
        extra = ""
        if n.origin == "graft" and n.co_parent:
            extra = f"  ⊕ {n.co_parent} (island {rp.state.node_island.get(n.co_parent, '?')})"
        elif n.parent and n.parent not in lin:
            extra = f"  (from {n.parent}, island {rp.state.node_island.get(n.parent, '?')})"
        ax.annotate(f"{n.node_id}  {acc}{extra}", (x, y), xytext=(7, 0), textcoords="offset points", fontsize=7.5,
                    va="center", ha="left", fontweight="bold" if n.admitted else "normal",
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85}, zorder=4)
    ax.set_xlim(-0.25, depth + 1.0)
    ax.set_ylim(max(rows, 1) - 0.4, -0.7)
    ax.set_xticks(range(depth + 1), [f"gen {d}" for d in range(depth + 1)], fontsize=8)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    sm = mpl.cm.ScalarMappable(norm=norm, cmap=cmap)
    cb = fig.colorbar(sm, ax=ax, shrink=min(0.8, 3.0 / max(ROW_IN * rows, 1.0)), pad=0.01, aspect=20)
    cb.set_label("search accuracy", fontsize=8)
    cb.ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    handles = [Line2D([], [], ls="", marker="o", mfc=cmap(0.7), mec="black", ms=8, label="admitted"),
               Line2D([], [], ls="", marker="o", mfc="white", mec=cmap(0.7), mew=1.6, ms=7, label="rejected"),
               Line2D([], [], ls="", marker="x", color="#999999", ms=6, label="no harness / not evaluated"),
               Line2D([], [], ls="", marker="o", mfc="none", mec="#e6a700", mew=2, ms=13, label="incumbent"),
               Line2D([], [], color="#2ca02c", lw=1.6, label="edge to admitted child"),
               Line2D([], [], color="#b0b0b0", lw=1.0, ls=(0, (3, 2)), label="edge to rejected child")]
    # Six entries in one row need about 9 in at this size; a narrower (shallow) tree's figure
    # stacks them in two or three rows rather than letting them run off its edges.
    ncols = 6 if width_in >= 9.5 else 3 if width_in >= 5.5 else 2
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, ncols=ncols, frameon=False)
    mut = rp.state.assignment.get(j)
    ax.set_title(f"Island {j} lineage ({len(nodes)} nodes, {len(groups['admitted'])} admitted"
                 + (f"; mutator now {mut}" if mut else "") + ")", fontsize=11)
    caption = (f"Island {j}'s lineage tree as the run left it, left to right by generation. Filled nodes were "
               "admitted to the island's archive, hollow ones rejected (colour: search accuracy); each edge carries "
               "the mutation's label above and, below, Δaccuracy vs the parent (same curriculum version only) and "
               "the diff size. The ringed node is the island's incumbent (highest held-out accuracy).")
    return Figure(f"milo_lineage_island_{j}", f"MILO: lineage of island {j}", caption, fig)


# --------------------------------------------------------------------------- Pareto
@dataclass(frozen=True)
class ParetoPoint:
    node_id: str | None  # None: a seed that founded no island
    harness_id: str
    island: int | None
    accuracy: float
    output_tokens: float
    seconds: float
    admitted: bool


def pareto_points(rp: MiloReplay) -> list[ParetoPoint]:
    """Every evaluated harness: each island's nodes (final labels) and the seeds that got no island."""
    out = [ParetoPoint(n.node_id, n.harness_id, rp.state.node_island.get(n.node_id), float(n.accuracy),
                       float(n.costs.get("output_tokens", np.nan)), float(n.costs.get("seconds", np.nan)),
                       bool(n.admitted))
           for isl in rp.state.islands.values() for n in isl.nodes() if n.evaluated]
    placed = {p.harness_id for p in out}
    out += [ParetoPoint(None, s.harness_id, None, s.accuracy, float(s.costs.get("output_tokens", np.nan)),
                        float(s.costs.get("seconds", np.nan)), False)
            for s in rp.seeds if s.harness_id not in placed]
    return out


def front(costs: np.ndarray, accs: np.ndarray) -> np.ndarray:
    """Indices of the 2-D non-dominated points (lower cost, higher accuracy), by cost."""
    order = np.lexsort((-accs, costs))
    keep, best = [], -math.inf
    for i in order:
        if accs[i] > best:
            keep.append(i)
            best = accs[i]
    return np.array(keep, dtype=int)


COST_LABELS = {"output_tokens": "mean output tokens per task", "seconds": "mean agent seconds per task"}


def pareto_axes(pts: list[ParetoPoint]) -> list[str]:
    """The cost axes some harness spent anything on (an optimizer run spends no tokens)."""
    return [a for a in COST_LABELS if any(getattr(p, a) > 0 for p in pts)]


def _pareto(rp: MiloReplay, pts: list[ParetoPoint]) -> Figure:
    axis_info = [(a, COST_LABELS[a]) for a in pareto_axes(pts)]
    fig = MplFigure(figsize=(6 * len(axis_info), 5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(axis_info), sharey=True, squeeze=False)[0])
    for ax, (axis, label) in zip(axes, axis_info):
        cost = np.array([getattr(p, axis) for p in pts])
        acc = np.array([p.accuracy for p in pts])
        adm = np.array([p.admitted for p in pts])
        ok = np.isfinite(cost) & np.isfinite(acc)
        rej = ok & ~adm & np.array([p.node_id is not None for p in pts])
        seed = ok & np.array([p.node_id is None for p in pts])
        a = ok & adm
        ax.scatter(cost[rej], acc[rej], s=22, color="#bdbdbd", alpha=0.8, lw=0, label="rejected", gid=f"rejected:{axis}")
        if seed.any():
            ax.scatter(cost[seed], acc[seed], s=30, marker="v", color="#8c8c8c", label="seed without island",
                       gid=f"seeds:{axis}")
        ax.scatter(cost[a], acc[a], s=55, c=[island_color(pts[i].island or 0) for i in np.flatnonzero(a)],
                   edgecolor="black", lw=0.7, zorder=3, gid=f"admitted:{axis}")
        if a.any():
            idx = np.flatnonzero(a)[front(cost[a], acc[a])]
            xs, ys = cost[idx], acc[idx]
            ax.plot(np.r_[xs, xs[-1] * 1.0], np.r_[ys, ys[-1]], drawstyle="steps-post", color="black", lw=1.2,
                    alpha=0.7, zorder=2, gid=f"front:{axis}")
        pos = cost[ok & (cost > 0)]
        if pos.size and pos.max() / pos.min() > 10:
            ax.set_xscale("log")
        ax.set_xlabel(label + (" (log)" if ax.get_xscale() == "log" else ""))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("search accuracy")
    axes[0].yaxis.set_major_formatter(PercentFormatter(1.0))
    islands = sorted({p.island for p in pts if p.admitted and p.island is not None})
    handles = [Line2D([], [], ls="", marker="o", mfc=island_color(j), mec="black", ms=7, label=f"admitted, island {j}")
               for j in islands]
    handles += [Line2D([], [], ls="", marker="o", color="#bdbdbd", ms=6, label="rejected"),
                Line2D([], [], color="black", lw=1.2, alpha=0.7, label="front of the admitted")]
    if any(p.node_id is None for p in pts):
        handles.append(Line2D([], [], ls="", marker="v", color="#8c8c8c", ms=6, label="seed without island"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.suptitle("Accuracy vs cost of every evaluated harness", fontsize=11)
    n_adm = sum(p.admitted for p in pts)
    caption = (f"{len(pts)} evaluated harnesses ({n_adm} admitted). Costs are the search-split means MILO ranked "
               "them by; the black staircase is the non-dominated front of the admitted harnesses in each "
               "projection (admission itself uses accuracy, tokens and seconds together).")
    return Figure("milo_pareto", "MILO: accuracy vs cost", caption, fig)


# --------------------------------------------------------------------------- ground truth
def _ground_truth(res: Any) -> Any | None:
    """The run's benchmark when it has ground truth (``true_quality``), else None."""
    cfg = dict((res.manifest.get("config") or {}).get("benchmark") or {})
    target = cfg.pop("_target_", None)
    if not target or "." not in str(target):
        return None
    module, _, name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if not callable(getattr(cls, "true_quality", None)):
        return None
    try:
        return cls(**cfg)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{res.run_dir}/manifest.json config.benchmark: cannot rebuild {target} to compute true "
                         f"quality ({e}); the run was written by an incompatible version") from e


def true_qualities(res: Any, rp: MiloReplay) -> dict[str, float]:
    """harness id -> exact expected test score (on the run's ``method.test_split``), for
    every evaluated node, computed from the harness source stored with its node. Empty
    when the benchmark has no ground truth."""
    from milo_ray.harness.model import Harness
    from milo_ray.search.final_test import true_score

    bench = _ground_truth(res)
    if bench is None:
        return {}
    split = ((res.manifest.get("config") or {}).get("method") or {}).get("test_split") or "test"
    out: dict[str, float] = {}
    for isl in rp.state.islands.values():
        for n in isl.nodes():
            if not n.evaluated or n.harness_id in out or not n.source_ref:
                continue
            get = getattr(res, "source_files", None) or res.source
            files = get(n.source_ref)
            if files is None:
                continue
            h = Harness(files) if isinstance(files, dict) else Harness.from_source(files)
            score = true_score(bench, h, split)
            if score is not None:
                out[n.harness_id] = score
    return out


def _true_quality(rp: MiloReplay, tq: dict[str, float]) -> Figure:
    fig = MplFigure(figsize=(12, 5), layout="constrained")
    left, right = fig.subplots(1, 2)
    nodes = [(n, rp.state.node_island[n.node_id]) for isl in rp.state.islands.values() for n in isl.nodes()
             if n.evaluated and n.harness_id in tq]
    for admitted, style in ((False, {"facecolor": "white", "s": 30, "lw": 1.2}),
                            (True, {"edgecolor": "black", "s": 50, "lw": 0.7})):
        sel = [(n, j) for n, j in nodes if n.admitted == admitted]
        if not sel:
            continue
        colors = [island_color(j) for _, j in sel]
        kw = {"c": colors} if admitted else {"edgecolor": colors}
        left.scatter([n.accuracy for n, _ in sel], [tq[n.harness_id] for n, _ in sel], zorder=3,
                     gid=f"true:{'admitted' if admitted else 'rejected'}", **kw, **style)
    vals = [v for n, _ in nodes for v in (n.accuracy, tq[n.harness_id])]
    if vals:
        lo, hi = min(vals) - 0.02, max(vals) + 0.02
        left.plot([lo, hi], [lo, hi], color="#999999", ls=":", lw=1, label="true = measured")
        left.set_xlim(lo, hi)
        left.set_ylim(lo, hi)
    left.set_xlabel("measured search accuracy")
    left.set_ylabel("true quality (exact expected test score)")
    left.set_title("Every evaluated harness", fontsize=10)
    for ax in (left, right):
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(alpha=0.3)
    left.xaxis.set_major_formatter(PercentFormatter(1.0))
    by_node = {n.node_id: n for n, _ in nodes}
    for j, pts in rp.series.items():
        ps = [p for p in pts if p.incumbent in by_node]
        if not ps:
            continue
        xs = [p.round for p in ps]
        right.plot(xs, [tq[by_node[p.incumbent].harness_id] for p in ps], drawstyle="steps-post",
                   color=island_color(j), lw=2, gid=f"incumbent_true:{j}", label=f"island {j}")
        right.plot(xs, [p.incumbent_search for p in ps], drawstyle="steps-post", color=island_color(j), lw=1.2,
                   ls="--", alpha=0.8, gid=f"incumbent_search:{j}")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("round")
    right.set_ylabel("accuracy / true quality")
    right.set_title("Island incumbents: true quality (solid) vs measured search accuracy (dashed)", fontsize=10)
    handles, _ = right.get_legend_handles_labels()
    handles += [Line2D([], [], color="k", lw=2, label="true quality"),
                Line2D([], [], color="k", lw=1.2, ls="--", label="measured search accuracy"),
                Line2D([], [], ls="", marker="o", mfc="k", mec="black", label="admitted"),
                Line2D([], [], ls="", marker="o", mfc="white", mec="k", label="rejected")]
    right.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    caption = ("The surrogate knows each harness's exact expected test score (true quality, from the mechanisms "
               "found in its source). Left: true quality against the noisy search-split accuracy MILO measured "
               "(points above the diagonal were under-measured). Right: per island, the incumbent's true quality "
               "and its measured search accuracy after each round.")
    return Figure("milo_true_quality", "MILO: true quality vs measured accuracy", caption, fig)


# --------------------------------------------------------------------------- entry
def figures(res: Any) -> list[Figure]:
    """The MILO figures of ``res`` (a :class:`milo_ray.results.RunResults` of a MILO run)."""
    rp = replay(res)
    if rp is None:
        return []
    out = [_trajectories(rp)]
    pts = pareto_points(rp)
    accs = [p.accuracy for p in pts] or [0.0, 1.0]
    rng = (min(accs), max(accs) if max(accs) > min(accs) else min(accs) + 1e-6)
    out += [_lineage(rp, j, rng) for j in sorted(rp.state.islands) if len(rp.state.islands[j].nodes())]
    if pareto_axes(pts):
        out.append(_pareto(rp, pts))
    tq = true_qualities(res, rp)
    if tq:
        out.append(_true_quality(rp, tq))
    return out
