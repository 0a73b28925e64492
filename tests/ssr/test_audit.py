"""The racing audit replays selection on a fixed matrix within the budget."""

from __future__ import annotations

import numpy as np

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


def test_audit_reports_both_rules_against_the_full_matrix_best():
    rows = audit(_matrix(seed=3), fractions=(0.4,), replays=3)
    by = {r["rule"]: r for r in rows}
    assert set(by) == {"racing", "uniform"}
    assert all(0 <= r["gap"] <= 1 for r in rows)


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
