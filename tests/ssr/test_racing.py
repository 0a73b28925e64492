"""Racing rules (SSR §4.3, App. 9) on hand-built rounds; no Ray, no executor."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.racing import Race, RaceCandidate, RaceConfig, UniformRace, keep_count

TRAIN = [f"t{i:02d}" for i in range(20)]
VAL = [f"v{i:02d}" for i in range(10)]


def _cands(m: int, n_train: int = 20, order=TRAIN, diff=None):
    sizes = [max(1, int(np.ceil(a * n_train))) for a in np.linspace(1 / m, 1, m)]
    return [RaceCandidate(f"c{i}", i, tuple(order[: sizes[i]]), (diff or [0] * m)[i]) for i in range(m)]


def _race(m=4, cfg=None, success=None, failure=None, order=TRAIN, val=VAL, seed=0, cls=Race, diff=None):
    success = TRAIN[::2] if success is None else success
    failure = TRAIN[1::2] if failure is None else failure
    return cls("parent", _cands(m, order=order, diff=diff), order=order, parent_success=success,
               parent_failure=failure, validation=val, config=cfg or RaceConfig(2, (3, 3), 2, 2, 2),
               rng=np.random.default_rng(seed))


def _reward_table(values: dict[str, float]):
    return lambda h, t, i: values[h]


def test_keep_counts_match_the_paper():
    assert [keep_count(4, 2, r) for r in (1,)] == [2]
    assert keep_count(12, 2, 1) == 6
    assert keep_count(1, 2, 1) == 1  # always at least one child
    assert [keep_count(6, 3, r) for r in (1, 2)] == [4, 2]


@pytest.mark.parametrize("m,k,r,kept", [(5, 2, 1, 2), (3, 2, 1, 1), (2, 4, 1, 1), (6, 4, 1, 4), (6, 4, 3, 1),
                                        (7, 2, 1, 3), (10, 4, 1, 7), (10, 4, 3, 2)])
def test_half_quotas_round_up_not_to_even(m, k, r, kept):
    # r*M/K = x.5: the arithmetic rounding removes ceil(x.5) children (banker's rounding would not).
    assert keep_count(m, k, r) == kept


@pytest.mark.parametrize("m,expected", [(4, 2), (12, 6)])
def test_intermediate_elimination_quota(m, expected):
    race = _race(m=m)
    req = race.next_stage()
    scores = {f"c{i}": i / (m + 1) for i in range(m)} | {"parent": 0.5}
    rep = race.record([(h, t, i, scores[h]) for h, t, i in req.runs])
    assert len(rep.survivors) == expected
    # the best scores survive
    assert set(rep.survivors) == {f"c{i}" for i in range(m - expected, m)}
    assert "parent" not in rep.eliminated and "parent" not in rep.survivors


def test_keep_count_is_based_on_the_children_generated_not_those_that_raced():
    # M = 4 generated, one failed validation: after stage 1 of K = 2, n_1 = 4 - 2 = 2 of the 3 survive.
    cands = _cands(4)[1:]
    race = Race("parent", cands, order=TRAIN, parent_success=TRAIN[::2], parent_failure=TRAIN[1::2],
                validation=VAL, config=RaceConfig(2, (3, 3), 2, 2, 2), rng=np.random.default_rng(0), generated=4)
    req = race.next_stage()
    scores = {"c1": 0.2, "c2": 0.4, "c3": 0.6, "parent": 0.5}
    rep = race.record([(h, t, i, scores[h]) for h, t, i in req.runs])
    assert set(rep.survivors) == {"c2", "c3"} and rep.eliminated == ("c1",)
    with pytest.raises(ValueError, match="generated=2"):
        Race("parent", cands, order=TRAIN, parent_success=[], parent_failure=[], validation=VAL,
             config=RaceConfig(2, (3, 3), 2, 2, 2), rng=np.random.default_rng(0), generated=2)


def test_batch_quotas_follow_rer_order_and_intersection_first():
    # order differs from id order; shortest prefix (25% of 20 = 5 tasks) is order[:5]
    order = TRAIN[::-1]
    race = _race(order=order, cfg=RaceConfig(2, (3, 3), 2, 2, 1))
    req = race.next_stage()
    b = req.batch
    assert len(b.validation) == 3 and len(b.success) == 2 and len(b.failure) == 2
    inter = order[:5]  # t19..t15
    succ_in_order = [t for t in order if t in set(TRAIN[::2])]
    fail_in_order = [t for t in order if t in set(TRAIN[1::2])]
    assert list(b.success) == succ_in_order[:2]
    assert list(b.failure) == fail_in_order[:2]
    assert set(b.success) | set(b.failure) <= set(inter)
    assert b.success_in_intersection == 2 and b.failure_in_intersection == 2


def test_class_falls_back_outside_intersection_in_rer_order():
    # intersection = first 5 of order; it holds only 1 parent-success task
    order = TRAIN
    success = ["t00", "t10", "t12", "t14"]
    failure = [t for t in TRAIN if t not in success]
    race = _race(order=order, success=success, failure=failure, cfg=RaceConfig(1, (0,), 3, 1, 1))
    b = race.next_stage().batch
    assert list(b.success) == ["t00", "t10", "t12"]
    assert b.success_in_intersection == 1


def test_short_class_is_not_refilled_from_the_other_class():
    success = ["t00"]
    failure = [t for t in TRAIN if t != "t00"]
    race = _race(success=success, failure=failure, cfg=RaceConfig(2, (1, 1), 3, 3, 1))
    r1 = race.next_stage()
    assert list(r1.batch.success) == ["t00"] and len(r1.batch.failure) == 3
    race.record([(h, t, i, 0.5) for h, t, i in r1.runs])
    r2 = race.next_stage()
    assert r2.batch.success == () and len(r2.batch.failure) == 3


def test_no_task_is_used_twice_in_a_round_and_validation_is_without_replacement():
    race = _race(cfg=RaceConfig(3, (4, 4, 4), 3, 3, 1))
    seen: list[str] = []
    val_seen: list[str] = []
    while (req := race.next_stage()) is not None:
        seen += list(req.batch.tasks)
        val_seen += list(req.batch.validation)
        race.record([(h, t, i, 0.5) for h, t, i in req.runs])
    assert len(seen) == len(set(seen))
    assert len(val_seen) == 10 and set(val_seen) == set(VAL)  # 4+4+2: bounded by what remains


def test_validation_sampling_depends_on_the_seed_only():
    a = _race(seed=1).next_stage().batch.validation
    b = _race(seed=1).next_stage().batch.validation
    c = [_race(seed=s).next_stage().batch.validation for s in range(2, 8)]
    assert a == b
    assert any(x != a for x in c)


def test_parent_is_never_eliminated():
    race = _race(m=4)
    # parent scores worst everywhere
    out = race.run(_reward_table({"parent": 0.0, "c0": 0.2, "c1": 0.4, "c2": 0.6, "c3": 0.8}))
    for rep in race.reports:
        assert "parent" in rep.scores
        assert "parent" not in rep.eliminated
    assert out.replaced and out.selected == "c3"


def test_child_tied_with_parent_does_not_replace_it():
    race = _race(m=4)
    out = race.run(_reward_table({"parent": 0.5, "c0": 0.5, "c1": 0.5, "c2": 0.2, "c3": 0.1}))
    assert not out.replaced and out.selected == "parent"
    assert out.best_child_score == out.parent_score


def test_ties_prefer_fewer_diff_lines_then_lower_index():
    race = _race(m=4, diff=[9, 3, 3, 1])
    req = race.next_stage()
    race.record([(h, t, i, 0.5 if h != "c3" else 0.1) for h, t, i in req.runs])
    assert race.reports[-1].survivors == ("c1", "c2")  # equal scores and diffs -> lower index first
    out = race.run(_reward_table({"parent": 0.0, "c0": 0.9, "c1": 0.7, "c2": 0.7, "c3": 0.9}))
    assert out.selected == "c1"


def test_stage_that_does_not_fit_the_budget_is_not_started():
    cfg = RaceConfig(2, (3, 3), 2, 2, 2)
    race = _race(m=4, cfg=cfg)
    need1 = 2 * 5 * 7
    assert race.next_stage(need1 - 1) is None
    out = race.decision()
    assert out.completed_stages == 0 and out.selected == "parent" and out.stop_reason == "budget"
    assert out.executions == 0


def test_budget_stop_selects_on_last_completed_stage():
    race = _race(m=4)
    scores = {"parent": 0.3, "c0": 0.1, "c1": 0.9, "c2": 0.2, "c3": 0.4}
    req = race.next_stage(10_000)
    race.record([(h, t, i, scores[h]) for h, t, i in req.runs])
    assert race.next_stage(1) is None  # stage 2 cannot fit
    out = race.decision()
    assert out.completed_stages == 1 and out.stop_reason == "budget"
    assert out.selected == "c1" and out.replaced


def test_scores_are_cumulative_and_stage_one_runs_are_not_repeated():
    race = _race(m=4)
    r1 = race.next_stage()
    race.record([(h, t, i, 1.0 if h == "c3" else 0.0) for h, t, i in r1.runs])
    r2 = race.next_stage()
    assert not set(r1.runs) & set(r2.runs)
    assert set(r2.harnesses) == {"c3", "c0", "parent"}  # c0..c2 tie at 0: lowest index
    race.record([(h, t, i, 0.0) for h, t, i in r2.runs])
    n1, n2 = len(r1.batch.tasks), len(r2.batch.tasks)
    assert race.score("c3") == pytest.approx(n1 / (n1 + n2))  # stage-1 rewards reused, equal task weights
    assert race.reports[-1].cumulative_tasks == n1 + n2


def test_record_rejects_partial_or_duplicated_stage():
    race = _race()
    req = race.next_stage()
    rows = [(h, t, i, 0.5) for h, t, i in req.runs]
    with pytest.raises(ValueError, match="do not match"):
        race.record(rows[:-1])
    with pytest.raises(ValueError, match="twice"):
        race.record(rows + rows[:1])
    race.record(rows)
    assert race.stage == 1


def test_uniform_race_never_eliminates():
    race = _race(m=4, cls=UniformRace)
    out = race.run(_reward_table({"parent": 0.0, "c0": 0.2, "c1": 0.4, "c2": 0.6, "c3": 0.8}))
    assert all(not r.eliminated for r in race.reports)
    assert len(race.reports[-1].survivors) == 4 and out.selected == "c3"


def test_duplicate_or_parent_identical_children_are_rejected():
    cfg = RaceConfig(1, (1,), 0, 0, 1)
    kw = dict(order=[], parent_success=[], parent_failure=[], validation=VAL, config=cfg,
              rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="duplicate"):
        Race("p", [RaceCandidate("a", 0, ()), RaceCandidate("a", 1, ())], **kw)
    with pytest.raises(ValueError, match="identical to the parent"):
        Race("p", [RaceCandidate("p", 0, ())], **kw)


def test_config_validates_per_stage_quotas():
    with pytest.raises(ValueError, match="b_v"):
        RaceConfig(2, (1, 2, 3))
    assert RaceConfig(3, (4,)).b_v == (4, 4, 4)
