"""The ``eval`` method as a method plugin (:mod:`milo_ray.search.plugin`): no agent
roles, no typed events, no live lines; its leaderboard is the summary's ``harnesses``
(every evaluated seed, on ``method.split``), and a comparison shows its best row.

The final test is the one the run recorded in its summary; runs written before that
record fall back to ``method.split`` and the summary's ``k`` (the completed waves).
"""

from __future__ import annotations

from typing import Any, Mapping

from milo_ray.config.schemas import EvalConfig
from milo_ray.evaluation import EVAL_EVENT_KINDS
from milo_ray.search.plugin import MethodPlugin


class EvalPlugin(MethodPlugin):
    name = "eval"
    searches = False  # it evaluates its seeds: no search, no held-out split to name
    method_class = "EvalMethod"
    schema = EvalConfig

    def owns_event(self, kind: str) -> bool:
        return kind in EVAL_EVENT_KINDS

    def summary_rows(self, summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return list(summary.get("harnesses") or [])

    def test_setup(self, res: Any) -> tuple[str, int | None]:
        m = res.config.get("method") or {}
        k = res.summary.get("k") or m.get("k")
        return str(m.get("split", "test")), None if k is None else int(k)

    def incumbent(self, final: Any) -> Any | None:
        # Every row is a seed evaluated alike: the comparison shows the best (PR@k, then order).
        return final.sort_values("pr_at_k", ascending=False, kind="stable").iloc[0] if len(final) else None


PLUGIN = EvalPlugin()
