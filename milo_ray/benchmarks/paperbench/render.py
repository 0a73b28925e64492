"""A graded rubric tree as text a reader acts on: ``graded.md`` in a harness's evidence
(what a mutator reads about a paper it was graded on), one line per node, each leaf with
its verdict and the grader's reason.

Reads only the verifier record a rollout's trace keeps (``verifier.details`` as
:func:`~milo_ray.benchmarks.paperbench.rubric.aggregate` and
:class:`~milo_ray.benchmarks.paperbench.benchmark.PaperBenchFormat.verify` write it), so a
run stored earlier renders the same way. The requirement and reason texts come from the
rubric and the grader's answer: each is cut and folded onto one line, so no text can
forge a line of the tree.
"""

from __future__ import annotations

from typing import Any, Mapping

# A leaf's verdict, when it has none of 0/1, as words a reader scans for.
VERDICT = {"judge_failed": "JUDGE FAILED", "not_sampled": "NOT GRADED"}


def leaf_verdict(leaf: Mapping[str, Any]) -> str:
    """PASS, FAIL, JUDGE FAILED (the grader's answer was no verdict, or it was refused) or
    NOT GRADED (outside the mode, or left out of the leaf sample)."""
    status = leaf.get("status")
    if status == "graded":
        return "PASS" if float(leaf.get("score") or 0) >= 1 else "FAIL"
    return str(VERDICT.get(str(status), status or "?"))


def reproduction_summary(rep: Mapping[str, Any]) -> str:
    """How reproduce.sh ran, in a few words (its exit status, or why it has none)."""
    if not rep.get("ran"):
        return f"not run ({_one_line(rep.get('error'), 200)})"
    if rep.get("timed_out"):
        return f"stopped at its limit of {float(rep.get('timeout_s') or 0):.0f} s"
    if rep.get("exit_code") is None:
        return f"exit status unknown ({_one_line(rep.get('error'), 200)})"
    return f"exit {rep.get('exit_code')} after {float(rep.get('seconds') or 0):.1f} s"


def _one_line(text: Any, limit: int = 400) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def graded_markdown(verifier: Mapping[str, Any], *, task_id: str = "") -> str | None:
    """``graded.md`` for one rollout's verifier record, or None when it holds no graded tree
    (a verifier that failed before grading)."""
    details = verifier.get("details") or {}
    tree = details.get("tree")
    if not isinstance(tree, Mapping):
        return None
    plan = details.get("plan") or {}
    score = details.get("score", verifier.get("score"))
    head = [f"# Rubric grading{f' of {task_id}' if task_id else ''}", "",
            f"- rubric score (weighted mean of the graded leaves' 0/1 verdicts, up the tree): "
            f"{float(score or 0):.3f}",
            f"- mode: {plan.get('mode', '?')}; leaves graded: {plan.get('leaves_graded', '?')} of "
            f"{plan.get('leaves_in_mode', '?')} in the mode (max_leaves {plan.get('max_leaves')}, max_depth "
            f"{plan.get('max_depth')})",
            f"- graded weight fraction (share of the rubric's weight the score rests on): "
            f"{float(details.get('graded_weight_fraction') or 0):.3f}; judge failures: "
            f"{details.get('judge_failed_leaves', 0)}, counted as {details.get('judge_failures', '?')}"]
    rep = details.get("reproduction")
    if isinstance(rep, Mapping):
        head.append(f"- reproduce.sh, run before grading: {reproduction_summary(rep)}"
                    + ("; its output is reproduce.log in the submission" if rep.get("ran") else ""))
    cats = details.get("categories") or {}
    if cats:
        head.append("- per category (weighted mean leaf verdict): "
                    + ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in cats.items()))
    head += ["", "Each leaf: its verdict, id, category and weight, the requirement, and the grader's reason "
                 "(or why it was not graded). The weight of a node is relative to its siblings.", ""]
    lines: list[str] = []

    def walk(node: Mapping[str, Any], depth: int) -> None:
        pad = "  " * depth
        if "sub_tasks" in node:
            s = node.get("score")
            lines.append(f"{pad}- `{node.get('id')}` {'-' if s is None else f'{float(s):.3f}'} (weight "
                         f"{node.get('weight')}): {_one_line(node.get('requirements'), 200)}")
            for c in node.get("sub_tasks") or []:
                walk(c, depth + 1)
            return
        lines.append(f"{pad}- **{leaf_verdict(node)}** `{node.get('id')}` ({node.get('category')}, weight "
                     f"{node.get('weight')}): {_one_line(node.get('requirements'))}")
        why = node.get("reason") if node.get("status") == "graded" else node.get("error")
        if why:
            lines.append(f"{pad}  - {'reason' if node.get('status') == 'graded' else 'why'}: {_one_line(why, 1000)}")

    walk(tree, 0)
    return "\n".join(head + lines) + "\n"
