"""Every kernel fails cleanly on bad input and never mutates what it is given."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.kernels import autocorr, hypervolume, metrics, pareto, submodular


def _calls(rng, freeze):
    """(name, callable) pairs over read-only inputs covering every public kernel."""
    F = freeze(rng.random((12, 3)))
    B = freeze(rng.random((12, 5)))
    P3 = freeze(rng.random((25, 3)))
    P4 = freeze(rng.random((10, 4)))
    sphere = np.abs(rng.normal(size=(30, 3)))
    front3 = freeze(sphere / np.linalg.norm(sphere, axis=1, keepdims=True))  # general-position front path
    Z = freeze(rng.normal(size=(9, 4)))
    w, q = freeze(rng.random(9), rng.random(9))
    S = freeze(submodular.clipped_cosine(Z))
    h = freeze(rng.random(64))
    e = freeze(np.r_[np.ones(16), np.zeros(16)])
    M = freeze(np.round(rng.random((8, 3)), 1))
    acc, costs, caps = freeze(rng.random(12), rng.random((12, 2)) * 10, [20.0, 20.0])
    eta = freeze(rng.normal(size=12))
    return [
        ("fitness_vectors", lambda: pareto.fitness_vectors(acc, costs, caps)),
        ("dominates", lambda: pareto.dominates(F[0], F[1])),
        ("dominance_matrix", lambda: pareto.dominance_matrix(F)),
        ("pareto_front", lambda: pareto.pareto_front(F)),
        ("admits", lambda: pareto.admits(F, F[0])),
        ("behavior_similarity", lambda: pareto.behavior_similarity(B)),
        ("selection_scores", lambda: pareto.selection_scores(F, B)),
        ("sample_parent", lambda: pareto.sample_parent(eta, temperature=1.0, rng=np.random.default_rng(0))),
        ("task_regret", lambda: pareto.task_regret(B)),
        ("most_dissimilar", lambda: pareto.most_dissimilar(B, 3)),
        ("hypervolume3", lambda: hypervolume.hypervolume(P3, ref=freeze([0.1, 0.1, 0.1]))),
        ("hypervolume4", lambda: hypervolume.hypervolume(P4)),
        ("hv_contributions", lambda: hypervolume.hv_contributions(P3)),
        ("hv_contributions4", lambda: hypervolume.hv_contributions(P4)),
        ("hv_contributions_front", lambda: hypervolume.hv_contributions(front3)),
        ("hypervolume_front", lambda: hypervolume.hypervolume(front3)),
        ("delta_hv", lambda: hypervolume.delta_hv(P3, P3[0])),
        ("clipped_cosine", lambda: submodular.clipped_cosine(Z)),
        ("coverage_objective", lambda: submodular.coverage_objective([0, 2], w, q, S)),
        ("rer_order", lambda: submodular.rer_order(w, q, S)),
        ("prefix_sizes", lambda: submodular.prefix_sizes(9, freeze([0.5, 1.0]))),
        ("autoconvolution", lambda: autocorr.autoconvolution(h)),
        ("first", lambda: autocorr.first_autocorrelation(h)),
        ("third", lambda: autocorr.third_autocorrelation(h)),
        ("erdos", lambda: autocorr.erdos_overlap(e)),
        ("smooth", lambda: autocorr.smooth_max_and_grad(h, temperature=0.1, problem="first_autocorrelation")),
        ("smooth_erdos", lambda: autocorr.smooth_max_and_grad(e, temperature=0.1, problem="erdos_minimum_overlap")),
        ("verify", lambda: autocorr.verify("first_autocorrelation", h)),
        ("pass_at_k", lambda: metrics.pass_at_k(M)),
        ("clustered_ci", lambda: metrics.clustered_ci(M, statistic="rr")),
    ]


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return np.array_equal(np.asarray(a), np.asarray(b))


def test_no_kernel_mutates_its_inputs(rng, freeze):
    # Read-only arrays make any in-place write raise; results must also be deterministic.
    for name, call in _calls(rng, freeze):
        first = call()
        second = call()
        assert _same(first, second), name


BAD_ARRAYS = [np.nan, np.inf, -np.inf]


@pytest.mark.parametrize("bad", BAD_ARRAYS)
def test_non_finite_values_are_rejected_by_name(bad):
    F = np.ones((3, 3)) * 0.5
    F[1, 2] = bad
    with pytest.raises(ValueError, match="F: contains a non-finite"):
        pareto.dominance_matrix(F)
    with pytest.raises(ValueError, match="points: contains a non-finite"):
        hypervolume.hypervolume(F)
    with pytest.raises(ValueError, match="ref"):
        hypervolume.hypervolume(np.ones((2, 2)), ref=[0.0, bad])
    with pytest.raises(ValueError, match="S: contains a non-finite"):
        submodular.rer_order(np.ones(3), np.ones(3), F)
    with pytest.raises(ValueError, match="h: contains a non-finite"):
        autocorr.first_autocorrelation(np.r_[1.0, bad])
    with pytest.raises(ValueError, match="eta"):
        pareto.sample_parent(np.r_[0.0, bad], temperature=1.0, rng=np.random.default_rng(0))


def test_wrong_rank_and_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="points: expected a 2-D"):
        hypervolume.hypervolume([1.0, 2.0])
    with pytest.raises(ValueError, match="ref"):
        hypervolume.hypervolume(np.ones((2, 3)), ref=[0.0, 0.0])
    with pytest.raises(ValueError, match="candidate"):
        hypervolume.delta_hv(np.ones((2, 3)), [1.0, 1.0])
    with pytest.raises(ValueError, match="F: expected a 2-D"):
        pareto.pareto_front([0.5, 0.5])
    with pytest.raises(ValueError, match="B"):
        pareto.selection_scores(np.ones((3, 2)) * 0.5, np.ones((2, 4)))
    with pytest.raises(ValueError, match="b"):
        pareto.dominates([0.5, 0.5], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="Z: expected a 2-D"):
        submodular.clipped_cosine([1.0, 2.0])
    with pytest.raises(ValueError, match="h: expected a 1-D"):
        autocorr.autoconvolution(np.ones((2, 2)))
    with pytest.raises(ValueError, match="h: must not be empty"):
        autocorr.autoconvolution([])
    with pytest.raises(ValueError, match="S: expected a 2-D"):
        metrics.pass_at_k([1.0, 0.0])


def test_out_of_range_inputs_are_rejected():
    with pytest.raises(ValueError, match="acc"):
        pareto.fitness_vectors([1.5], [[1.0]], [2.0])
    with pytest.raises(ValueError, match="costs"):
        pareto.fitness_vectors([0.5], [[-1.0]], [2.0])
    with pytest.raises(ValueError, match="B"):
        pareto.behavior_similarity([[2.0, 0.0]])
    with pytest.raises(ValueError, match="rng"):
        pareto.sample_parent([0.0], temperature=1.0, rng=np.random)
    with pytest.raises(ValueError, match="eta"):
        pareto.sample_parent([], temperature=1.0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="k"):
        pareto.most_dissimilar(np.ones((3, 2)), -1)
    with pytest.raises(ValueError, match="n"):
        submodular.prefix_sizes(-1, [0.5])
