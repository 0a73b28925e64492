"""The end of a MILO run: final test evaluation of the best harness(es) and the
summary dict the entry point prints and stores in the manifest.

The final evaluation is outside the search budget: it runs on the same scheduler
(same store, same cache) with ``count_budget=False``, so it is neither refused by nor
charged to the search's ledger and the manifest reports the search's own spending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from milo_ray.milo.evaluate import requests_for

if TYPE_CHECKING:
    from milo_ray.milo.loop import MiloRun


def _true(run: "MiloRun", h: Any) -> float | None:
    gt = run.bench
    if not hasattr(gt, "true_quality"):
        return None
    return float(gt.true_quality(h, run.cfg.test_split)["score"])


async def final_summary(run: "MiloRun") -> dict[str, Any]:
    from milo_ray.evaluation import summarize

    cfg = run.cfg
    used = int(run.sched.budget.executions_used)
    islands: dict[str, Any] = {}
    bests: list[tuple[float, float, int, dict[str, Any]]] = []
    for j in sorted(run.islands):
        b = await run.islands[j].best.remote()
        rounds, stall = run.progress[j]
        entry: dict[str, Any] = {"mutator": run.assignment.get(j), "rounds": rounds, "stall": stall}
        if b is not None:
            h = run.harness(b)
            entry.update(best_node=b["node_id"], harness_id=b["harness_id"], search_accuracy=b["accuracy"],
                         heldout_accuracy=b.get("val_accuracy"), output_tokens=b["costs"].get("output_tokens"),
                         seconds=b["costs"].get("seconds"), harness_path=b.get("harness_path"),
                         true_quality=_true(run, h))
            bests.append((-1.0 if b.get("val_accuracy") is None else b["val_accuracy"], b["accuracy"] or 0.0, j, b))
        islands[str(j)] = entry
    bests.sort(key=lambda t: (-t[0], -t[1], t[2]))
    final: list[dict[str, Any]] = []
    test_ids = [t.task_id for t in run.bench.tasks(cfg.test_split)]
    for val, acc, j, b in bests[: cfg.final_candidates]:
        h = run.harness(b)
        run.sched.add_harness(h)
        reqs = requests_for(h.harness_id, test_ids, cfg.k_test, seed=run.ctx.seed, split=cfg.test_split,
                            round=run.progress[j][0], stage="final", group="final")
        res = await run.sched.arun(reqs, count_budget=False)
        sc = summarize(f"island-{j}:{b['node_id']}", h, res, test_ids, cfg.k_test, true_score=_true(run, h))
        final.append({"island": j, "node_id": b["node_id"], **sc.as_dict()})
    seed_true = {h.name or h.harness_id: _true(run, h) for h in run.bench.seed_harnesses()}
    best = bests[0][3] if bests else None
    summary = {
        "method": "milo",
        "islands": islands,
        "best": None if best is None else {
            "island": best["island"], "node_id": best["node_id"], "harness_id": best["harness_id"],
            "search_accuracy": best["accuracy"], "heldout_accuracy": best.get("val_accuracy"),
            "output_tokens": best["costs"].get("output_tokens"), "seconds": best["costs"].get("seconds"),
            "true_quality": _true(run, run.harness(best)),
        },
        "final_test": final,
        "seeds_true_quality": seed_true,
        "best_seed_true_quality": max((v for v in seed_true.values() if v is not None), default=None),
        "executions_used": used,
        "stop_reason": run.stop_reason or "finished",
        "curriculum_version": run.version,
        "n_islands": len(run.islands),
        "assignment": {str(j): m for j, m in run.assignment.items()},
        "interventions": len(run.decisions),
    }
    run.store.event("milo.summary", summary)
    return summary
