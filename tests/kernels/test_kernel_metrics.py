"""pass@k / PR@k / RR@k on hand-computed matrices and the task-clustered interval (MILO §5.2)."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.kernels.metrics import clustered_ci, pass_at_k, per_task, pr_at_k, rr_at_k

S = np.array([[1.0, 0.5], [0.0, 0.0], [1.0, 1.0], [0.25, 0.75]])


def test_metrics_on_a_hand_computed_matrix():
    assert pass_at_k(S) == pytest.approx(2 / 4)
    assert pr_at_k(S) == pytest.approx((1.5 + 0 + 2 + 1) / 8)
    assert rr_at_k(S) == pytest.approx(3 / 8)


def test_partial_credit_is_never_a_full_solve():
    almost = np.array([[0.999999, 0.5]])
    assert pass_at_k(almost) == 0.0 and rr_at_k(almost) == 0.0
    assert pr_at_k(almost) == pytest.approx(0.7499995)


def test_clustered_ci_hand_computed_t_interval():
    v = np.array([[0.4], [0.5], [0.6], [0.5]])
    # mean 0.5, sd = sqrt(0.02 / 3), t_{0.975, 3} = 3.182446305284263
    half = 3.182446305284263 * np.sqrt(0.02 / 3) / 2
    mean, lo, hi = clustered_ci(v)
    assert mean == pytest.approx(0.5)
    assert lo == pytest.approx(0.5 - half) and hi == pytest.approx(0.5 + half)


def test_clustered_ci_statistic_choice():
    for stat, fn in (("pass", pass_at_k), ("pr", pr_at_k), ("rr", rr_at_k)):
        mean, lo, hi = clustered_ci(S, statistic=stat)
        assert mean == pytest.approx(fn(S))
        assert 0.0 <= lo <= mean <= hi <= 1.0
    np.testing.assert_allclose(per_task(S, statistic="rr"), [0.5, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="statistic"):
        clustered_ci(S, statistic="f1")


def test_clustered_ci_brackets_the_mean_and_widens_with_level():
    rng = np.random.default_rng(4)
    for _ in range(30):
        M = np.round(rng.random((int(rng.integers(2, 40)), 5)), 1)
        for stat in ("pass", "pr", "rr"):
            m90 = clustered_ci(M, level=0.90, statistic=stat)
            m99 = clustered_ci(M, level=0.99, statistic=stat)
            assert m90[1] <= m90[0] <= m90[2]
            assert m99[1] <= m90[1] and m90[2] <= m99[2]


def test_clustering_counts_tasks_not_attempts():
    # Perfectly correlated attempts carry no more information than one attempt.
    base = np.array([[0.2], [0.9], [0.4], [0.7]])
    one = clustered_ci(base)
    five = clustered_ci(np.repeat(base, 5, axis=1))
    assert five == pytest.approx(one)


def test_clustered_ci_needs_two_tasks_and_a_valid_level():
    with pytest.raises(ValueError, match="2 tasks"):
        clustered_ci([[0.5, 1.0]])
    with pytest.raises(ValueError, match="level"):
        clustered_ci(S, level=1.0)


@pytest.mark.parametrize("bad", [[[1.5]], [[-0.1]], [[np.nan]], [[]], [0.5, 0.5]])
def test_metrics_reject_bad_score_matrices(bad):
    with pytest.raises(ValueError, match="S"):
        pr_at_k(bad)
