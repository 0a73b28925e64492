"""The paired successive-rejects, successive-elimination bandit and low-rank rules: each
keeps its schedule or its evidence bar, never drops a child it has no evidence against,
and is selectable by ``method.racing``. (The shared budget / parent / no-rerun property
test in test_racing_rules.py covers every registered rule, these included.)"""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.config import SSRConfig
from milo_ray.ssr.racing import Race, RaceCandidate, RaceConfig
from milo_ray.ssr.racing_bandit import SuccessiveEliminationBandit, bernstein_radius, gaussian_radius
from milo_ray.ssr.racing_lowrank import LowRankRacing, lowrank_fit
from milo_ray.ssr.racing_paired import PairedSuccessiveRejects, rejects_keep
from milo_ray.ssr.racing_view import StageView

VAL = [f"v{i:03d}" for i in range(200)]


def _race(rule, m=4, cfg=None, seed=0):
    cands = [RaceCandidate(f"c{i}", i, ()) for i in range(m)]
    return Race("parent", cands, order=[], parent_success=[], parent_failure=[], validation=VAL,
                config=cfg or RaceConfig(8, (5,), 0, 0, 2), rng=np.random.default_rng(seed), rule=rule)


def _view(per_task: dict[str, np.ndarray], *, stage=1, stages=4, generated=None):
    kids = [h for h in per_task if h != "parent"]
    scores = {h: float(v.mean()) for h, v in per_task.items()}
    ranked = tuple(sorted(kids, key=lambda h: (-scores[h], h)))
    n = len(next(iter(per_task.values())))
    return StageView(stage, stages, generated or len(kids), ranked, "parent", tuple(f"t{j}" for j in range(n)),
                     per_task, scores)


def test_rejects_schedule_leaves_one_child_for_the_last_stage():
    assert [rejects_keep(12, 4, r) for r in (1, 2, 3)] == [8, 4, 1]
    assert [rejects_keep(12, 2, 1)] == [1]
    assert rejects_keep(5, 1, 1) == 5 and rejects_keep(1, 5, 2) == 1


def test_paired_rejects_rejects_the_challenger_with_the_lowest_paired_statistic():
    rng = np.random.default_rng(0)
    base = rng.random(8)
    # c1 and c2 trail the leader by the same mean (0.1); c2 does so on every task (a
    # consistent loss), c1 by a lot on two tasks (noisy): the paired rule rejects c2.
    lead = base + 0.3
    c1 = lead.copy()
    c1[:2] -= 0.4
    c2 = lead - 0.1
    view = _view({"c0": lead, "c1": c1, "c2": c2, "parent": base}, stage=1, stages=3, generated=3)
    d = PairedSuccessiveRejects(alpha=0.01, min_tasks=100).after_stage(view)
    assert d.keep == ("c0", "c1") and not d.stop  # quota: 3 − ⌈1·2/2⌉ = 2


def test_paired_rejects_drops_a_significantly_worse_child_before_its_quota():
    rng = np.random.default_rng(1)
    base = rng.random(20)
    view = _view({"c0": base, "c1": base + 0.05 * rng.normal(size=20), "c2": np.clip(base - 0.5, 0, 1),
                  "c3": base + 0.05 * rng.normal(size=20), "parent": base}, stage=1, stages=20, generated=8)
    # The quota alone keeps 8 − ⌈7/19⌉ = 7 ≥ the 4 racing: only evidence removes anyone.
    d = PairedSuccessiveRejects(alpha=0.05, min_tasks=10).after_stage(view)
    assert "c2" not in d.keep and len(d.keep) == 3
    untested = PairedSuccessiveRejects(alpha=0.05, min_tasks=30).after_stage(view)  # too few tasks to test
    assert set(untested.keep) == {"c0", "c1", "c2", "c3"}


def test_paired_rejects_races_the_last_child_against_the_parent_to_the_end():
    strong = lambda h, t, i: 1.0 if h == "c1" else float(int(t[1:]) % 3 == 0)  # noqa: E731
    race = _race(PairedSuccessiveRejects(), m=4, cfg=RaceConfig(4, (5,), 0, 0, 1))
    out = race.run(strong)
    # Stage 1: the quota rejects one; stage 2 (10 tasks, the first test) drops the two
    # that lose on every third task by evidence, before the quota would.
    assert [len(r.survivors) for r in race.reports] == [3, 1, 1, 1]
    assert out.selected == "c1" and out.completed_stages == 4 and out.stop_reason == "completed"


def test_bandit_keeps_every_child_its_bound_cannot_separate_and_drops_a_clear_loser():
    rng = np.random.default_rng(2)
    base = (rng.random(40) < 0.5).astype(float)
    flip = lambda x, p: np.where(rng.random(40) < p, 1 - x, x)  # noqa: E731
    view = _view({"c0": base, "c1": flip(base, 0.1), "c2": np.zeros(40), "parent": base}, stage=4, stages=8)
    d = SuccessiveEliminationBandit(delta=0.1).after_stage(view)
    assert d.keep == ("c0", "c1") and not d.stop
    # The finite-sample (Bernstein) bound cannot separate even c2 on 40 tasks.
    assert SuccessiveEliminationBandit(delta=0.1, bound="bernstein").after_stage(view).keep == ("c0", "c1", "c2")
    # The radius shrinks with n and grows as delta falls.
    x = rng.choice([-1.0, 0.0, 1.0], size=(1, 50))
    for radius in (bernstein_radius, gaussian_radius):
        assert radius(x, 0.01) > radius(x, 0.1) > radius(np.tile(x, 4), 0.1)


def test_bandit_stops_once_one_child_is_left():
    strong = lambda h, t, i: 1.0 if h == "c1" else float(int(t[1:]) % 5 == 0 and h != "parent")  # noqa: E731
    out = _race(SuccessiveEliminationBandit(), m=3, cfg=RaceConfig(20, (10,), 0, 0, 2)).run(strong)
    assert out.stop_reason == "settled" and out.selected == "c1" and out.completed_stages < 20


def test_lowrank_fit_removes_task_effects_and_a_rank_one_interaction():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=5), rng.normal(size=30)
    u, v = rng.normal(size=5), rng.normal(size=30)
    y = 0.5 + a[:, None] + b[None] + np.outer(u, v - v.mean())
    pred, resid = lowrank_fit(y, rank=1)
    assert np.allclose(resid, 0, atol=1e-10)
    assert np.allclose(pred, y.mean(axis=1))  # the predicted mean over the pool: row means when b, v are centred
    assert np.abs(lowrank_fit(y, rank=0)[1]).max() > 0.1  # rank 0 leaves the interaction in the residuals


def test_lowrank_drops_a_dominated_child_and_keeps_a_near_tie():
    rng = np.random.default_rng(4)
    task = rng.normal(size=30)
    noise = lambda: 0.05 * rng.normal(size=30)  # noqa: E731
    view = _view({"c0": 0.6 + task + noise(), "c1": 0.59 + task + noise(), "c2": 0.3 + task + noise(),
                  "parent": 0.5 + task + noise()})
    d = LowRankRacing(rank=1, z=2.5, min_tasks=10).after_stage(view)
    assert set(d.keep) == {"c0", "c1"} and not d.stop
    assert LowRankRacing(min_tasks=31).after_stage(view).keep == view.ranked  # too few tasks: nothing decided


@pytest.mark.parametrize("name", ["paired_rejects", "bandit", "lowrank"])
def test_each_new_rule_is_selectable_by_name(name):
    assert SSRConfig(racing=name, stages=4, b_v=[5]).racing_strategy.name == name


def test_bad_rule_parameters_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="paired_rejects alpha"):
        PairedSuccessiveRejects(alpha=0.7)
    with pytest.raises(ValueError, match="bandit delta"):
        SuccessiveEliminationBandit(delta=0)
    with pytest.raises(ValueError, match="bandit bound"):
        SuccessiveEliminationBandit(bound="hoeffding")
    with pytest.raises(ValueError, match="lowrank rank"):
        LowRankRacing(rank=-1)
