"""Markdown renderings of the lineage memory (papers/000 §4.1.2, App. C.1–C.2).

Owns the text mutators and the orchestrator read: the island snapshot (an indented
tree, one line per harness with its depth, the on-disk paths of its ``harness.py``
and ``diff.patch``, the edge label and the node label, plus a "what moved the
needle" ranking), the flat archive of the ablation baselines, and the
whole-population snapshot.

Line conventions other components parse (keep them stable): every node line holds
``mutation: <one-line label>`` (children only) and ends with ``verdict: admitted`` or
``verdict: rejected (<reason>)``; fields are separated by `` | ``.
"""

from __future__ import annotations

from typing import Any, Iterable

from milo_ray.milo.lineage import Edge, Lineage, LineageNode


def _clean(text: str) -> str:
    return " ".join(str(text).replace("|", "/").split())


def _fmt_tokens(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


def node_label(n: LineageNode) -> str:
    if not n.evaluated:
        return "not evaluated"
    c = n.costs
    s = f"acc {n.accuracy:.3f} · tokens {_fmt_tokens(c.get('output_tokens'))} · seconds {c.get('seconds', 0.0):,.0f}"
    if n.val_accuracy is not None:
        s += f" · held-out {n.val_accuracy:.3f}"
    return s


def verdict_text(n: LineageNode) -> str:
    if n.admitted:
        return "verdict: admitted"
    reason = _clean(n.verdict_reason.removeprefix("rejected: ")) or "rejected"
    return f"verdict: rejected ({reason})"


def _gains(e: Edge) -> list[str]:
    if e.delta_acc is None:
        return []
    return [f"Δacc {e.delta_acc:+.3f}", f"Δtokens {-e.delta_cost.get('output_tokens', 0.0):+,.0f}",
            f"Δseconds {-e.delta_cost.get('seconds', 0.0):+,.0f}"]


def _edge_text(lin: Lineage, n: LineageNode) -> str:
    e = lin.edge(n.node_id)
    if e is None:
        return ""
    return "edge: " + ", ".join([f"diff +{e.diff_added}/-{e.diff_deleted}", *_gains(e)])


def _co_parent_text(lin: Lineage, n: LineageNode) -> str:
    e = lin.co_parent_edge(n.node_id)
    gains = _gains(e) if e is not None else []
    return f"co-parent: {n.co_parent}" + (f" (vs it: {', '.join(gains)})" if gains else "")


def node_line(lin: Lineage, n: LineageNode, depth: int) -> str:
    fields: list[str] = [f"{'  ' * depth}- [{n.node_id}] depth {depth} · {n.origin}"]
    if n.harness_path:
        fields.append(f"harness: {n.harness_path}")
    if n.diff_path and n.parent is not None:
        fields.append(f"diff: {n.diff_path}")
    edge = _edge_text(lin, n)
    if edge:
        fields.append(edge)
    if n.co_parent:
        fields.append(_co_parent_text(lin, n))
    fields.append(node_label(n))
    if n.origin != "seed" or n.parent is not None:
        fields.append(f"mutator: {n.mutator or '-'}")
        fields.append(f"mutation: {_clean(n.mutation) or '(no label)'}")
    fields.append(verdict_text(n))
    return " | ".join(fields)


def render_tree(lin: Lineage) -> list[str]:
    lines: list[str] = []

    def walk(n: LineageNode, depth: int) -> None:
        lines.append(node_line(lin, n, depth))
        for c in lin.children(n.node_id):
            walk(c, depth + 1)

    for r in lin.roots():
        walk(r, 0)
    return lines


def needle_ranking(lin: Lineage, limit: int = 10) -> list[str]:
    """Edits ranked by Δacc (best first); unevaluated children are listed last."""
    rows = []
    for n in lin:
        e = lin.edge(n.node_id)
        if e is None:
            continue
        rows.append((e.delta_acc if e.delta_acc is not None else float("-inf"), n, e))
    rows.sort(key=lambda t: -t[0])
    out = []
    for i, (d, n, e) in enumerate(rows[:limit], 1):
        da = "n/a" if e.delta_acc is None else f"{e.delta_acc:+.3f}"
        out.append(f"{i}. Δacc {da} | [{n.node_id}] from [{e.parent}] | mutation: {_clean(n.mutation) or '(no label)'} | {verdict_text(n)}")
    return out


def render_island(lin: Lineage, *, mutator: str | None = None, stall: int | None = None,
                  best_val: float | None = None, heading: str = "#") -> str:
    head = f"{heading} Island {lin.island}"
    meta = []
    if mutator:
        meta.append(f"mutator: {mutator}")
    if stall is not None:
        meta.append(f"stall: {stall}")
    if best_val is not None:
        meta.append(f"best held-out: {best_val:.3f}")
    n_adm = len(lin.admitted())
    meta.append(f"harnesses: {len(lin)} ({n_adm} admitted, {len(lin) - n_adm} rejected)")
    lines = [head, " · ".join(meta), "", f"{heading}# Lineage tree", *render_tree(lin), ""]
    ranking = needle_ranking(lin)
    if ranking:
        lines += [f"{heading}# What moved the needle (edits by Δacc)", *ranking, ""]
    return "\n".join(lines)


def render_flat_archive(lin: Lineage) -> str:
    """The unstructured archive of the ablation baselines: admitted harnesses and
    their aggregate scores only — no tree, no edits, no rejected children."""
    adm = sorted((n for n in lin.admitted() if n.evaluated), key=lambda n: -(n.accuracy or 0.0))
    lines = ["# Archive", ""]
    for n in adm:
        lines.append(f"- {n.harness_path or n.node_id} | acc {n.accuracy:.3f}")
    return "\n".join(lines) + "\n"


def behavior_summary(behavior: dict[str, float], limit: int = 12) -> str:
    solved = sorted(t for t, v in behavior.items() if v >= 0.999)
    failed = sorted(t for t, v in behavior.items() if v <= 0.001)
    partial = sorted(t for t, v in behavior.items() if 0.001 < v < 0.999)

    def few(xs: list[str]) -> str:
        return ", ".join(xs[:limit]) + (f", … (+{len(xs) - limit})" if len(xs) > limit else "")

    return f"solved {len(solved)} [{few(solved)}]; partial {len(partial)} [{few(partial)}]; failed {len(failed)} [{few(failed)}]"


def render_population(islands: Iterable[tuple[int, dict[str, Any], str]], *, assignment: dict[int, str],
                      pool: list[str], regret: dict[str, float], search_tasks: list[str],
                      trigger: int | None = None, curriculum_version: int = 0) -> str:
    """The whole-population snapshot the orchestrator reads: a header, then per island
    (id, :meth:`Island.summary`, the island's own snapshot markdown) its summary line,
    best harness, recent verdicts, per-task behavior of its best, and its full tree."""
    lines = ["# Population snapshot", ""]
    if trigger is not None:
        lines.append(f"Stalled island: {trigger}")
    lines.append(f"Mutator pool: {', '.join(pool)}")
    lines.append("Assignment: " + ", ".join(f"island {j} -> {m}" for j, m in sorted(assignment.items())))
    lines.append(f"Search set: {len(search_tasks)} tasks (curriculum version {curriculum_version})")
    top = sorted(regret.items(), key=lambda kv: -kv[1])[:10]
    lines.append("Regret tasks (max - mean accuracy over admitted harnesses): "
                 + (", ".join(f"{t} {r:.2f}" for t, r in top if r > 0) or "none"))
    lines.append("")
    for island, summ, island_md in islands:
        best = summ.get("best") or {}
        recent = summ.get("recent") or []
        verdicts = " ".join("A" if r["admitted"] else "R" for r in recent) or "-"
        lines.append(f"## Island {island} summary")
        lines.append(f"mutator: {assignment.get(island, '-')} · stall: {summ.get('stall', 0)} · "
                     f"recent verdicts (oldest first): {verdicts}")
        if best:
            val = best.get("val_accuracy")
            lines.append(f"best: [{best['node_id']}] acc {best['accuracy']:.3f}"
                         + (f" · held-out {val:.3f}" if val is not None else ""))
            lines.append("best behavior: " + behavior_summary(best.get("behavior") or {}))
        lines.append("")
        lines.append(island_md.replace("\n# ", "\n### ").replace("\n## ", "\n#### ").lstrip("# ").join(["### ", ""]))
        lines.append("")
    return "\n".join(lines)
