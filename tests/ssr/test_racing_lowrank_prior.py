"""lowrank with earlier races' matrices: prior rows sharpen the fit's task side (a
rank-2 interaction three runners cannot separate), never make decisions themselves, and
reach the rule through the Race and the audit's stepwise replay."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.audit_regimes import synthetic_matrix
from milo_ray.ssr.audit_replay import RuleSpec, permutations, replay_rule
from milo_ray.ssr.racing import Race, RaceCandidate, RaceConfig
from milo_ray.ssr.racing_lowrank import LowRankRacing, lowrank_fit, lowrank_fit_missing
from milo_ray.ssr.racing_view import StageView

N = 16


def _rank2_case(seed: int = 0):
    """Two children and the parent on 16 tasks with a rank-2 interaction; c1 is 0.08
    behind c0. Six earlier harnesses share the interaction's task factors."""
    t = np.arange(N)
    v1, v2 = np.where(t % 2 == 0, 1.0, -1.0), np.where((t // 2) % 2 == 0, 1.0, -1.0)
    rng = np.random.default_rng(seed)

    def noise():
        return rng.normal(0, 0.01, N)

    rows = {"c0": 0.5 + 0.2 * v1 + 0.2 * v2 + noise(), "c1": 0.42 - 0.2 * v1 + 0.2 * v2 + noise(),
            "parent": 0.45 + 0.2 * v1 - 0.2 * v2 + noise()}
    prior = {f"g{j}": 0.5 + rng.normal(0, 0.2) * v1 + rng.normal(0, 0.2) * v2 + noise() for j in range(6)}
    return rows, prior


def _view(rows, prior):
    return StageView(1, 4, 2, ("c0", "c1"), "parent", tuple(f"t{j}" for j in range(N)), rows,
                     {h: float(r.mean()) for h, r in rows.items()}, prior)


def test_earlier_matrices_let_lowrank_separate_what_the_race_alone_cannot():
    rows, prior = _rank2_case()
    rule = LowRankRacing(rank=2)
    assert rule.after_stage(_view(rows, {})).keep == ("c0", "c1")
    assert rule.after_stage(_view(rows, prior)).keep == ("c0",)
    assert LowRankRacing(rank=2, prior=False).after_stage(_view(rows, prior)).keep == ("c0", "c1")


def test_prior_rows_never_make_decisions():
    rows, prior = _rank2_case(1)
    prior["g_best"] = np.ones(N)  # an earlier harness far ahead of every child: not a child
    keep = LowRankRacing(rank=2).after_stage(_view(rows, prior)).keep
    assert set(keep) <= {"c0", "c1"} and "c0" in keep


def test_missing_cells_fit_like_the_complete_matrix_when_nothing_is_missing():
    y = np.random.default_rng(2).random((5, 9))
    for a, b in zip(lowrank_fit(y, 1), lowrank_fit_missing(y, 1)):
        assert np.allclose(a, b)
    y[3, 2] = np.nan
    pred, resid = lowrank_fit_missing(y, 1)
    assert np.isfinite(pred).all() and resid[3, 2] == 0.0


def test_race_shows_the_rule_earlier_harnesses_on_the_tasks_raced():
    seen = []

    class Spy:
        name = "spy"

        def after_stage(self, view):
            seen.append({h: list(v) for h, v in view.prior.items()})
            return type("D", (), {"keep": view.ranked, "stop": False})()

    cands = [RaceCandidate("a", 0, ()), RaceCandidate("b", 1, ())]
    prior = {"old": {"v0": 1.0, "v1": 0.0}, "a": {"v0": 0.5}, "never": {"zz": 1.0}}
    race = Race("p", cands, order=[], parent_success=[], parent_failure=[], validation=["v0", "v1", "v2", "v3"],
                config=RaceConfig(2, (2, 2), 0, 0, 1), rng=np.random.default_rng(0), rule=Spy(), prior=prior)
    race.run(lambda h, t, i: 0.5)
    # Only earlier harnesses that ran a raced task; the race's own runners are not prior rows.
    assert list(seen[0]) == ["old"]
    tasks = race.reports[0].cumulative_tasks
    assert len(seen[0]["old"]) == tasks


def test_audit_prior_needs_a_history_and_uses_it():
    m = synthetic_matrix("wide", seed=3, children=4, tasks=40, history=0)
    perms = permutations(40, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="history"):
        replay_rule(m.rewards, RuleSpec("lr+prior", "lowrank", prior=True), 200, perms)
    h = synthetic_matrix("wide", seed=3, children=4, tasks=40).history
    out = replay_rule(m.rewards, RuleSpec("lr+prior", "lowrank", prior=True), 200, perms, history=h)
    assert (out.executions <= 200).all()
