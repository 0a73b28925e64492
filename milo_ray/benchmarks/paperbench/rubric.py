"""A PaperBench rubric: the tree of requirements a replication is graded against, as the
upstream ``rubric.json`` states it, and the score a graded tree gives.

Each node has ``id``, ``requirements`` (text), an integer ``weight`` >= 0 and
``sub_tasks``; a leaf carries ``task_category`` (``Code Development``, ``Code Execution``
or ``Result Analysis``) and optionally ``finegrained_task_category``. Other keys in real
files are ignored.

Owns :func:`parse_rubric` (errors name the node's path and the field), :func:`select`
(the grading plan: the mode's leaves, the depth cap, the leaf sample -- the options that
bound a rollout's grading cost, each recorded) and :func:`aggregate` (scores as weighted
averages up the tree, a failed leaf counted as 0 (``judge_failures="zero"``, the
upstream's rule) or dropped with the graded weight fraction reported (``"drop"``)).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

CATEGORIES = ("Code Development", "Code Execution", "Result Analysis")
MODES = {"codedev": ("Code Development",), "full": CATEGORIES}
JUDGE_FAILURES = ("zero", "drop")


@dataclass(frozen=True)
class Node:
    id: str
    requirements: str
    weight: int
    sub_tasks: tuple["Node", ...] = ()
    category: str | None = None
    depth: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.sub_tasks

    def leaves(self) -> list["Node"]:
        return [self] if self.is_leaf else [lf for c in self.sub_tasks for lf in c.leaves()]


def parse_rubric(data: Any, *, where: str = "rubric.json") -> Node:
    """The rubric tree; ``ValueError`` naming every malformed node and field."""
    problems: list[str] = []
    seen: set[str] = set()

    def walk(d: Any, path: str, depth: int) -> Node | None:
        if not isinstance(d, Mapping):
            problems.append(f"{where}{path}: expected an object with id, requirements, weight, sub_tasks")
            return None
        nid, req, weight, subs = d.get("id"), d.get("requirements"), d.get("weight"), d.get("sub_tasks", [])
        if not isinstance(nid, str) or not nid:
            problems.append(f"{where}{path}.id: missing or not a string")
            nid = path
        elif nid in seen:
            problems.append(f"{where}{path}.id={nid!r}: used twice; node ids must be unique")
        seen.add(str(nid))
        if not isinstance(req, str):
            problems.append(f"{where}{path}.requirements: missing or not a string")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            problems.append(f"{where}{path}.weight={weight!r}: must be an integer >= 0")
            weight = 0
        if not isinstance(subs, list):
            problems.append(f"{where}{path}.sub_tasks: must be a list")
            subs = []
        children = tuple(c for i, s in enumerate(subs) if (c := walk(s, f"{path}.sub_tasks[{i}]", depth + 1)))
        category = d.get("task_category")
        if not subs and category not in CATEGORIES:
            problems.append(f"{where}{path}.task_category={category!r}: a leaf needs one of {list(CATEGORIES)}")
        return Node(str(nid), str(req or ""), int(weight), children, category if not subs else None, depth)

    root = walk(data, "", 0)
    if problems or root is None:
        raise ValueError("; ".join(problems) or f"{where}: empty")
    return root


@dataclass
class Plan:
    """The tree a rollout is graded on and how it was cut: ``mode``, ``max_depth``
    (nodes at that depth graded as one leaf), ``max_leaves`` (a seeded sample; the other
    leaves are not graded and their weight is reported as ungraded)."""

    tree: Node | None
    mode: str
    max_depth: int | None
    max_leaves: int | None
    leaves_in_mode: int
    sampled: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_depth": self.max_depth, "max_leaves": self.max_leaves,
                "leaves_in_mode": self.leaves_in_mode, "leaves_graded": len(self.sampled)}


def select(root: Node, *, mode: str = "codedev", max_depth: int | None = None, max_leaves: int | None = None,
           seed: str = "") -> Plan:
    """The grading plan (see :class:`Plan`). The leaf sample is drawn with ``seed`` (the
    task id), so every rollout of a task is graded on the same leaves."""
    keep = MODES[mode]

    def prune(n: Node) -> Node | None:
        if n.is_leaf:
            return n if n.category in keep else None
        kids = tuple(c for c in (prune(c) for c in n.sub_tasks) if c is not None)
        return replace(n, sub_tasks=kids) if kids else None

    def cap(n: Node) -> Node:
        if n.is_leaf:
            return n
        if max_depth is not None and n.depth >= max_depth:
            # Graded as one requirement: its own text and every requirement below it.
            text = "\n".join([n.requirements] + [f"- {lf.requirements}" for lf in n.leaves()])
            cats = {lf.category for lf in n.leaves()}
            return replace(n, requirements=text, sub_tasks=(), category=cats.pop() if len(cats) == 1 else "mixed")
        return replace(n, sub_tasks=tuple(cap(c) for c in n.sub_tasks))

    tree = prune(root)
    tree = cap(tree) if tree is not None else None
    leaves = tree.leaves() if tree is not None else []
    ids = [lf.id for lf in leaves]
    if max_leaves is not None and len(ids) > max_leaves:
        ids = sorted(random.Random(f"paperbench:{seed}").sample(ids, max_leaves), key=ids.index)
    return Plan(tree, mode, max_depth, max_leaves, len(leaves), ids)


def aggregate(tree: Node, verdicts: Mapping[str, Mapping[str, Any]], *, judge_failures: str = "zero") -> dict[str, Any]:
    """The graded tree and its score. ``verdicts``: leaf id -> ``{"score": 0|1, "reason"}``
    or ``{"error": why}`` (a judge failure); a leaf with no verdict was not sampled and is
    left out, its weight reported as ungraded. Under ``zero`` a failed leaf scores 0; under
    ``drop`` it is left out like an unsampled one. ``score`` is the root's weighted average;
    ``graded_weight_fraction`` the share of the root's weight (through the tree) that the
    score rests on; ``categories`` the weighted average per leaf category."""
    if judge_failures not in JUDGE_FAILURES:
        raise ValueError(f"judge_failures={judge_failures!r}: choose one of {JUDGE_FAILURES}")
    per_cat: dict[str, list[float]] = {}

    def walk(n: Node, share: float) -> tuple[dict[str, Any], float | None, float]:
        """(graded node, its score or None when nothing under it counts, counted share)."""
        if n.is_leaf:
            v = verdicts.get(n.id)
            out: dict[str, Any] = {"id": n.id, "weight": n.weight, "category": n.category,
                                   "requirements": n.requirements[:2000]}
            if v is None:
                out["status"] = "not_sampled"
                return out, None, 0.0
            if v.get("error"):
                out.update(status="judge_failed", error=str(v["error"])[:1000])
                if judge_failures == "drop":
                    return out, None, 0.0
                score = 0.0
            else:
                score = float(v["score"])
                out.update(status="graded", reason=str(v.get("reason", ""))[:2000])
            out["score"] = score
            acc = per_cat.setdefault(str(n.category), [0.0, 0.0])
            acc[0] += share * score
            acc[1] += share
            return out, score, share
        total = sum(c.weight for c in n.sub_tasks)
        kids, num, den, counted = [], 0.0, 0, 0.0
        for c in n.sub_tasks:
            child_share = share * (c.weight / total) if total else 0.0
            g, s, cs = walk(c, child_share)
            kids.append(g)
            counted += cs
            if s is not None:
                num += c.weight * s
                den += c.weight
        has_any = any(k.get("score") is not None for k in kids)
        score = (num / den if den else 0.0) if has_any else None
        return ({"id": n.id, "weight": n.weight, "score": score, "requirements": n.requirements[:2000],
                 "sub_tasks": kids}, score, counted)

    graded, score, counted = walk(tree, 1.0)
    return {"score": float(score or 0.0), "graded_weight_fraction": round(counted, 6), "judge_failures": judge_failures,
            "categories": {k: (v[0] / v[1] if v[1] else None) for k, v in sorted(per_cat.items())}, "tree": graded}
