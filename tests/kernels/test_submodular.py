"""RER greedy invariants: exact naive-greedy order and the (1 - 1/e) prefix guarantee (SSR §4.1)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from milo_ray.kernels.submodular import (
    _gains,
    clipped_cosine,
    coverage_objective,
    prefix_sizes,
    rer_order,
)
from milo_ray.testing.kernel_reference import naive_greedy


def test_clipped_cosine_closed_form_and_zero_rows():
    S = clipped_cosine([[1.0, 0.0], [1.0, 1.0], [-1.0, 0.0], [0.0, 0.0]])
    c = 1 / math.sqrt(2)
    np.testing.assert_allclose(
        S, [[1, c, 0, 0], [c, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], atol=1e-15
    )


def test_coverage_objective_closed_form():
    w, q = np.array([1.0, 2.0]), np.array([1.0, 0.5])
    S = np.array([[1.0, 0.5], [0.5, 1.0]])
    assert coverage_objective([], w, q, S) == 0.0
    assert coverage_objective([0], w, q, S) == pytest.approx(math.log(2) + 2 * math.log(1.5))
    both = math.log(1 + 1 + 0.25) + 2 * math.log(1 + 0.5 + 0.5)
    assert coverage_objective([0, 1], w, q, S) == pytest.approx(both)
    assert coverage_objective([1, 0, 1], w, q, S) == pytest.approx(both)  # a set: duplicates count once
    with pytest.raises(ValueError, match="Y"):
        coverage_objective([2], w, q, S)


def test_gain_expression_equals_objective_difference(rng):
    n = 15
    S = clipped_cosine(rng.normal(size=(n, 4)))
    w, q = rng.random(n), rng.random(n)
    Y = [3, 7]
    C = q[Y] @ S[Y]
    rest = [i for i in range(n) if i not in Y]
    g = _gains(np.asarray(rest), 1.0 / (1.0 + C), w, q, S)
    direct = [coverage_objective(Y + [i], w, q, S) - coverage_objective(Y, w, q, S) for i in rest]
    np.testing.assert_allclose(g, direct, rtol=1e-9, atol=1e-12)


def test_rer_order_of_nothing_is_empty():
    out = rer_order(np.empty(0), np.empty(0), np.empty((0, 0)))
    assert out.shape == (0,) and out.dtype.kind == "i"


def test_rer_order_equals_naive_greedy_on_random_instances():
    rng = np.random.default_rng(2024)
    for t in range(60):
        n = int(rng.integers(1, 45))
        Z = rng.normal(size=(n, 6)) + (0.4 if t % 2 else 0.0)
        if n > 4 and t % 3 == 0:
            Z[2] = Z[0]  # duplicated records create exact ties
            Z[4] = Z[0]
        S = clipped_cosine(Z)
        w, q = rng.random(n), rng.random(n)
        if t % 4 == 0:
            w[:] = 0.5
            q[:] = 0.5
        np.testing.assert_array_equal(rer_order(w, q, S), naive_greedy(w, q, S))


def test_rer_order_breaks_exact_ties_by_lower_index():
    S = np.ones((5, 5))
    np.testing.assert_array_equal(rer_order(np.ones(5), np.ones(5), S), [0, 1, 2, 3, 4])
    order = rer_order(np.ones(3), np.zeros(3), np.eye(3))  # every gain is 0
    np.testing.assert_array_equal(order, [0, 1, 2])


def test_rer_order_is_a_permutation_on_a_larger_instance():
    rng = np.random.default_rng(9)
    n = 300
    S = clipped_cosine(rng.normal(size=(n, 16)) + 0.2)
    w, q = rng.random(n), rng.random(n)
    order = rer_order(w, q, S)
    assert sorted(order.tolist()) == list(range(n))
    np.testing.assert_array_equal(order[:40], naive_greedy(w, q, S)[:40])


def test_rer_order_equals_naive_greedy_when_linear_bounds_are_tight():
    # Near-parallel embeddings make the coverage grow fast, so log1p(x) ~ x and the
    # cheap linear bounds decide most rows; the order must still be the naive one.
    rng = np.random.default_rng(31)
    for shift, n in ((2.0, 150), (0.0, 120), (0.5, 200)):
        S = clipped_cosine(rng.normal(size=(n, 8)) + shift)
        w, q = rng.random(n), rng.random(n) * 3
        np.testing.assert_array_equal(rer_order(w, q, S), naive_greedy(w, q, S))


@st.composite
def instances(draw):
    n = draw(st.integers(min_value=1, max_value=10))
    seed = draw(st.integers(min_value=0, max_value=2**31 - 1))
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 3)) + draw(st.sampled_from([0.0, 0.5]))
    return rng.random(n), rng.random(n), clipped_cosine(Z)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_every_greedy_prefix_is_within_one_minus_one_over_e_of_the_best(inst):
    w, q, S = inst
    n = len(w)
    order = rer_order(w, q, S).tolist()
    for k in range(1, min(8, n) + 1):
        best = max(coverage_objective(list(Y), w, q, S) for Y in itertools.combinations(range(n), k))
        assert coverage_objective(order[:k], w, q, S) >= (1 - 1 / math.e) * best - 1e-12


def test_rer_order_rejects_bad_shapes_and_negative_weights():
    with pytest.raises(ValueError, match="S"):
        rer_order(np.ones(3), np.ones(3), np.ones((3, 2)))
    with pytest.raises(ValueError, match="q"):
        rer_order(np.ones(3), np.ones(2), np.ones((3, 3)))
    with pytest.raises(ValueError, match="w"):
        rer_order(-np.ones(2), np.ones(2), np.ones((2, 2)))


@pytest.mark.parametrize(
    "n, fractions, expected",
    [
        (80, [0.25, 0.5, 0.75, 1.0], [20, 40, 60, 80]),
        (20, [0.25, 0.5, 0.75, 1.0], [5, 10, 15, 20]),
        (10, [0.7, 1.0], [7, 10]),  # 0.7 * 10 is 7.000000000000001 in floating point
        (3, [0.25, 0.5, 0.75, 1.0], [1, 2, 3]),
        (2, [0.25, 0.5, 0.75, 1.0], [1, 2]),  # ceil gives 1, 1, 2, 2: repeated sizes kept once
        (5, [0.5], [3, 5]),  # the full set is always the last scale
        (7, [1.0, 0.25], [2, 7]),  # any input order
        (0, [0.5, 1.0], []),
    ],
)
def test_prefix_sizes_are_strictly_increasing_and_end_at_n(n, fractions, expected):
    assert prefix_sizes(n, fractions) == expected


@pytest.mark.parametrize("bad", [[0.0, 1.0], [1.5], [-0.25], []])
def test_prefix_sizes_rejects_fractions_outside_zero_one(bad):
    with pytest.raises(ValueError, match="fractions"):
        prefix_sizes(10, bad)
