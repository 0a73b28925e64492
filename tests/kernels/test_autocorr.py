"""EinsteinArena scores: closed forms, AlphaEvolve constructions, FFT vs direct, gradients (MILO App. E)."""

from __future__ import annotations

import json
import math
from importlib import resources

import numpy as np
import pytest

from milo_ray.kernels.autocorr import (
    PROBLEMS,
    autoconvolution,
    erdos_overlap,
    first_autocorrelation,
    smooth_max_and_grad,
    third_autocorrelation,
    verify,
)

# Scores of AlphaEvolve's constructions by direct convolution (pinned), and the
# figures published for them: the EinsteinArena AlphaEvolve entries (10 decimals,
# MILO App. E Table 13) and the bounds quoted in MILO's main text, which round
# the upper bound up at their last digit (1.4557 for 1.45564..., 0.380924 for 0.3809230...).
PINNED = {
    "first_autocorrelation": (600, 1.5052939684401607, 1.5052939684, 1.5053),
    "third_autocorrelation": (400, 1.4556427953745410, 1.4556427954, 1.4557),
    "erdos_minimum_overlap": (95, 0.38092303510845016, 0.3809230351, 0.380924),
}


@pytest.fixture(scope="module")
def constructions():
    text = resources.files("milo_ray").joinpath("data/alphaevolve_constructions.json").read_text()
    return {k: np.asarray(v, dtype=np.float64) for k, v in json.loads(text).items()}


@pytest.mark.parametrize("problem", PROBLEMS)
def test_alphaevolve_constructions_score_as_published(constructions, problem):
    n, exact, arena, rounded = PINNED[problem]
    h = constructions[problem]
    assert h.shape == (n,)
    score = verify(problem, h)
    assert abs(score - exact) <= 1e-9
    assert round(score, 10) == arena
    decimals = len(str(rounded).split(".")[1])
    assert score <= rounded and math.ceil(score * 10**decimals) / 10**decimals == pytest.approx(rounded)
    fast = {"first_autocorrelation": first_autocorrelation, "third_autocorrelation": third_autocorrelation,
            "erdos_minimum_overlap": erdos_overlap}[problem](h)
    assert abs(fast - score) <= 1e-12 * score


def test_closed_form_scores():
    assert first_autocorrelation([1.0]) == 2.0
    assert first_autocorrelation([1.0, 1.0]) == pytest.approx(2.0)  # 2*2*max([1,2,1]) / 2^2
    assert third_autocorrelation([1.0, -2.0]) == pytest.approx(16.0)  # 2*2*max([1,-4,4]) / (-1)^2
    assert erdos_overlap([1.0, 0.0]) == pytest.approx(1.0)  # correlate([1,0],[0,1]) = [1,0,0]
    np.testing.assert_allclose(autoconvolution([1.0, 2.0, 3.0]), [1, 4, 10, 12, 9], atol=1e-12)
    np.testing.assert_array_equal(autoconvolution([1.0, 2.0, 3.0], method="direct"), [1, 4, 10, 12, 9])


def test_third_uses_abs_of_max_not_max_of_abs():
    h = np.array([1.0, -3.0, 1.0])  # conv = [1, -6, 11, -6, 1]
    assert third_autocorrelation(h) == pytest.approx(2 * 3 * 11 / 1.0)
    h2 = np.array([1.0, 1.0, -3.0])  # conv = [1, 2, -5, -6, 9]; sum = -1
    assert third_autocorrelation(h2) == pytest.approx(2 * 3 * 9 / 1.0)


@pytest.mark.parametrize("n", [1, 2, 17, 600, 4097])
def test_fft_autoconvolution_equals_direct(n):
    h = np.random.default_rng(n).normal(size=n)
    fast, direct = autoconvolution(h), autoconvolution(h, method="direct")
    assert np.max(np.abs(fast - direct)) <= 1e-12 * np.max(np.abs(direct))


def test_constraint_violations_name_the_constraint():
    with pytest.raises(ValueError, match=r"h\[1\] = -0.5"):
        first_autocorrelation([1.0, -0.5, 1.0])
    with pytest.raises(ValueError, match="non-zero integral"):
        first_autocorrelation([0.0, 0.0])
    with pytest.raises(ValueError, match="non-zero integral"):
        third_autocorrelation([1.0, -1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\].*h\[0\] = 1.5"):
        erdos_overlap([1.5, 0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"sum\(h\) = n/2 = 2.0, got 2.5"):
        erdos_overlap([1.0, 1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="method"):
        autoconvolution([1.0], method="karatsuba")
    with pytest.raises(ValueError, match="problem"):
        verify("second_autocorrelation", [1.0])


def test_erdos_sum_tolerance_is_small():
    h = np.full(10, 0.5)
    erdos_overlap(h + 1e-12)  # within tolerance
    with pytest.raises(ValueError, match="sum"):
        erdos_overlap(h + 1e-6)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_smoothed_objective_tends_to_the_score(constructions, problem):
    h = constructions[problem]
    score = verify(problem, h)
    n = h.shape[0]
    prev = math.inf
    for T in (1e-1, 1e-2, 1e-3, 1e-5, 1e-8):
        val, _ = smooth_max_and_grad(h, temperature=T, problem=problem)
        assert score - 1e-12 <= val <= score + T * math.log(2 * n - 1) + 1e-12
        assert val <= prev + 1e-15
        prev = val
    assert abs(prev - score) < 1e-7


@pytest.mark.parametrize("problem", PROBLEMS)
def test_gradient_matches_finite_differences(problem):
    rng = np.random.default_rng(11)
    n = 24
    h = rng.random(n) * 0.8 + 0.1 if problem != "third_autocorrelation" else rng.normal(size=n) + 0.5
    T = 0.05
    _, g = smooth_max_and_grad(h, temperature=T, problem=problem)
    step = 1e-6
    fd = np.empty(n)
    for i in range(n):
        e = np.zeros(n)
        e[i] = step
        fp, _ = smooth_max_and_grad(h + e, temperature=T, problem=problem)
        fm, _ = smooth_max_and_grad(h - e, temperature=T, problem=problem)
        fd[i] = (fp - fm) / (2 * step)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7 * np.max(np.abs(fd)))


def test_smooth_rejects_bad_temperature_and_problem():
    with pytest.raises(ValueError, match="temperature"):
        smooth_max_and_grad([1.0, 1.0], temperature=0.0, problem="first_autocorrelation")
    with pytest.raises(ValueError, match="problem"):
        smooth_max_and_grad([1.0, 1.0], temperature=1.0, problem="nope")
