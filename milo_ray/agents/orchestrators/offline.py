"""The offline MILO orchestrator: explicit, deterministic rules standing in for the
LLM orchestrator agent (papers/000 §4.1.3, App. C.2).

Owns :class:`OfflineOrchestrator`. Phase 1 (:meth:`decide`) reads the population
snapshot markdown plus a structured ``state`` and returns a decision in the schema of
:mod:`milo_ray.agents.orchestrators.schema`. Phase 2 (:meth:`graft`) writes a Graft
child: the destination island's best harness with the donor's distinct mechanisms
added. The four diagnoses, checked in this order for the stalled island j*:

1. *whole-population plateau*: every island's best search accuracy lies within
   ``plateau_tol`` of the others -> Curriculum toward high-regret tasks (plus a Graft
   from the most behaviorally different island when it solves tasks j* fails);
2. *exhausted lineage*: j* admitted nothing in its last ``window`` children while another
   island's best solves at least ``min_tasks`` tasks j*'s best fails -> Graft(donor -> j*);
3. *crowded-out niche*: a non-root harness of j* solves at least ``min_tasks`` tasks its
   island's best fails -> Speciate it under the least-used other mutator;
4. *dry mutator* (default): Reassign j* to the pool mutator with the best admission
   record that it does not already use.

When j*'s recent children are mostly rejected or repeat an already-rejected mutation
(read from the snapshot's ``mutation:``/``verdict:`` lines) and the primary move is not
already a Reassign, a Reassign is added as the second move. Never more than
``state["max_moves"]`` moves.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

import numpy as np

from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.llm.usage import AgentReply, AgentUsage
from milo_ray.harness.mechanisms import add_mechanism, detect_mechanisms
from milo_ray.harness.model import Harness

_NODE_LINE = re.compile(r"- \[(?P<node>[^\]]+)\].*?mutation: (?P<label>.*?) \| verdict: (?P<verdict>admitted|rejected)")
_ISLAND_HEAD = re.compile(r"^#+ Island (?P<island>\d+)\b")


def parse_snapshot(markdown: str) -> dict[int, list[dict[str, Any]]]:
    """Child node lines per island: node id, mutation label and verdict, in tree order."""
    out: dict[int, list[dict[str, Any]]] = {}
    current: int | None = None
    for line in markdown.splitlines():
        m = _ISLAND_HEAD.match(line.strip())
        if m and "summary" not in line:
            current = int(m.group("island"))
            out.setdefault(current, [])
            continue
        m = _NODE_LINE.search(line)
        if m and current is not None:
            out[current].append(
                {"node": m.group("node"), "mutation": m.group("label").strip(), "admitted": m.group("verdict") == "admitted"}
            )
    return out


class OfflineOrchestrator:
    """Rule-based orchestrator; every threshold below is a constructor argument."""

    name = "offline-orchestrator"

    def __init__(self, plateau_tol: float = 0.03, window: int = 3, min_tasks: int = 2,
                 solve_margin: float = 0.5, graft_max_mechanisms: int = 2) -> None:
        self.plateau_tol = float(plateau_tol)
        self.window = int(window)
        self.min_tasks = int(min_tasks)
        self.solve_margin = float(solve_margin)
        self.graft_max_mechanisms = int(graft_max_mechanisms)

    # --- phase 1: diagnose and intervene ---------------------------------------------------
    def decide(self, snapshot_markdown: str, state: dict[str, Any], seed: int) -> AgentReply[dict[str, Any]]:
        t0 = time.perf_counter()
        decision = self._decision(snapshot_markdown, state, seed)
        return AgentReply(decision, AgentUsage(cost_usd=0.0, seconds=time.perf_counter() - t0))

    def _decision(self, snapshot_markdown: str, state: dict[str, Any], seed: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        islands = {int(s["island"]): s for s in state["islands"]}
        j = int(state["trigger"])
        me = islands[j]
        max_moves = int(state.get("max_moves", 2))
        assignment = {int(k): v for k, v in state["assignment"].items()}
        pool = list(state["pool"])
        parsed = parse_snapshot(snapshot_markdown).get(j, [])
        dry, dry_why = self._looks_dry(me, parsed)
        best = me.get("best") or {}
        best_beh = best.get("behavior") or {}

        decision: dict[str, Any] = {"diagnosis": "", "kind": None, "loci": [], "reassign": [], "recombine": [],
                                    "speciate": [], "curriculum": None}
        bests = {i: (s.get("best") or {}).get("accuracy") for i, s in islands.items()}
        accs = [a for a in bests.values() if a is not None]
        donor, donor_tasks = self._best_donor(j, islands, best_beh)

        if len(islands) >= 2 and len(accs) == len(islands) and max(accs) - min(accs) <= self.plateau_tol:
            decision["kind"] = "population_plateau"
            cur = self._curriculum(state, rng)
            parts = [f"All {len(islands)} islands' best search accuracies lie within "
                     f"{max(accs) - min(accs):.3f} (<= {self.plateau_tol}) of each other: the population has "
                     "hit one ceiling."]
            if cur is not None:
                decision["curriculum"] = cur
                decision["loci"].append("curriculum")
                parts.append(f"Refocusing B_search on {len(cur['tasks'])} tasks led by the high-regret ones.")
            if donor is not None and len(donor_tasks) >= 1 and self._moves(decision) < max_moves:
                decision["recombine"].append({"dest_island": j, "donor_island": donor,
                                              "why": f"island {donor} solves {', '.join(donor_tasks[:5])} which island {j} fails"})
                decision["loci"].append("structure")
                parts.append(f"Island {donor} still solves {len(donor_tasks)} tasks island {j} fails; graft it.")
            decision["diagnosis"] = " ".join(parts)
        elif donor is not None and len(donor_tasks) >= self.min_tasks and not self._recently_admitted(me):
            decision["kind"] = "exhausted_lineage"
            decision["recombine"].append({"dest_island": j, "donor_island": donor,
                                          "why": f"island {donor} solves {', '.join(donor_tasks[:5])} which island {j} fails"})
            decision["loci"].append("structure")
            decision["diagnosis"] = (f"Island {j} admitted no child in its last {self.window} attempts, while island "
                                     f"{donor}'s best solves {len(donor_tasks)} tasks island {j}'s best fails "
                                     f"(e.g. {', '.join(donor_tasks[:3])}): the lineage is exhausted; graft the donor's "
                                     "mechanisms into it.")
        else:
            niche = self._niche(me, best)
            if niche is not None:
                node, tasks = niche
                mu = self._fresh_mutator(pool, assignment, state, exclude=assignment.get(j), rng=rng)
                decision["kind"] = "crowded_out_niche"
                decision["speciate"].append({"from_island": j, "harness_id": node, "mutator": mu,
                                             "why": f"{node} solves {', '.join(tasks[:5])} which the island's best fails"})
                decision["loci"].append("structure")
                decision["diagnosis"] = (f"In island {j}, harness {node} solves {len(tasks)} tasks the island's best "
                                         f"[{best.get('node_id')}] fails, but selection favors the majority lineage: a "
                                         "crowded-out niche; give it its own island.")
            else:
                decision["kind"] = "dry_mutator"
                decision["diagnosis"] = (f"Island {j}'s mutator {assignment.get(j)!r} is the bottleneck: {dry_why}; no other "
                                         "island holds a capability this island lacks and no distinct niche exists "
                                         "inside it. Reassign a different mutator.")
        if decision["kind"] == "dry_mutator" or (dry and self._moves(decision) < max_moves):
            alt = self._fresh_mutator(pool, assignment, state, exclude=assignment.get(j), rng=rng)
            if alt is not None and alt != assignment.get(j):
                decision["reassign"].append({"island": j, "mutator": alt, "why": dry_why})
                decision["loci"].append("variation")
                if decision["kind"] != "dry_mutator":
                    decision["diagnosis"] += f" Also, the mutator looks dry ({dry_why}): reassign island {j} to {alt}."
        decision["loci"] = sorted(set(decision["loci"]))
        return decision

    @staticmethod
    def _moves(d: dict[str, Any]) -> int:
        return (1 if d["reassign"] else 0) + len(d["recombine"]) + len(d["speciate"]) + (1 if d["curriculum"] else 0)

    def _looks_dry(self, me: dict[str, Any], parsed: list[dict[str, Any]]) -> tuple[bool, str]:
        recent_start = max(0, len(parsed) - self.window)
        rejected_before: set[str] = set()
        repeats = []
        for i, p in enumerate(parsed):
            if i >= recent_start and p["mutation"] in rejected_before:
                repeats.append(p["mutation"])
            if not p["admitted"]:
                rejected_before.add(p["mutation"])
        if repeats:
            return True, f"it repeats an already-rejected edit ({repeats[0]!r})"
        recent = parsed[recent_start:] or [{"admitted": r["admitted"]} for r in (me.get("recent") or [])[-self.window:]]
        rejected = [p for p in recent if not p["admitted"]]
        if recent and len(rejected) * 2 > len(recent):
            return True, f"{len(rejected)} of its last {len(recent)} children were rejected"
        return False, "its recent children did not move the held-out score"

    def _recently_admitted(self, me: dict[str, Any]) -> bool:
        return any(r["admitted"] for r in (me.get("recent") or [])[-self.window:])

    def _best_donor(self, j: int, islands: dict[int, dict[str, Any]], best_beh: dict[str, float]) -> tuple[int | None, list[str]]:
        best_i, best_tasks = None, []
        for i, s in sorted(islands.items()):
            if i == j or not s.get("best"):
                continue
            beh = s["best"].get("behavior") or {}
            tasks = sorted(t for t in beh if t in best_beh and beh[t] - best_beh[t] >= self.solve_margin)
            if len(tasks) > len(best_tasks):
                best_i, best_tasks = i, tasks
        return best_i, best_tasks

    def _niche(self, me: dict[str, Any], best: dict[str, Any]) -> tuple[str, list[str]] | None:
        best_beh = best.get("behavior") or {}
        found = None
        for n in me.get("nodes") or []:
            if n.get("is_root") or n["node_id"] == best.get("node_id"):
                continue
            tasks = sorted(t for t, v in (n.get("behavior") or {}).items()
                           if t in best_beh and v - best_beh[t] >= self.solve_margin)
            if len(tasks) >= self.min_tasks and (found is None or len(tasks) > len(found[1])):
                found = (n["node_id"], tasks)
        return found

    @staticmethod
    def _fresh_mutator(pool: list[str], assignment: dict[int, str], state: dict[str, Any], *, exclude: str | None,
                       rng: np.random.Generator) -> str | None:
        cands = [m for m in pool if m != exclude]
        if not cands:
            return None
        stats = state.get("mutator_stats") or {}
        used = Counter(assignment.values())

        def rate(m: str) -> float:
            s = stats.get(m) or {}
            return (s.get("admitted", 0) + 1) / (s.get("children", 0) + 2)  # Laplace: untried mutators get 0.5

        key = {m: (rate(m), -used[m], float(rng.random())) for m in cands}
        return max(cands, key=lambda m: key[m])

    def _curriculum(self, state: dict[str, Any], rng: np.random.Generator) -> dict[str, Any] | None:
        current = list(state["search_tasks"])
        pool = list(state.get("task_pool") or current)
        regret = state.get("regret") or {}
        size = len(current)
        high = sorted((t for t in current if regret.get(t, 0.0) > 1e-9), key=lambda t: (-regret[t], t))
        unused = [t for t in pool if t not in set(current)]
        rng.shuffle(unused)
        rest = [t for t in current if t not in set(high)]
        rng.shuffle(rest)
        tasks = (high + unused + rest)[:size]
        if set(tasks) == set(current):
            return None
        return {"tasks": tasks, "why": f"{len(high)} high-regret tasks kept, {len([t for t in tasks if t in unused])} "
                                      "unused search tasks added, trivial/impossible ones dropped"}

    # --- phase 2: write the Graft child --------------------------------------------------
    def graft(self, request: MutationRequest) -> MutationResult:
        """Merge the donor's distinct mechanisms into the destination's best harness.

        ``request.parent`` is the destination island's best; ``request.context`` holds
        ``co_parent_source`` (the donor's best ``harness.py``) and ``donor_island``.
        """
        donor_src = request.context.get("co_parent_source")
        if not donor_src:
            return MutationResult(None, error="graft: request.context['co_parent_source'] is missing")
        mine = detect_mechanisms(request.parent.source)
        theirs = detect_mechanisms(donor_src)
        distinct = [m for m in sorted(theirs) if m not in mine][: self.graft_max_mechanisms]
        if not distinct:
            return MutationResult(None, error="graft: the donor has no mechanism the destination lacks")
        src = request.parent.source
        for m in distinct:
            try:
                src = add_mechanism(src, m, **(theirs[m] or {}))
            except Exception as e:  # a mechanism that does not compose is a failed graft, not a crash
                return MutationResult(None, error=f"graft: adding {m} failed: {e}")
        label = f"graft {', '.join(distinct)} from island {request.context.get('donor_island', '?')}"
        return MutationResult(request.parent.with_source(src), report=label)
