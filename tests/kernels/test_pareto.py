"""Invariants of the pass-primary dominance, admission and selection kernels (MILO §4.2)."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.kernels.pareto import (
    admits,
    behavior_similarity,
    dominance_matrix,
    dominates,
    fitness_vectors,
    most_dissimilar,
    pareto_front,
    sample_parent,
    selection_scores,
    task_regret,
)


def test_fitness_vectors_closed_form():
    F = fitness_vectors([0.5, 1.0, 0.25], [[10e6, 3600], [30e6, 0], [0, 7200]], [20e6, 7200])
    np.testing.assert_array_equal(F, [[0.5, 0.5, 0.5], [1.0, 0.0, 1.0], [0.25, 1.0, 0.0]])


@pytest.mark.parametrize("caps", [[-1.0, 10.0], [0.0, 10.0]])
def test_fitness_vectors_rejects_non_positive_caps(caps):
    with pytest.raises(ValueError, match="caps"):
        fitness_vectors([0.5], [[1.0, 1.0]], caps)


def test_fitness_vectors_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="costs"):
        fitness_vectors([0.5, 0.6], [[1.0, 1.0]], [2.0, 2.0])
    with pytest.raises(ValueError, match="caps"):
        fitness_vectors([0.5], [[1.0, 1.0]], [2.0])


# eps = 0.25 and dyadic values keep every boundary case exact in binary floating point.
A = (0.5, 0.5, 0.5)
DOMINANCE_TABLE = [
    ((0.125, 1.0, 1.0), True),  # clearly more accurate: d = 0.375 > eps
    ((0.25, 1.0, 1.0), False),  # d = eps exactly is inside the band; not cheaper
    ((0.25, 0.25, 0.25), True),  # inside the band and strictly cheaper on every axis
    ((0.75, 0.25, 0.25), True),  # less accurate by eps but cheaper: still dominates
    ((0.75, 0.25, 0.5), False),  # a tie on one cost axis is not strictly better
    ((0.875, 0.0, 0.0), False),  # d = -0.375: outside the band on the wrong side
    (A, False),  # irreflexive
]


@pytest.mark.parametrize("b, expected", DOMINANCE_TABLE)
def test_dominates_follows_the_eps_band_table(b, expected):
    assert dominates(A, b, eps=0.25) is expected
    assert bool(dominance_matrix(np.array([A, b]), eps=0.25)[0, 1]) is expected


def test_band_without_cost_axes_never_dominates():
    assert not dominates([0.5], [0.49])
    assert dominates([0.6], [0.5])


def test_dominance_matrix_agrees_with_scalar_rule(rng):
    F = np.round(rng.random((40, 3)) * 8) / 8  # many exact ties and band cases
    D = dominance_matrix(F, eps=0.125)
    expected = np.array([[dominates(a, b, eps=0.125) for b in F] for a in F])
    np.testing.assert_array_equal(D, expected)
    assert not np.any(D & D.T), "dominance must be antisymmetric"


def test_negative_eps_is_rejected():
    with pytest.raises(ValueError, match="eps"):
        dominance_matrix(np.ones((2, 2)), eps=-0.1)
    with pytest.raises(ValueError, match="eps"):
        dominates([1, 1], [0, 0], eps=-1e-9)


def test_pareto_front_is_the_set_nobody_dominates(rng):
    F = rng.random((60, 3))
    front = pareto_front(F, eps=0.05)
    D = dominance_matrix(F, eps=0.05)
    np.testing.assert_array_equal(front, np.flatnonzero(~D.any(axis=0)))
    assert pareto_front(np.empty((0, 3))).size == 0


def test_pareto_front_small_example():
    F = [[0.9, 0.1, 0.9], [0.9, 0.9, 0.1], [0.895, 0.05, 0.05], [0.5, 1.0, 1.0]]
    # Rows 0 and 1 trade cost axes inside the band: neither dominates.  Row 2 is beaten
    # by both (band, strictly dearer); row 3 is cheaper but clearly less accurate.
    np.testing.assert_array_equal(pareto_front(F, eps=0.02), [0, 1])
    F2 = [[0.9, 0.1, 0.1], [0.89, 0.2, 0.2]]  # cheaper within the band beats more accurate
    np.testing.assert_array_equal(pareto_front(F2, eps=0.02), [1])


def test_admits_child_only_if_no_member_dominates_it():
    front = np.array([[0.8, 0.5, 0.5]])
    assert admits(np.empty((0, 3)), [0.1, 0.1, 0.1])
    assert not admits(front, [0.7, 0.9, 0.9])
    assert admits(front, [0.79, 0.6, 0.4])
    assert not admits(front, [0.79, 0.4, 0.4])
    with pytest.raises(ValueError, match="child_F"):
        admits(front, [0.5, 0.5])


def test_behavior_similarity_closed_form():
    S = behavior_similarity([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(S, [[1, 0.5, 0.5], [0.5, 1, 0], [0.5, 0, 1]])


def test_selection_scores_hand_computed():
    F = [[0.9, 0.5], [0.5, 0.5], [0.1, 0.5]]
    B = [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]
    np.testing.assert_allclose(selection_scores(F, B), [0.0, -0.5, -0.5])


def test_sample_parent_is_stable_for_huge_scores():
    rng = np.random.default_rng(0)
    assert all(sample_parent([1e300, 0.0, -1e300], temperature=1.0, rng=rng) == 0 for _ in range(20))
    assert sample_parent([-1e6, -1e6 + 50], temperature=1.0, rng=rng) == 1


def test_sample_parent_follows_the_softmax():
    rng = np.random.default_rng(7)
    eta = np.array([0.0, -1.0, -2.0])
    draws = np.bincount([sample_parent(eta, temperature=1.0, rng=rng) for _ in range(6000)], minlength=3)
    p = np.exp(eta) / np.exp(eta).sum()
    assert np.all(np.abs(draws / 6000 - p) < 0.03)


def test_sample_parent_is_deterministic_given_the_seed():
    eta = np.linspace(-1, 0, 10)
    a = [sample_parent(eta, temperature=0.5, rng=np.random.default_rng(3)) for _ in range(5)]
    b = [sample_parent(eta, temperature=0.5, rng=np.random.default_rng(3)) for _ in range(5)]
    assert a == b


@pytest.mark.parametrize("T", [0.0, -1.0, float("nan")])
def test_sample_parent_rejects_bad_temperature(T):
    with pytest.raises(ValueError, match="temperature"):
        sample_parent([0.0, 1.0], temperature=T, rng=np.random.default_rng(0))


def test_task_regret_is_max_minus_mean():
    np.testing.assert_allclose(task_regret([[1.0, 0.0, 0.5], [0.0, 0.0, 0.5]]), [0.5, 0.0, 0.0])


def test_most_dissimilar_greedy_farthest_point_rule():
    B = [[0, 0], [1, 1], [0.5, 0.5], [1, 0]]
    np.testing.assert_array_equal(most_dissimilar(B, 2), [0, 1])
    np.testing.assert_array_equal(most_dissimilar(B, 3), [0, 1, 2])  # tie at min-distance 1 -> lower index
    np.testing.assert_array_equal(most_dissimilar(B, 1), [0])  # tie on total distance -> lower index
    assert most_dissimilar(B, 0).size == 0
    with pytest.raises(ValueError, match="k"):
        most_dissimilar(B, 5)


def test_most_dissimilar_picks_distinct_rows(rng):
    B = rng.random((12, 6))
    idx = most_dissimilar(B, 12)
    assert sorted(idx.tolist()) == list(range(12))
