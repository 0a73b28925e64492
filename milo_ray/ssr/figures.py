"""SSR's figures (SSR §4.1-4.4; papers/002 Fig. 4/7), drawn from the run's events.

Per round: the RER coverage curve ``F(prefix k)`` of the evidence order the round's
candidates drew from (``ssr.refresh.order`` over the round's ``experience`` rows,
scored by :mod:`milo_ray.kernels.submodular`, the same objective the greedy
maximized), the race as a bracket (generated candidates, their cumulative stage
scores, eliminations, the accepted/kept decision), and the execution budget spent
over wall time. Everything is read from stored events and tables; nothing is
re-decided here. A run without the data for a figure simply gets no such figure.
A run directory holding ``racing_audit.parquet`` (``scripts/racing_audit.py --run DIR``
writes it there) also gets the audit's true regret against budget, per racing rule.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure as MplFigure

from milo_ray.search.plugin import Figure

# Random evidence orders drawn for the coverage baseline band: enough for a stable
# mean and 10-90% band, few enough that a 100-record round costs milliseconds.
RANDOM_ORDERS = 32
ACCEPT, KEEP, ELIM, PARENT = "#2e7d32", "#616161", "#c62828", "#37474f"


def figures(res: Any) -> list[Figure]:
    """The SSR figures this run (a ``RunResults`` of an SSR run) has data for."""
    out = []
    for build in (coverage_figure, bracket_figure, budget_figure, audit_figure):
        fig = build(res)
        if fig is not None:
            out.append(fig)
    return out


def _rows(res: Any, kind: str) -> list[dict[str, Any]]:
    """One dict per event of ``kind`` (payload fields plus the round/harness_id/time
    columns), in store order."""
    ev = res.events
    if ev is None or len(ev) == 0:
        return []
    sel = ev[ev["kind"] == kind]
    if "seq" in sel:
        sel = sel.sort_values("seq")
    out = []
    for _, r in sel.iterrows():
        data = r.get("data")
        row = dict(data) if isinstance(data, dict) else {}
        rnd = r.get("round")
        row["round"] = None if rnd is None or pd.isna(rnd) else int(rnd)
        row["harness_id"] = r.get("harness_id")
        row["time"] = float(r["time"]) if "time" in r and not pd.isna(r["time"]) else None
        out.append(row)
    return out


def _short(hid: Any) -> str:
    return str(hid)[:8] if hid else "?"


# ---------------------------------------------------------------------------- coverage
def coverage_curve(records: pd.DataFrame, order: list[str]) -> np.ndarray:
    """``F(prefix k)`` for k = 0..N of the records in evidence ``order`` (task ids).

    ``records``: the round's experience rows (task_id, w, q, embedding); judge
    failures are not in the order, as in ``evidence.order_records``. O(N^2 dim + N^2).
    """
    from milo_ray.kernels.submodular import clipped_cosine, coverage_objective

    by_task = {r.task_id: r for r in records.itertuples()}
    missing = [t for t in order if t not in by_task]
    if missing:
        raise ValueError(f"evidence order names task(s) with no experience row: {missing[:3]}")
    rows = [by_task[t] for t in order]
    w = np.array([r.w for r in rows], dtype=float)
    q = np.array([r.q for r in rows], dtype=float)
    S = clipped_cosine(np.stack([np.asarray(r.embedding, dtype=float) for r in rows]))
    return np.array([coverage_objective(np.arange(k), w, q, S) for k in range(len(rows) + 1)])


def _round_records(res: Any, rnd: int, parent: Any) -> pd.DataFrame:
    x = res.experience
    if x is None or len(x) == 0:
        return pd.DataFrame()
    sel = x[(x["round"] == rnd) & (x["harness_id"] == parent)]
    if "judge_error" in sel:
        sel = sel[sel["judge_error"].isna()]
    return sel[sel["embedding"].notna() & sel["w"].notna() & sel["q"].notna()]


def coverage_figure(res: Any) -> Figure | None:
    refreshes = [r for r in _rows(res, "ssr.refresh") if r.get("order")]
    scales = {r["round"]: sorted({int(g["scale"]) for g in r.get("generated", []) if g.get("scale")})
              for r in _rows(res, "ssr.candidates")}
    curves = []
    for r in refreshes:
        recs = _round_records(res, r["round"], r["harness_id"])
        if len(recs) == 0:
            continue
        try:
            F = coverage_curve(recs, list(r["order"]))
        except ValueError:
            continue  # an order the stored records cannot reproduce: no curve rather than a wrong one
        rng = np.random.default_rng(r["round"])
        order = list(r["order"])
        rand = np.stack([coverage_curve(recs, [order[i] for i in rng.permutation(len(order))])
                         for _ in range(RANDOM_ORDERS)])
        curves.append((r, F, rand))
    if not curves:
        return None
    # Small multiples, one panel per round: the scale markers of several rounds on one
    # axis would overlap (every round draws at the same k).
    ncols = min(3, len(curves))
    nrows = math.ceil(len(curves) / ncols)
    fig = MplFigure(figsize=(4.4 * ncols if ncols > 1 else 8.5, 3.6 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).ravel()
    color, band = "#1565c0", "#90a4ae"
    for ax, (r, F, rand) in zip(axes, curves):
        k = np.arange(len(F))
        lo, hi = np.quantile(rand, [0.1, 0.9], axis=0)
        ax.fill_between(k, lo, hi, color=band, alpha=0.3, lw=0, label="random orders (10-90%)")
        ax.plot(k, rand.mean(axis=0), color=band, lw=1.2, ls="--", label="random orders (mean)")
        ax.plot(k, F, color=color, lw=2.2, label=f"{r.get('ordering', '?')} order")
        for s_ in scales.get(r["round"], []):
            if 0 < s_ < len(F):
                ax.plot([s_], [F[s_]], "o", color=color, ms=7, mec="white", mew=1.5, zorder=5)
                ax.annotate(f"k={s_}", (s_, F[s_]), textcoords="offset points", xytext=(0, -14), ha="center",
                            fontsize=8, color=color)
        ax.set_title(f"round {r['round']} · parent {_short(r['harness_id'])} · N={len(F) - 1}", fontsize=10)
        ax.set_xlabel("prefix size k")
        ax.grid(alpha=0.3)
        _tidy(ax)
    for ax in axes[len(curves):]:
        ax.set_visible(False)
    for row in range(nrows):
        axes[row * ncols].set_ylabel(r"coverage $F(\pi_{1..k})$")
    axes[0].legend(fontsize=8, loc="lower right", frameon=False)
    return Figure("ssr_coverage", "Evidence coverage by prefix (RER)",
                  "Coverage F(Y) = Σ_j w_j·log(1 + Σ_{i∈Y} q_i·s_ij) of each evidence prefix, in the order the round's "
                  "candidates drew from (solid), against random orders of the same records (dashed: mean; band: "
                  "10-90%). Dots mark the candidates' evidence scales k. A greedy RER order rises fastest: its "
                  "short prefixes already cover most of what the full set covers.", fig)


def _palette(n: int) -> list:
    import matplotlib

    # tab10 while it has colours enough, tab20 past ten (the audit's rules), never reused below 20.
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _tidy(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


# ---------------------------------------------------------------------------- bracket
def race_rounds(res: Any) -> list[dict[str, Any]]:
    """Per raced round: its parent, generated candidates, stage results and selection."""
    rounds: dict[int, dict[str, Any]] = {}
    for r in _rows(res, "ssr.candidates"):
        rounds.setdefault(r["round"], {"round": r["round"], "parent": r["harness_id"], "stages": []}).update(
            generated=r.get("generated", []), racing=r.get("racing", []))
    for r in _rows(res, "ssr.stage_result"):
        if r["round"] in rounds:
            rounds[r["round"]]["stages"].append(r)
    for r in _rows(res, "ssr.selection"):
        if r["round"] in rounds:
            rounds[r["round"]]["selection"] = r
    return [rounds[k] for k in sorted(rounds)]


def ssr_decisions(res: Any) -> pd.DataFrame:
    """One row per raced SSR round, read from its ``ssr.candidates`` and
    ``ssr.selection`` events: the decision as the run recorded it."""
    rows = []
    for r in race_rounds(res):
        sel = r.get("selection") or {}
        gen = r.get("generated") or []
        rows.append({
            "round": r["round"], "parent": r["parent"], "generated": len(gen), "raced": len(r.get("racing") or []),
            "scales": ", ".join(str(g.get("scale")) for g in gen),
            "stages": sel.get("completed_stages"), "executions": sel.get("executions"),
            "parent_score": sel.get("parent_score"), "best_child": sel.get("best_child"),
            "best_child_score": sel.get("best_child_score"),
            "decision": ("accepted" if sel.get("replaced") else "kept parent") if sel else "no selection",
            "race_stop": sel.get("stop_reason"),
        })
    return pd.DataFrame(rows)


def bracket_figure(res: Any) -> Figure | None:
    rounds = [r for r in race_rounds(res) if r.get("generated")]
    if not rounds:
        return None
    # One panel per round; a long run's rounds go into a grid (2-3 panels a row) so the
    # figure stays readable instead of growing one tall column.
    ncols = 1 if len(rounds) <= 2 else (2 if len(rounds) <= 6 else 3)
    nrows = math.ceil(len(rounds) / ncols)
    rows_per_panel = max(len(r["generated"]) for r in rounds) + 1.6
    fig = MplFigure(figsize=(9.5 if ncols == 1 else 7.2 * ncols, max(2.6, nrows * (0.5 * rows_per_panel + 0.6))),
                    layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    n_cols = max(len(r["stages"]) for r in rounds)  # same columns in every round, so stages line up
    for ax, rnd in zip(axes, rounds):
        _draw_bracket(ax, rnd, n_cols)
    for ax in axes[len(rounds):]:
        ax.set_visible(False)
    return Figure("ssr_bracket", "Racing bracket per round",
                  "Each round's candidates (rows; k = evidence scale) race the protected parent on shared stage "
                  "batches. Numbers are cumulative mean scores after each stage; × marks an elimination, a hollow "
                  "marker a candidate that never raced (invalid or duplicate). The last column is the decision: "
                  "the best surviving child replaces the parent only on a strictly higher cumulative score.", fig)


def _draw_bracket(ax, rnd: dict[str, Any], n_cols: int) -> None:
    stages = rnd["stages"]
    sel = rnd.get("selection") or {}
    parent = rnd["parent"]
    gen = sorted(rnd["generated"], key=lambda g: g.get("index", 0))
    rows = [("parent", parent, None)] + [(f"c{g.get('index')} k={g.get('scale')}", g.get("harness_id"), g) for g in gen]
    n_st = len(stages)
    xdec = max(n_st, n_cols) + 1
    first_row: dict[Any, str] = {}  # harness id -> the row that drew it first
    for y, (label, hid, g) in enumerate(rows):
        y = -y
        is_parent = g is None
        color = PARENT if is_parent else "#1565c0"
        # A later draw of a harness already in the round races only once (under its
        # first row), even when its event carries no duplicate error.
        dup_of = first_row.get(hid) if hid is not None else None
        first_row.setdefault(hid, label.split()[0])
        if g is not None and (g.get("error") or dup_of or hid not in rnd.get("racing", [])):
            ax.plot([0], [y], "o", mfc="white", mec=KEEP, ms=8)
            why = str(g.get("error")).split(":")[0][:40] if g.get("error") else (
                f"duplicate of {dup_of}" if dup_of else "did not race")
            ax.text(0.15, y, why, va="center", fontsize=8, color=KEEP, style="italic")
            continue
        xs, ys = [0], [y]
        ax.plot([0], [y], "o", color=color, ms=7)
        eliminated_at = None
        for s, st in enumerate(stages, 1):
            score = (st.get("scores") or {}).get(hid)
            if score is None:
                break
            xs.append(s)
            ys.append(y)
            ax.text(s, y + 0.22, f"{score:.3f}", ha="center", va="bottom", fontsize=8, color=color)
            if hid in (st.get("eliminated") or []):
                eliminated_at = s
                break
        ax.plot(xs, ys, color=color, lw=2.5 if is_parent else 2, alpha=0.85, ls="--" if is_parent else "-")
        for x in xs[1:]:
            ax.plot([x], [y], "o", color=color, ms=6)
        if eliminated_at is not None:
            ax.plot([eliminated_at], [y], "x", color=ELIM, ms=11, mew=2.5, zorder=5)
        elif sel and hid == sel.get("selected"):
            accepted = bool(sel.get("replaced"))
            col = ACCEPT if accepted else KEEP
            ax.plot([xs[-1], xdec], [y, y], ":", color=col, lw=1.5)
            ax.plot([xdec], [y], "*", color=col, ms=16, zorder=5)
            ax.text(xdec + 0.12, y, "accepted" if accepted else "kept (parent)", va="center", fontsize=9,
                    color=col, weight="bold")
        elif sel and hid == sel.get("best_child") and not sel.get("replaced"):
            ax.text(xs[-1] + 0.12, y, "best child: not strictly better", fontsize=8, color=KEEP, va="center")
        elif sel and not is_parent and len(xs) > 1:
            ax.text(xs[-1] + 0.12, y, "not selected", fontsize=8, color=KEEP, va="center")
    ax.set_yticks([-i for i in range(len(rows))], [r[0] for r in rows], fontsize=9)
    ax.set_xticks(range(xdec + 1), ["generated"] + [f"stage {s}" for s in range(1, xdec)] + ["decision"],
                  fontsize=9)
    ax.set_xlim(-0.3, xdec + 1.4)
    ax.set_ylim(-len(rows) + 0.4, 0.8)
    stop = sel.get("stop_reason")
    title = f"round {rnd['round']}: parent {_short(parent)}"
    if sel:
        title += (f" → {'accepted ' + _short(sel.get('selected')) if sel.get('replaced') else 'parent kept'}"
                  f" ({sel.get('completed_stages', n_st)} stage(s), {sel.get('executions', '?')} executions"
                  f"{'' if stop in (None, 'completed') else ', stopped: ' + str(stop)})")
    else:
        title += " (no selection recorded)"
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.25)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


# ---------------------------------------------------------------------------- budget
def budget_figure(res: Any) -> Figure | None:
    ro = res.rollouts
    if ro is None or len(ro) == 0 or "finished_at" not in ro:
        return None
    ro = ro[ro["finished_at"].notna()]
    budgeted = ro["budgeted"] if "budgeted" in ro and ro["budgeted"].notna().any() else ro["split"] != "test"
    spent = ro[budgeted.fillna(False).astype(bool)].sort_values("finished_at")
    if len(spent) == 0:
        return None
    t0 = float(res.manifest.get("started_at") or spent["finished_at"].min())
    t = (spent["finished_at"].to_numpy(dtype=float) - t0)
    scale, unit = (60.0, "min") if t.max() > 300 else (1.0, "s")
    calls = res.agent_calls
    has_calls = calls is not None and len(calls) > 0 and "time" in calls and calls["time"].notna().any()
    fig = MplFigure(figsize=(9, 5.2 if has_calls else 3.6), layout="constrained")
    axes = fig.subplots(2 if has_calls else 1, 1, squeeze=False, sharex=True)[:, 0]
    ax = axes[0]
    t_end = _end_time(res, t0, t)
    ax.step(np.r_[0.0, t, t_end] / scale, np.r_[0, np.arange(1, len(t) + 1), len(t)], where="post", color="#1565c0",
            lw=2, label="budgeted executions")
    cap = _execution_cap(res)
    if cap:
        ax.axhline(cap, color=ELIM, ls="--", lw=1.2, label=f"budget B = {cap}")
    starts = [r for r in _rows(res, "ssr.round") if r["time"] is not None]
    every = max(1, math.ceil(len(starts) / 12))  # at most ~12 round labels, so they never overlap
    for i, r in enumerate(starts):
        x = (r["time"] - t0) / scale
        for a in axes:
            a.axvline(x, color="0.6", lw=0.8, ls=":")
        if i % every == 0:
            ax.text(x, ax.get_ylim()[1], f" r{r['round']}", fontsize=8, color="0.35", va="top")
    ax.set_ylabel("executions")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    _tidy(ax)
    if has_calls:
        _agent_spend(axes[1], calls, t0, scale, t_end)
    axes[-1].set_xlabel(f"wall time since start ({unit})")
    cap_txt = f" against the budget B = {cap}" if cap else ""
    return Figure("ssr_budget", "Budget consumption over time",
                  f"Cumulative budgeted executions (training refreshes and racing){cap_txt}; dotted lines mark "
                  "round starts. The lower panel shows the search agents' cumulative spend by role (tokens when "
                  "the calls report them, else the number of calls). Final-test executions are outside B.", fig)


def _execution_cap(res: Any) -> int | None:
    for r in _rows(res, "ssr.summary"):
        if r.get("execution_budget"):
            return int(r["execution_budget"])
    cfg = (res.manifest.get("config") or {}).get("run", {}).get("budget", {})
    cap = cfg.get("executions") if isinstance(cfg, dict) else None
    return int(cap) if isinstance(cap, (int, float)) and not math.isnan(cap) else None


def _end_time(res: Any, t0: float, t: np.ndarray) -> float:
    """Seconds from start to the run's end (or its last budgeted execution while it runs)."""
    end = res.manifest.get("finished_at")
    return max(float(t.max()), float(end) - t0) if isinstance(end, (int, float)) else float(t.max())


def _agent_spend(ax, calls: pd.DataFrame, t0: float, scale: float, t_end: float) -> None:
    calls = calls[calls["time"].notna()].sort_values("time")
    tokens = calls["input_tokens"].fillna(0) + calls["output_tokens"].fillna(0)
    use_tokens = bool(tokens.sum() > 0)
    for (role, g), color in zip(calls.groupby("role"), _palette(calls["role"].nunique())):
        y = (g["input_tokens"].fillna(0) + g["output_tokens"].fillna(0)).cumsum() if use_tokens \
            else np.arange(1, len(g) + 1)
        y = np.asarray(y, dtype=float)
        x = g["time"].to_numpy(dtype=float) - t0
        # Start each role at zero and carry its total to the end, so a role with one
        # call (the embedder) still draws a visible step.
        ax.step(np.r_[0.0, x, max(t_end, x.max())] / scale, np.r_[0.0, y, y[-1]], where="post", color=color, lw=1.8,
                label=role)
    ax.set_ylabel("agent tokens" if use_tokens else "agent calls")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    _tidy(ax)


# ---------------------------------------------------------------------------- audit
AUDIT_FILE = "racing_audit.parquet"


def audit_figure(res: Any) -> Figure | None:
    """True regret against budget per racing rule with ±1 SE (across matrices) bands,
    the full matrix and keep-the-parent as reference lines; one panel per audit group.
    A rule raced with another task draw (``<rule>+disc``) shares its rule's colour and is
    dashed, so a panel reads as rules × draws."""
    path = Path(res.run_dir) / AUDIT_FILE
    if not path.is_file():
        return None
    t = pd.read_parquet(path)
    t = t[t["level"] == "summary"] if "level" in t else t
    if "group" not in t:
        t = t.assign(group="")
    groups = list(dict.fromkeys(t["group"]))
    fig = MplFigure(figsize=(4.6 * len(groups), 3.6), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    refs = {"full_matrix": ("full matrix (100%)", "0.35"), "keep_parent": ("keep parent", PARENT)}
    for ax, g in zip(axes, groups):
        sub = t[t["group"] == g]
        rules = [r for r in dict.fromkeys(sub["rule"]) if r not in ("full_matrix", "keep_parent", "oracle",
                                                                     "random_child")]
        bases = list(dict.fromkeys(r.removesuffix("+disc") for r in rules))
        colors = dict(zip(bases, _palette(len(bases))))
        for rule in rules:
            color, drawn = colors[rule.removesuffix("+disc")], rule.endswith("+disc")
            r = sub[sub["rule"] == rule].sort_values("fraction")
            x, y = 100 * r["fraction"].to_numpy(float), r["regret"].to_numpy(float)
            se = np.nan_to_num(r["regret_se"].to_numpy(float))
            ax.plot(x, y, "s--" if drawn else "o-", color=color, lw=1.6, ms=4, label=rule)
            ax.fill_between(x, y - se, y + se, color=color, alpha=0.15, lw=0)
        for rule, (label, color) in refs.items():
            row = sub[sub["rule"] == rule]
            if len(row):
                ax.axhline(float(row["regret"].iloc[0]), color=color, ls="--", lw=1, label=label)
        ax.set_title(str(g), fontsize=9)
        ax.set_xlabel("budget (% of the full-matrix cost)")
        ax.grid(alpha=0.3)
        _tidy(ax)
    axes[0].set_ylabel("true regret (points)")
    axes[-1].legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return Figure("ssr_racing_audit", "Racing audit: true regret against budget",
                  "Mean true regret of each racing rule's selection (points below the best candidate's true "
                  "quality) at each budget, with ±1 standard error across matrices; every rule replays the same "
                  "task orders (dashed, '+disc': the same rule drawing the tasks an earlier population passes at an "
                  f"intermediate rate first). From {AUDIT_FILE} (scripts/racing_audit.py).", fig)
