"""MILO as a method plugin (:mod:`milo_ray.search.plugin`): its config, roles, state
projection, live status lines, report figures, final-test setup and ablation rungs.

The live status replays the run's events through the same :class:`MiloState` the loop
uses, so the values shown are the run's own. The report section draws the figures of
:mod:`milo_ray.milo.figures`. The final test is the one the run recorded in its summary;
runs written before that record fall back to ``method.test_split`` / ``method.k_test``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from milo_ray.milo.config import MiloConfig
from milo_ray.milo.events import MILO_EVENTS, Progress
from milo_ray.milo.state import MiloState
from milo_ray.search.events import Event
from milo_ray.search.plugin import MethodPlugin, ReportSection, RoundMetrics

# The MILO ablation ladder (papers/000 App. A.5; conf/method/milo_A..E.yaml) as the method
# settings that tell its rungs apart: (mutator_mode, memory, parent_selection, islands > 1, orchestrator).
RUNGS = {
    ("one_shot", "flat", "best", False, False): "A",
    ("agentic", "flat", "best", False, False): "B",
    ("agentic", "lineage", "softmax", False, False): "C",
    ("agentic", "lineage", "softmax", True, False): "D",
    ("agentic", "lineage", "softmax", True, True): "E",
}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@dataclass
class IslandStatus:
    """One MILO island: its mutator, rounds closed, best search accuracy of its admitted
    harnesses, best held-out accuracy, and rounds without a held-out gain."""

    island: int
    mutator: str | None
    round: int
    best_search: float | None
    best_heldout: float | None
    stall: int


class MiloStatus:
    """The live MILO status: every island's line, and a closed round's metrics (one set
    per island, one run-wide set stepped by the rounds closed on any island)."""

    def __init__(self, spend: Callable[[], dict[str, float]]) -> None:
        self._spend = spend
        self.state = MiloState()
        self._closes = 0  # rounds closed on any island (Progress events)

    def observe(self, row: Mapping[str, Any]) -> list[RoundMetrics]:
        ev = MILO_EVENTS.decode_row(row)
        self.state.apply(ev)
        if not isinstance(ev, Progress):
            return []
        self._closes += 1
        isl = self.island(ev.island)
        metrics = {f"island{isl.island}/stall": float(isl.stall), f"island{isl.island}/round": float(isl.round)}
        if isl.best_search is not None:
            metrics[f"island{isl.island}/best_search_accuracy"] = isl.best_search
        if isl.best_heldout is not None:
            metrics[f"island{isl.island}/heldout_accuracy"] = isl.best_heldout
        best = self.best()
        run = {k: best[k] for k in ("best_search_accuracy", "best_heldout_accuracy") if best[k] is not None}
        t = row.get("time")
        return [RoundMetrics("milo", ev.rounds_done, metrics, t),
                RoundMetrics("milo", self._closes, {**run, "rounds_closed": float(self._closes), **self._spend()}, t)]

    def island(self, j: int) -> IslandStatus:
        st = self.state
        isl = st.islands[j]
        scored = [n.accuracy for n in isl.lineage.admitted() if n.accuracy is not None]
        best = isl.best()
        rounds, stall = st.progress.get(j, (0, 0))
        return IslandStatus(j, st.assignment.get(j), rounds, max(scored, default=None),
                            None if best is None else best.val_accuracy, stall)

    def islands(self) -> list[IslandStatus]:
        return [self.island(j) for j in sorted(self.state.islands)]

    def best(self) -> dict[str, Any]:
        rows = self.islands()
        search = [(i.best_search, i.island) for i in rows if i.best_search is not None]
        held = [(i.best_heldout, i.island) for i in rows if i.best_heldout is not None]
        s, h = max(search, default=(None, None)), max(held, default=(None, None))
        return {"best_search_accuracy": s[0], "best_search_island": s[1],
                "best_heldout_accuracy": h[0], "best_heldout_island": h[1]}

    def lines(self) -> list[str]:
        return [f"island {i.island}  mutator {i.mutator or '-'}  round {i.round}  best search "
                f"{_fmt(i.best_search)}  held-out {_fmt(i.best_heldout)}  stall {i.stall}" for i in self.islands()]

    def headline(self) -> str | None:
        if not self.state.islands:
            return None
        b = self.best()
        return (f"best held-out {_fmt(b['best_heldout_accuracy'])} (island {b['best_heldout_island']})  "
                f"search {_fmt(b['best_search_accuracy'])} (island {b['best_search_island']})")

    def rounds_done(self) -> int | None:
        progress = self.state.progress
        return min(r for r, _ in progress.values()) if progress else None


class MiloPlugin(MethodPlugin):
    name = "milo"
    method_class = "MiloMethod"
    schema = MiloConfig
    events = MILO_EVENTS

    def roles(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        # Rungs without an orchestrator (ablations A-D) need mutators only.
        return ("mutators", "orchestrator") if config.get("orchestrator", True) else ("mutators",)

    def project(self, events: Iterable[Event]) -> MiloState:
        state = MiloState()
        for e in events:
            state.apply(e)
        return state

    def status(self, spend: Callable[[], dict[str, float]]) -> MiloStatus:
        return MiloStatus(spend)

    def report_sections(self, res: Any) -> list[ReportSection]:
        from milo_ray.milo.figures import figures  # matplotlib: only when a report is drawn

        figs = figures(res)
        if not figs:
            return []
        return [ReportSection("milo-figures", "MILO search",
                              "Islands, lineage, orchestrator moves and the accuracy/cost frontier (MILO §4).", figs)]

    def test_setup(self, res: Any) -> tuple[str, int | None]:
        m = res.config.get("method") or {}
        k = m.get("k_test")
        return str(m.get("test_split") or "test"), None if k is None else int(k)

    def variant(self, config: Mapping[str, Any]) -> str | None:
        """The ablation rung (A..E) the method settings match, ``"custom"`` for none."""
        m = config.get("method") or {}
        # A strategy given as a {_target_: ...} mapping is no rung's (and not hashable).
        named = tuple(v if isinstance(v, str) else None
                      for v in (m.get("mutator_mode"), m.get("memory"), m.get("parent_selection")))
        key = (*named, int(m.get("num_islands") or 1) > 1, bool(m.get("orchestrator")))
        return RUNGS.get(key, "custom")


PLUGIN = MiloPlugin()
