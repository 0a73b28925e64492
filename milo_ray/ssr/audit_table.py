"""The racing audit's numbers: true regret per rule and budget, paired against the
uniform subset, over many matrices; the printed table and its Parquet form.

For each matrix and budget (a fraction of the full-matrix cost H·T·R) every rule of
:data:`DEFAULT_RULES` replays the same ``replays`` task orders (common random numbers,
so rule − uniform is a paired difference). A selection's **true regret** is
100·(max_h truth[h] − truth[selected]) points, truth being each harness's exact expected
quality (or held-out mean, :mod:`milo_ray.ssr.audit`); the **in-sample** regret uses the
matrix's own means instead and is reported beside it, labelled. Baselines on the same
matrices: keep the parent, a random child (its exact expectation), the oracle (0 by
definition) and the full matrix (every cell, 100% of the cost).

Across matrices a rule's regret is the mean of its per-matrix means and its error the
standard error across matrices; ``vs_uniform`` is the mean per-matrix paired difference
to the uniform subset at the same budget, with its standard error across matrices (the
error the target is judged by) and, per matrix, the replay standard error.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from milo_ray.ssr.audit import RewardMatrix
from milo_ray.ssr.audit_replay import RuleSpec, draw_permutations, permutations, replay_rule

DEFAULT_RULES: tuple[RuleSpec, ...] = (
    RuleSpec("uniform", "uniform", stages=1),
    RuleSpec("successive_halving", "successive_halving", stages=2),
    RuleSpec("halving_k4", "halving", stages=4),
    RuleSpec("paired", "paired", block=5, alpha=0.05, min_tasks=10),
    RuleSpec("successive_halving+gate", "successive_halving", stages=2, replace_alpha=0.1),
    RuleSpec("paired_rejects", "paired_rejects", stages=4),
    RuleSpec("bandit", "bandit", block=5, alpha=0.1),
    RuleSpec("lowrank", "lowrank", block=5),
)
BASELINES = ("keep_parent", "random_child", "oracle", "full_matrix")


def spread(m: RewardMatrix) -> dict[str, float]:
    """The matrix's true spread of candidate quality, in points: best − worst and best −
    second best over all harnesses, and the parent's distance to the best."""
    t = np.sort(m.true_values())[::-1] * 100
    return {"true_spread": float(t[0] - t[-1]), "best_gap": float(t[0] - t[1]),
            "parent_regret": float(t[0] - 100 * m.true_values()[0])}


def audit_matrix(m: RewardMatrix, *, fractions: Sequence[float] = (0.2, 0.4, 0.6),
                 rules: Sequence[RuleSpec] = DEFAULT_RULES, replays: int = 500, seed: int = 0,
                 label: str = "") -> list[dict[str, Any]]:
    """One row per (rule, budget) and per baseline on matrix ``m``."""
    truth = m.true_values()
    q_in = m.quality()
    best, in_best = truth.max(), q_in.max()
    true_best_child = 1 + int(np.argmax(truth[1:]))
    perms = permutations(len(m.task_ids), replays, np.random.default_rng(seed))
    diff = np.asarray(m.diff_sizes or (0,) * len(m.harness_ids))
    base = {"matrix": label, "harnesses": len(m.harness_ids), "tasks": len(m.task_ids),
            "rollouts": int(m.rewards.shape[2]), "truth_source": m.truth_source, **spread(m)}

    def row(rule: str, fraction: float, sel: np.ndarray, spent: np.ndarray, **extra: Any) -> dict[str, Any]:
        regret = 100 * (best - truth[sel])
        return {**base, "rule": rule, "fraction": float(fraction), "replays": int(len(sel)),
                "regret": float(regret.mean()),
                "regret_se": float(regret.std(ddof=1) / np.sqrt(len(sel))) if len(sel) > 1 else 0.0,
                "in_sample_regret": float((100 * (in_best - q_in[sel])).mean()),
                "executions": float(spent.mean()), "spend": float(spent.mean()) / m.full_cost,
                "p_replaced": float((sel != 0).mean()), "p_worse_than_parent": float((truth[sel] < truth[0]).mean()),
                "_regret": regret, **extra}

    rows = []
    full = replay_rule(m.rewards, RuleSpec("full", "uniform", stages=1), m.full_cost, perms[:1], diff_sizes=diff)
    rows.append(row("full_matrix", 1.0, full.selected, full.executions))
    rows.append(row("keep_parent", 0.0, np.zeros(1, dtype=int), np.zeros(1)))
    rows.append(row("oracle", 0.0, np.array([int(np.argmax(truth))]), np.zeros(1)))
    children = np.arange(1, len(truth))
    rows.append(row("random_child", 0.0, children, np.zeros(len(children))))  # every child once: the exact mean
    if not any(s.label == "uniform" and s.rule == "uniform" and s.stages == 1 for s in rules):
        rules = (RuleSpec("uniform", "uniform", stages=1), *rules)  # the reference every rule is paired with
    rules = sorted(rules, key=lambda s: s.label != "uniform")
    # One set of orders per draw; the discriminative orders use their own generator so the
    # uniform orders (and every uniform-draw row) are the same with or without them.
    orders = {"uniform": perms}
    for d in dict.fromkeys(s.draw for s in rules if s.draw != "uniform"):
        orders[d] = draw_permutations(m.history, len(m.task_ids), replays, np.random.default_rng([seed, 1]), d)
    for f in fractions:
        budget = int(f * m.full_cost)
        uniform = np.zeros(0)
        for spec in rules:
            out = replay_rule(m.rewards, spec, budget, orders[spec.draw], diff_sizes=diff, best_child=true_best_child,
                              history=m.history)
            r = row(spec.label, f, out.selected, out.executions, batch=out.batch,
                    p_best_kept=float(out.best_kept.mean()) if spec.rule != "uniform" else float("nan"))
            if spec.label == "uniform":
                uniform = r["_regret"]
            d = r["_regret"] - uniform  # the same task orders: a paired difference
            r["vs_uniform"] = float(d.mean())
            r["vs_uniform_se_replays"] = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
            rows.append(r)
    for r in rows:
        r.pop("_regret")
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Across matrices: per (rule, budget) the mean of the per-matrix means and the
    standard errors across matrices (of the regret and of the paired difference to the
    uniform subset)."""
    keys = list(dict.fromkeys((r["rule"], r["fraction"]) for r in rows))
    out = []
    for rule, f in keys:
        sel = [r for r in rows if r["rule"] == rule and r["fraction"] == f]
        n = len(sel)

        def mean(k: str) -> float:
            v = [r[k] for r in sel if k in r and r[k] == r[k]]
            return float(np.mean(v)) if v else float("nan")

        def se(k: str) -> float:
            v = [r[k] for r in sel if k in r and r[k] == r[k]]
            return float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")

        out.append({"rule": rule, "fraction": f, "matrices": n, "replays": int(sel[0]["replays"]),
                    "regret": mean("regret"), "regret_se": se("regret"), "in_sample_regret": mean("in_sample_regret"),
                    "spend": mean("spend"), "executions": mean("executions"), "vs_uniform": mean("vs_uniform"),
                    "vs_uniform_se": se("vs_uniform"), "p_best_kept": mean("p_best_kept"),
                    "p_worse_than_parent": mean("p_worse_than_parent"), "p_replaced": mean("p_replaced")})
    return out


def _num(x: float, fmt: str) -> str:
    return "-" if x != x else format(x, fmt)


def format_spreads(rows: Sequence[dict[str, Any]]) -> str:
    """One line per matrix: its truth source and true spread."""
    seen = {}
    for r in rows:
        seen.setdefault(r["matrix"], r)
    return "\n".join(f"  {k}: {r['harnesses']} harnesses x {r['tasks']} tasks x R={r['rollouts']}; true spread "
                     f"{r['true_spread']:.2f} pts, best - second {r['best_gap']:.2f} pts, parent "
                     f"{r['parent_regret']:.2f} pts below the best ({r['truth_source']})" for k, r in seen.items())


def format_table(summary: Sequence[dict[str, Any]]) -> str:
    """True regret (points) with its error across matrices, the paired difference to the
    uniform subset, the in-sample regret (labelled), actual spend and the true best's fate."""
    head = (f"{'budget':>6} {'rule':<24} {'true regret':>13} {'- uniform (paired SE)':>22} {'in-sample':>9} "
            f"{'spend':>6} {'best kept':>9} {'< parent':>8}")
    lines = [head, "-" * len(head)]
    for r in summary:
        budget = "-" if r["rule"] in BASELINES and r["rule"] != "full_matrix" else f"{r['fraction']:.0%}"
        reg = f"{r['regret']:.2f} ± {_num(r['regret_se'], '.2f')}"
        vs = "" if r["vs_uniform"] != r["vs_uniform"] or r["rule"] == "uniform" else \
            f"{r['vs_uniform']:+.2f} ± {_num(r['vs_uniform_se'], '.2f')}"
        lines.append(f"{budget:>6} {r['rule']:<24} {reg:>13} {vs:>22} {r['in_sample_regret']:>9.2f} "
                     f"{r['spend']:>6.1%} {_num(r['p_best_kept'], '.0%'):>9} {r['p_worse_than_parent']:>8.0%}")
    return "\n".join(lines)


def verdict(summary: Sequence[dict[str, Any]], *, fraction: float = 0.4, within: float = 0.3) -> str:
    """Which rules at ``fraction`` meet the target: true regret within ``within`` points
    of the full matrix's and below the uniform subset's by more than two standard errors
    across matrices. Every rule is judged, not only the lowest-regret one."""
    full = next((r for r in summary if r["rule"] == "full_matrix"), None)
    cands = [r for r in summary if r["fraction"] == fraction and r["rule"] not in BASELINES
             and r["rule"] != "uniform"]
    if full is None or not cands:
        return "target: not evaluated (no full-matrix row or no rule at that budget)"
    lines, met = [], []
    for r in sorted(cands, key=lambda r: r["regret"]):
        close = r["regret"] - full["regret"] <= within
        se = r["vs_uniform_se"]
        beats = se == se and r["vs_uniform"] < -2 * se
        if close and beats:
            met.append(r["rule"])
        z = f"{-r['vs_uniform'] / se:.1f}" if se == se and se > 0 else "-"
        lines.append(f"  {r['rule']:<24} regret {r['regret']:.2f} (full matrix {full['regret']:.2f}: "
                     f"{'within' if close else 'not within'} {within}); vs uniform {r['vs_uniform']:+.2f} ± "
                     f"{_num(se, '.2f')} ({z} SE)")
    head = f"target at {fraction:.0%} (within {within} pts of the full matrix, > 2 SE below uniform): " + \
        (f"met by {', '.join(met)}" if met else "met by no rule")
    return "\n".join([head, *lines])


def write_parquet(path: Any, per_matrix: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]],
                  **labels: Any) -> None:
    """Both levels in one file: ``level`` = ``matrix`` (one row per matrix, rule and
    budget) or ``summary`` (across matrices); ``labels`` become constant columns (e.g.
    the regime)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"level": "matrix", **labels, **r} for r in per_matrix] + \
        [{"level": "summary", **labels, **r} for r in summary]
    cols = list(dict.fromkeys(k for r in rows for k in r))
    table = pa.Table.from_pylist([{k: r.get(k) for k in cols} for r in rows])
    pq.write_table(table, path)


def versus_reference(per_matrix: Sequence[dict[str, Any]], *, fraction: float = 0.2, within: float = 0.3,
                     reference: str = "successive_halving") -> str:
    """The issue's target at ``fraction``: a rule's true regret within ``within`` points of
    the full matrix's and below ``reference``'s by more than two standard errors, the
    difference paired by matrix (each matrix's mean regret under the rule minus under the
    reference, at the same budget) and its error the standard error across matrices."""
    by = {(r["matrix"], r["rule"], r["fraction"]): r["regret"] for r in per_matrix}
    mats = list(dict.fromkeys(r["matrix"] for r in per_matrix))
    rules = [r for r in dict.fromkeys(r["rule"] for r in per_matrix if r["fraction"] == fraction)
             if r not in BASELINES and r != reference]
    full = np.array([by[(k, "full_matrix", 1.0)] for k in mats])
    ref = [by.get((k, reference, fraction)) for k in mats]
    if not rules or any(x is None for x in ref):
        return f"target at {fraction:.0%}: not evaluated (no {reference} row at that budget)"
    ref_a = np.array(ref, dtype=float)
    lines, met = [], []
    for rule in rules:
        reg = np.array([by[(k, rule, fraction)] for k in mats])
        gap, d = reg.mean() - full.mean(), reg - ref_a
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
        ok = gap <= within and se == se and d.mean() < -2 * se
        met += [rule] if ok else []
        lines.append(f"  {rule:<24} regret {reg.mean():.2f}, {gap:+.2f} vs full matrix; vs {reference} "
                     f"{d.mean():+.2f} ± {_num(se, '.2f')} (paired by matrix)")
    head = (f"target at {fraction:.0%} (within {within} pts of the full matrix, > 2 SE below {reference}): "
            + (f"met by {', '.join(met)}" if met else "met by no rule"))
    return "\n".join([head, *lines])
