"""The report's rubric section for a PaperBench run: the best harness's final-test rollouts,
each with its rubric score and per-category subscores in one table, and below it each
rollout's graded tree (collapsed): every leaf's verdict, requirement and the grader's
reason.

Reads what the rollouts' traces keep (``verifier.details``, as
:class:`~milo_ray.benchmarks.paperbench.benchmark.PaperBenchFormat.verify` writes it) and
which harness and rollouts the final test used (the method plugin's
:meth:`~milo_ray.search.plugin.MethodPlugin.final_test`, through
:func:`milo_ray.results.final_test`); it computes no score. Requirement and reason texts
are the rubric's and the grader's: every one is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any, Mapping

import pandas as pd

from milo_ray.benchmarks.paperbench.render import leaf_verdict, reproduction_summary
from milo_ray.benchmarks.paperbench.rubric import CATEGORIES
from milo_ray.report.html import Section
from milo_ray.report.tables import render

# Rollouts whose trees the page shows; a final test of more is cut, and says so.
MAX_ROLLOUTS = 40

CSS = """<style>
ul.rubric { list-style: none; padding-left: 18px; margin: 4px 0; font-size: 13px; }
ul.rubric.root { padding-left: 0; }
ul.rubric li { margin: 3px 0; }
ul.rubric .node { color: #334e68; }
ul.rubric .req { display: block; color: var(--fg); margin-left: 4px; }
ul.rubric .why { display: block; color: var(--muted); margin-left: 4px; font-style: italic; }
ul.rubric .meta { color: var(--muted); font-size: 12px; }
.verdict { display: inline-block; min-width: 44px; text-align: center; padding: 0 6px; border-radius: 9px;
           font-size: 11px; font-weight: 700; }
.verdict.pass { background: #c6f6d5; color: #22543d; } .verdict.fail { background: #fed7d7; color: #822727; }
.verdict.other { background: #fefcbf; color: #744210; }
details.graded summary { font-size: 13px; }
</style>"""


def sections(res: Any) -> list[Section]:
    """One section for a PaperBench run ([] for any other benchmark's)."""
    if "paperbench" not in str(res.benchmark):
        return []
    best, rows = _best_rollouts(res)
    lead = ("Each paper's submission is graded against its rubric by the grader role: a leaf is a 0/1 verdict, "
            "and a node's score the weight-averaged score of its children. <b>score</b>: the rubric score of the "
            "rollout (in [0, 1]); <b>per category</b>: the weight-averaged verdict of that category's graded leaves "
            "(— where the mode grades none); <b>graded weight</b>: the share of the rubric's weight the score rests "
            "on (below 1 with max_leaves, or judge failures dropped). Open a rollout for its tree.")
    if best is None or rows.empty:
        return [Section("rubric", "Rubric grading", f'<p class="lead">{lead}</p><p class="nodata">no data: no '
                        "final-test rollout of this run carries a graded rubric tree</p>")]
    label, harness_id = best
    head = (f'<p class="lead">The final test\'s best harness by mean rubric score (PR@k): '
            f"<b>{escape(str(label))}</b> <code>{escape(harness_id[:10])}</code>, its {len(rows)} final-test "
            f"rollout(s). {lead}</p>")
    shown = rows.head(MAX_ROLLOUTS)
    table, trees = [], []
    for _, r in shown.iterrows():
        details = ((res.trace(r["trace_ref"]) or {}).get("verifier") or {}).get("details") or {}
        table.append(_row(r, details))
        trees.append(_tree_block(r, details))
    frame = pd.DataFrame(table)
    body = head + render(frame, table_id="rubric-table", caption="Rubric score and subscores per final-test rollout")
    if len(rows) > len(shown):
        body += f'<p class="warn">The trees of the first {len(shown)} of {len(rows)} rollouts are shown.</p>'
    return [Section("rubric", "Rubric grading", CSS + body + "".join(trees))]


def _best_rollouts(res: Any) -> tuple[tuple[str, str] | None, pd.DataFrame]:
    """(label, harness id) of the final test's best row and its final-test rollouts."""
    from milo_ray import results

    final = results.final_test(res)
    if final.empty:
        return None, pd.DataFrame()
    scored = final.assign(_s=final["pr_at_k"].fillna(-1.0))
    top = scored.iloc[int(scored["_s"].to_numpy().argmax())]
    spec = res.plugin.final_test(res)
    ro = res.rollouts
    rows = ro[ro["cache_key"].isin(spec.cache_keys)] if spec.cache_keys is not None else ro[ro["split"] == spec.split]
    rows = rows[rows["harness_id"] == top["harness_id"]]
    # A retried rollout is stored again: its last row is the one the test scored.
    rows = rows.drop_duplicates(["task_id", "rollout_idx"], keep="last").sort_values(["task_id", "rollout_idx"])
    return (str(top["label"]), str(top["harness_id"])), rows


def _row(r: Any, details: Mapping[str, Any]) -> dict[str, Any]:
    cats = details.get("categories") or {}
    leaves = _leaves(details.get("tree") or {})
    counts = {v: sum(1 for lf in leaves if leaf_verdict(lf) == v) for v in ("PASS", "FAIL", "JUDGE FAILED")}
    return {"task": r["task_id"], "rollout": int(r["rollout_idx"]), "score": float(r["score"]),
            **{c: cats.get(c) for c in CATEGORIES},
            "leaves passed": counts["PASS"], "leaves failed": counts["FAIL"], "judge failures": counts["JUDGE FAILED"],
            "graded weight": details.get("graded_weight_fraction"), "mode": (details.get("plan") or {}).get("mode"),
            "reproduce.sh": reproduction_summary(rep) if isinstance(rep := details.get("reproduction"), Mapping)
            else None}


def _leaves(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if not node:
        return []
    if "sub_tasks" not in node:
        return [node]
    return [lf for c in node.get("sub_tasks") or [] for lf in _leaves(c)]


def _score(v: Any) -> str:
    return "—" if v is None else f"{float(v):.3f}"


def _tree_block(r: Any, details: Mapping[str, Any]) -> str:
    tree = details.get("tree")
    title = (f"{escape(str(r['task_id']))} · rollout {int(r['rollout_idx'])} · score {_score(r['score'])}")
    if not isinstance(tree, Mapping):
        why = r.get("error") or "the verifier recorded no graded tree"
        return f'<details class="graded"><summary>{title}</summary><p class="nodata">{escape(str(why))}</p></details>'
    verdicts = [leaf_verdict(lf) for lf in _leaves(tree)]
    counts = " · ".join(f"{verdicts.count(v)} {v.lower()}" for v in ("PASS", "FAIL", "JUDGE FAILED", "NOT GRADED")
                        if verdicts.count(v))
    return (f'<details class="graded" data-task="{escape(str(r["task_id"]))}"><summary>{title} · leaves: {counts}'
            f'</summary><ul class="rubric root">{_node(tree)}</ul></details>')


def _node(n: Mapping[str, Any]) -> str:
    req = f'<span class="req">{escape(str(n.get("requirements") or ""))}</span>'
    if "sub_tasks" in n:
        kids = "".join(_node(c) for c in n.get("sub_tasks") or [])
        return (f'<li><span class="node"><code>{escape(str(n.get("id")))}</code> score {_score(n.get("score"))}</span>'
                f' <span class="meta">weight {escape(str(n.get("weight")))}</span>{req}'
                f'<ul class="rubric">{kids}</ul></li>')
    v = leaf_verdict(n)
    cls = {"PASS": "pass", "FAIL": "fail"}.get(v, "other")
    why = n.get("reason") if n.get("status") == "graded" else n.get("error")
    reason = (f'<span class="why">{"reason" if n.get("status") == "graded" else "why"}: {escape(str(why))}</span>'
              if why else "")
    return (f'<li data-leaf="{escape(str(n.get("id")))}" data-verdict="{escape(v)}"><span class="verdict {cls}">'
            f'{escape(v)}</span> <code>{escape(str(n.get("id")))}</code> <span class="meta">'
            f'{escape(str(n.get("category")))} · weight {escape(str(n.get("weight")))}</span>{req}{reason}</li>')
