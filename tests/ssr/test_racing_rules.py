"""Every racing rule is a pure decision object on the Race: budget-gated, the parent
protected, no execution ever run twice; ``paired`` drops a clearly dominated child early
and keeps near-ties; the parent-replacement gate needs a significant paired advantage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from milo_ray.ssr.config import SSRConfig
from milo_ray.ssr.racing import (RACING_RULES, PairedElimination, Race, RaceCandidate, RaceConfig, RuleDecision,
                                 paired_t)

VAL = [f"v{i:02d}" for i in range(40)]


def _race(rule, m=4, cfg=None, seed=0):
    cands = [RaceCandidate(f"c{i}", i, ()) for i in range(m)]
    return Race("parent", cands, order=[], parent_success=[], parent_failure=[], validation=VAL,
                config=cfg or RaceConfig(8, (5,), 0, 0, 2), rng=np.random.default_rng(seed), rule=rule)


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(RACING_RULES.names),
    m=st.integers(1, 8),
    k=st.integers(1, 6),
    bv=st.integers(0, 6),
    bs=st.integers(0, 3),
    bf=st.integers(0, 3),
    r=st.integers(1, 3),
    budget=st.integers(0, 800),
    gate=st.sampled_from([None, 0.1]),
    seed=st.integers(0, 10_000),
)
def test_every_rule_stays_within_budget_never_reruns_and_protects_the_parent(name, m, k, bv, bs, bf, r, budget,
                                                                             gate, seed):
    rng = np.random.default_rng(seed)
    train = [f"t{i}" for i in range(12)]
    order = list(rng.permutation(train))
    labels = rng.random(12) < 0.5
    cands = [RaceCandidate(f"c{i}", i, tuple(order[: max(1, (i + 1) * 12 // m)]), int(rng.integers(0, 5)))
             for i in range(m)]
    rule = PairedElimination(alpha=0.2, min_tasks=2) if name == "paired" else RACING_RULES.resolve(name, key="k")
    race = Race("p", cands, order=order, parent_success=[t for t, l in zip(train, labels) if l],
                parent_failure=[t for t, l in zip(train, labels) if not l], validation=[f"v{i}" for i in range(10)],
                config=RaceConfig(k, (bv,), bs, bf, r, gate), rng=np.random.default_rng(seed), rule=rule)
    quality = {c.harness_id: float(q) for c, q in zip(cands, rng.random(m))} | {"p": 0.5}
    noise = np.random.default_rng(seed + 1)
    seen: set = set()
    left = budget
    while (req := race.next_stage(left)) is not None:
        assert req.executions == r * len(req.harnesses) * len(req.batch.tasks) <= left
        assert "p" in req.harnesses
        assert not seen & set(req.runs)
        seen |= set(req.runs)
        left -= req.executions
        race.record([(h, t, i, float(noise.random() < quality[h])) for h, t, i in req.runs])
    out = race.decision()
    assert out.executions == len(seen) <= budget
    assert not out.replaced or out.best_child_score > out.parent_score


def _dominated_rewards(h, t, i):
    """c0 fails everything; c1..c3 pass the same tasks (near-ties: c3 passes one more)."""
    j = int(t[1:])
    if h == "c0":
        return 0.0
    return 1.0 if h == "c3" and j == 0 else float(j % 3 != 0 and (i == 0 or j % 2 == 0))


def test_paired_drops_a_clearly_dominated_child_early_and_keeps_near_ties():
    race = _race(PairedElimination(alpha=0.05, min_tasks=10))
    reports = []
    left = 10_000
    while (req := race.next_stage(left)) is not None:
        reports.append(race.record([(h, t, i, _dominated_rewards(h, t, i)) for h, t, i in req.runs]))
        left -= req.executions
    assert reports[0].eliminated == ()  # 5 tasks < min_tasks: nothing tested yet
    assert reports[1].eliminated == ("c0",)  # first look at 10 tasks
    assert {c.harness_id for c in race.active} == {"c1", "c2", "c3"} and race.decision().completed_stages == 8
    assert all(r.eliminated == () for r in reports[2:])


def test_paired_stops_when_one_child_is_left():
    strong = lambda h, t, i: 1.0 if h == "c1" else float(int(t[1:]) % 4 == 0 and h != "parent")  # noqa: E731
    race = _race(PairedElimination(alpha=0.05, min_tasks=10))
    out = race.run(strong, remaining_budget=10_000)
    assert out.stop_reason == "settled" and out.completed_stages == 2 < race.config.stages
    assert out.selected == "c1" and out.executions == 2 * 5 * 5 * 2  # two stages of 5 runners × 5 tasks × R


def test_paired_leaves_a_race_stopped_by_the_budget_on_its_last_stage():
    race = _race(PairedElimination())
    # Stages 1-2: 5 runners × 5 tasks × R = 50 each; c0 is dropped, so stage 3 costs 40.
    out = race.run(_dominated_rewards, remaining_budget=50 + 50 + 39)
    assert out.stop_reason == "budget" and out.completed_stages == 2 and out.executions == 100


def test_the_replacement_gate_needs_a_significant_paired_advantage():
    # The child beats the parent on 2 of 20 tasks, ties elsewhere: higher, but not significantly.
    slight = lambda h, t, i: float(h != "parent" and int(t[1:]) in (3, 7)) + 0.0 * i  # noqa: E731
    for gate, replaced in ((None, True), (0.05, False)):
        race = _race(None, m=1, cfg=RaceConfig(2, (10,), 0, 0, 2, gate))
        assert race.run(slight).replaced is replaced, gate
    # A clear advantage passes the gate.
    clear = lambda h, t, i: float(h != "parent" and int(t[1:]) % 4 != 0)  # noqa: E731
    race = _race(None, m=1, cfg=RaceConfig(2, (10,), 0, 0, 2, 0.05))
    assert race.run(clear).replaced


def test_paired_t_handles_ties_and_constant_differences():
    assert paired_t(np.zeros(5)) == 0.0
    assert paired_t(-np.ones(5)) == -np.inf and paired_t(np.ones(5)) == np.inf
    d = np.array([1.0, -1.0, 2.0, 0.0])
    assert paired_t(d) == pytest.approx(d.mean() / (d.std(ddof=1) / 2))


class _KeepsAStranger:
    name = "stranger"

    def after_stage(self, view):
        return RuleDecision(("someone-else",))


def test_a_rule_keeping_a_child_that_is_not_racing_is_refused():
    race = _race(_KeepsAStranger(), cfg=RaceConfig(2, (3,), 0, 0, 1))
    req = race.next_stage()
    with pytest.raises(ValueError, match="racing rule 'stranger'.*not a non-empty subset"):
        race.record([(h, t, i, 0.5) for h, t, i in req.runs])


def test_every_rule_is_selectable_by_name_and_the_gate_is_validated():
    for name in ("successive_halving", "uniform", "halving", "paired"):
        assert SSRConfig(racing=name, stages=4, b_v=[5]).racing_strategy.name == name
    assert SSRConfig(racing={"_target_": "milo_ray.ssr.racing.PairedElimination", "alpha": 0.1}).racing_strategy.alpha \
        == 0.1
    with pytest.raises(ValueError, match=r"method\.replace_alpha must be in \(0, 0.5\)"):
        SSRConfig(replace_alpha=0.9)
    with pytest.raises(ValueError, match="paired alpha"):
        SSRConfig(racing={"_target_": "milo_ray.ssr.racing.PairedElimination", "alpha": 2.0})


def test_halving_keeps_half_the_generated_children_each_stage():
    race = _race(RACING_RULES.resolve("halving", key="k"), m=12, cfg=RaceConfig(4, (2,), 0, 0, 1))
    kept = []
    while (req := race.next_stage()) is not None:
        rep = race.record([(h, t, i, 0.0 if h == "parent" else int(h[1:]) / 12) for h, t, i in req.runs])
        kept.append(len(rep.survivors))
    assert kept == [6, 3, 2, 2]  # ⌈12/2⌉, ⌈12/4⌉, ⌈12/8⌉; the last stage eliminates no one
    assert {c.harness_id for c in race.active} == {"c10", "c11"}
