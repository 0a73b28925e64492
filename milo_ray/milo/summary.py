"""The end of a MILO run: final test evaluation of the best harness(es) and the
summary dict the entry point prints and stores in the manifest.

The final evaluation is outside the search budget: it runs on the same scheduler
(same store, same cache) with ``count_budget=False``, so it is neither refused by nor
charged to the search's ledger and the manifest reports the search's own spending.
"""

from __future__ import annotations

import asyncio
from typing import Any

from milo_ray.milo.events import Summarized
from milo_ray.milo.island import Island
from milo_ray.milo.island_actor import ask
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.view import PopulationView
from milo_ray.search.final_test import FinalTest, true_score
from milo_ray.search.plugin import SPEC_KEY


def _true(run: PopulationView, h: Any) -> float | None:
    return true_score(run.ctx.benchmark, h, run.cfg.test_split)


async def final_summary(run: PopulationView, stop_reason: str) -> dict[str, Any]:
    cfg, st, sched = run.cfg, run.state, run.ctx.scheduler
    used = int(sched.budget.executions_used)
    islands: dict[str, Any] = {}
    bests: list[tuple[float, float, int, LineageNode]] = []
    order = sorted(st.islands)
    answers = await asyncio.gather(*(ask(st.islands[j], Island.best) for j in order),
                                   *(ask(st.islands[j], Island.status) for j in order))
    best_of, status_of = dict(zip(order, answers[:len(order)])), dict(zip(order, answers[len(order):]))
    for j in order:
        b = best_of[j]
        rounds, stall = status_of[j]
        entry: dict[str, Any] = {"mutator": st.assignment.get(j), "rounds": rounds, "stall": stall}
        if b is not None:
            entry.update(best_node=b.node_id, harness_id=b.harness_id, search_accuracy=b.accuracy,
                         heldout_accuracy=b.val_accuracy, output_tokens=b.costs.get("output_tokens"),
                         seconds=b.costs.get("seconds"), harness_path=b.harness_path,
                         true_quality=_true(run, run.harness(b)))
            bests.append((-1.0 if b.val_accuracy is None else b.val_accuracy, b.accuracy or 0.0, j, b))
        islands[str(j)] = entry
    bests.sort(key=lambda t: (-t[0], -t[1], t[2]))
    final: list[dict[str, Any]] = []
    final_test = FinalTest(sched, run.ctx.benchmark, split=cfg.test_split, k=cfg.k_test, seed=run.ctx.seed,
                           method="milo", stage="final", group="final")
    for val, acc, j, b in bests[: cfg.final_candidates]:
        for sc in await final_test.arows([(f"island-{j}:{b.node_id}", run.harness(b))], round=status_of[j][0]):
            final.append({"island": j, "node_id": b.node_id, **sc.as_dict()})
    seed_true = {h.name or h.harness_id: _true(run, h) for h in run.seeds}
    best = bests[0][3] if bests else None
    summary = {
        "method": "milo",
        "islands": islands,
        "best": None if best is None else {
            "island": best.island, "node_id": best.node_id, "harness_id": best.harness_id,
            "search_accuracy": best.accuracy, "heldout_accuracy": best.val_accuracy,
            "output_tokens": best.costs.get("output_tokens"), "seconds": best.costs.get("seconds"),
            "true_quality": _true(run, run.harness(best)),
        },
        "final_test": final,
        # The same harnesses over the test tasks the search never ran (empty: all were).
        "final_test_held_out": [{"island": row["island"], "node_id": row["node_id"], **sc.as_dict()}
                                for row, sc in zip(final, final_test.held_out)],
        SPEC_KEY: final_test.record(),
        "seeds_true_quality": seed_true,
        "best_seed_true_quality": max((v for v in seed_true.values() if v is not None), default=None),
        "executions_used": used,
        "stop_reason": stop_reason,
        "curriculum_version": st.version,
        "n_islands": len(st.islands),
        "assignment": {str(j): m for j, m in st.assignment.items()},
        "interventions": len(st.decisions),
        "spend_by_role": run.ctx.agent_calls.by_role(),
    }
    run.emit(Summarized(summary), once=run.ctx.resumed)
    return summary
