"""The racing audit replays selection on a fixed matrix within the budget and reports,
per rule and budget level, the selected quality, its gap to the full-matrix best and
the cost actually spent."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.audit import RewardMatrix, audit, matrix_from_rollouts, racing_batch_size, replay


def _matrix(seed=0, H=13, T=160, R=2):
    rng = np.random.default_rng(seed)
    p = np.clip(rng.normal(0.55, 0.08, size=H), 0.05, 0.95)
    rewards = (rng.random((H, T, R)) < p[:, None, None]).astype(float)
    return RewardMatrix(tuple(f"h{i}" for i in range(H)), tuple(f"x{t}" for t in range(T)), rewards)


def test_replays_stay_within_budget_and_select_a_real_harness():
    m = _matrix()
    for rule in ("racing", "uniform"):
        for f in (0.2, 0.4, 0.6):
            r = replay(m, f, rule, seed=1)
            assert r["executions"] <= f * m.full_cost
            assert r["selected"] in m.harness_ids


def test_racing_batch_size_for_twelve_children():
    m = _matrix()
    # 13 harnesses in stage 1, 7 in stage 2, R=2: 40 executions per batch task
    assert racing_batch_size(m, 1664, 2) == 41


def _hand_matrix():
    """Parent p and children a-d on 10 tasks, R = 2. Each harness scores the same on
    every task (its two rollouts may differ), so any task subset gives the full-matrix
    mean and every replay selects the same harness: the audit's numbers follow by hand.
    Full-matrix means: p 0.5, a 0.5, b 0.6, c 0.7, d 0.2; full cost 5 x 10 x 2 = 100."""
    per_rollout = {"p": (0.5, 0.5), "a": (1.0, 0.0), "b": (0.6, 0.6), "c": (0.9, 0.5), "d": (0.2, 0.2)}
    rewards = np.array([[list(r)] * 10 for r in per_rollout.values()])
    return RewardMatrix(tuple(per_rollout), tuple(f"x{t}" for t in range(10)), rewards)


def test_audit_reports_each_rules_selection_gap_and_cost_on_a_hand_computed_matrix():
    m = _hand_matrix()
    rows = audit(m, fractions=(0.1, 0.4), replays=3)
    by = {(r["fraction"], r["rule"]): r for r in rows}
    assert set(by) == {(0.1, "racing"), (0.1, "uniform"), (0.4, "racing"), (0.4, "uniform")}
    for r in rows:
        assert r["full_matrix_best"] == pytest.approx(0.7)  # c
        assert r["parent_quality"] == pytest.approx(0.5)
        assert r["gap"] == pytest.approx(r["full_matrix_best"] - r["selected_quality"])
        assert r["cost_fraction"] == pytest.approx(r["executions"] / 100)
    # Racing, M = 4, K = 2: stage 1 runs 4 children + parent, stage 2 the n_1 = 2 kept
    # + parent, so one batch task costs R * (5 + 3) = 16 executions.
    # 10% = 10 executions: not one task per stage fits, no stage runs, the parent stays.
    assert (by[(0.1, "racing")]["batch"], by[(0.1, "racing")]["executions"]) == (0, 0.0)
    assert by[(0.1, "racing")]["selected_quality"] == pytest.approx(0.5)
    assert by[(0.1, "racing")]["gap"] == pytest.approx(0.2)
    # Uniform: one task costs R * 5 = 10, so 10% buys 1 task and finds c.
    assert (by[(0.1, "uniform")]["batch"], by[(0.1, "uniform")]["executions"]) == (1, 10.0)
    assert by[(0.1, "uniform")]["selected_quality"] == pytest.approx(0.7)
    assert by[(0.1, "uniform")]["gap"] == pytest.approx(0.0)
    # 40% = 40 executions: racing b = 40 // 16 = 2 tasks per stage; stage 1 costs
    # 5 * 2 * 2 = 20, keeps b and c (a and d score lowest), stage 2 costs 3 * 2 * 2 = 12.
    assert (by[(0.4, "racing")]["batch"], by[(0.4, "racing")]["executions"]) == (2, 32.0)
    assert by[(0.4, "racing")]["cost_fraction"] == pytest.approx(0.32)
    assert by[(0.4, "racing")]["selected_quality"] == pytest.approx(0.7)
    # Uniform: 40 // 10 = 4 tasks for everyone, all of the budget.
    assert (by[(0.4, "uniform")]["batch"], by[(0.4, "uniform")]["executions"]) == (4, 40.0)
    assert by[(0.4, "uniform")]["selected_quality"] == pytest.approx(0.7)


def test_a_child_that_only_ties_the_parent_is_not_selected():
    # a's full-matrix mean equals the parent's (0.5): selection needs a strictly higher score.
    m = _hand_matrix()
    ties = RewardMatrix(m.harness_ids[:2], m.task_ids, m.rewards[:2])
    for rule in ("racing", "uniform"):
        r = replay(ties, 1.0, rule, seed=0)
        assert r["selected"] == "p" and r["executions"] > 0, rule


def test_matrix_from_rollouts_keeps_the_complete_sub_matrix():
    rows = []
    for h in ("p", "a", "b"):
        for t in range(12):
            for i in range(2):
                rows.append({"harness_id": h, "task_id": f"t{t}", "rollout_idx": i, "score": float((t + i) % 2)})
    rows.append({"harness_id": "c", "task_id": "t0", "rollout_idx": 0, "score": 1.0})  # incomplete harness
    m = matrix_from_rollouts(rows, rollouts=2, parent="p", min_tasks=10)
    assert m.harness_ids[0] == "p" and set(m.harness_ids) == {"p", "a", "b"}
    assert m.rewards.shape == (3, 12, 2)


# --- the audit's task set (papers/002 §6.5: disjoint from candidate generation and test) ----

def test_generated_audit_matrix_is_disjoint_from_test_and_training_tasks_by_default(tmp_path):
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.audit import generate_surrogate_matrix

    bench = SurrogateBenchmark("surrogate_deepswe")
    m = generate_surrogate_matrix(bench, executor=bench.executor_config(), optimizer=OfflineCandidateOptimizer(),
                                  judge=OfflineJudge(), embedder=HashingEmbedder(), workdir=tmp_path, per_scale=1,
                                  scales=(0.5, 1.0), rollouts=1)
    audit_ids = set(m.task_ids)
    assert audit_ids and not audit_ids & {t.task_id for t in bench.tasks("test")}
    assert not audit_ids & {t.task_id for t in bench.tasks("train")}
    assert audit_ids == {t.task_id for t in bench.tasks("val")}


@pytest.mark.parametrize("splits,other", [(("val", "test"), "test"), (("train",), "train")])
def test_an_audit_set_overlapping_test_or_training_tasks_is_refused(splits, other):
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.audit import audit_tasks

    with pytest.raises(ValueError, match=rf"audit_splits=.*also in the '{other}' split"):
        audit_tasks(SurrogateBenchmark("surrogate_deepswe"), splits)
