"""Hypervolume kernels against closed forms, the general path and moocore (MILO §4.2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

moocore = pytest.importorskip("moocore")

from milo_ray.kernels import _sweep3d  # noqa: E402
from milo_ray.kernels.hypervolume import (  # noqa: E402
    _COMPILED_HV3_MIN_POINTS,
    _contrib3_grid,
    _hv_general,
    _leave_one_out,
    delta_hv,
    hv_contributions,
    hypervolume,
)

REL = 1e-12


def _front(rng, n, d):
    """Mutually non-dominated points on the positive unit sphere."""
    x = np.abs(rng.normal(size=(n, d)))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _cases(rng, d, count=12):
    """Fronts, uniform clouds (mostly dominated) and coarse grids (ties and duplicates)."""
    for t in range(count):
        n = int(rng.integers(1, 40))
        if t % 3 == 0:
            yield _front(rng, n, d)
        elif t % 3 == 1:
            yield rng.random((n, d))
        else:
            yield np.round(rng.random((n, d)) * 4) / 4


def _moocore_hv(P, ref):
    return moocore.hypervolume(P, ref=ref, maximise=True)


def test_two_d_staircase_closed_form():
    assert hypervolume([[1, 3], [2, 2], [3, 1]]) == 6.0
    assert hypervolume([[1, 3], [2, 2], [3, 1]], ref=[1, 1]) == 1.0  # only (2, 2) is strictly above ref
    assert hypervolume([[1, 3], [2, 2], [3, 1]], ref=[0.5, 0.5]) == 3.25


def test_three_d_closed_form_volume_and_contributions():
    P = [[2, 1, 1], [1, 2, 1], [1, 1, 2]]
    assert hypervolume(P) == 4.0  # 3 * 2 - 3 * 1 + 1 (inclusion-exclusion)
    np.testing.assert_array_equal(hv_contributions(P), [1.0, 1.0, 1.0])
    assert hypervolume([[1, 1, 1]], ref=[-1, -1, -1]) == 8.0


def test_points_not_strictly_above_ref_contribute_nothing():
    assert hypervolume([[1.0, 0.0, 5.0]]) == 0.0
    assert hypervolume([[2, 2], [3, 0]]) == 4.0
    np.testing.assert_array_equal(hv_contributions([[2, 2], [3, 0]]), [4.0, 0.0])
    assert delta_hv([[1, 1]], [5, 0]) == 0.0


def test_empty_inputs_give_zero():
    assert hypervolume(np.empty((0, 3))) == 0.0
    assert hv_contributions(np.empty((0, 2))).shape == (0,)
    assert delta_hv(np.empty((0, 2)), [2.0, 3.0]) == 6.0


def test_one_dimension_is_the_largest_coordinate():
    assert hypervolume([[0.25], [0.75]]) == 0.75


@pytest.mark.parametrize("d", [2, 3, 4, 5])
def test_hypervolume_matches_moocore(d):
    rng = np.random.default_rng(100 + d)
    for P in _cases(rng, d, count=15 if d < 5 else 8):
        ref = np.zeros(d) if rng.random() < 0.5 else -rng.random(d)
        ours, theirs = hypervolume(P, ref=ref), _moocore_hv(P, ref)
        assert abs(ours - theirs) <= REL * theirs, (ours, theirs)


@pytest.mark.parametrize("n", [300, 1000])
def test_three_d_sweep_matches_moocore_on_large_fronts(n):
    P = _front(np.random.default_rng(n), n, 3)
    theirs = _moocore_hv(P, np.zeros(3))
    assert abs(hypervolume(P) - theirs) <= REL * theirs


@pytest.mark.parametrize("d", [2, 3, 4])
def test_fast_paths_match_the_general_sweep(d):
    rng = np.random.default_rng(200 + d)
    for P in _cases(rng, d, count=10):
        ours, general = hypervolume(P), _hv_general(P)
        assert abs(ours - general) <= REL * max(general, 1e-300)


@pytest.mark.parametrize("d", [2, 3, 4, 5])
def test_contributions_match_moocore_leave_one_out(d):
    rng = np.random.default_rng(300 + d)
    for P in _cases(rng, d, count=12 if d < 5 else 6):
        total = _moocore_hv(P, np.zeros(d))
        ours = hv_contributions(P)
        theirs = moocore.hv_contributions(P, ref=np.zeros(d), maximise=True, ignore_dominated=False)
        # Relative to each contribution, with an absolute floor at the total's rounding level.
        np.testing.assert_allclose(ours, theirs, rtol=REL, atol=REL * total)


def test_contributions_on_a_3d_front_match_moocore_default():
    P = _front(np.random.default_rng(1), 200, 3)
    theirs = moocore.hv_contributions(P, ref=np.zeros(3), maximise=True)
    np.testing.assert_allclose(hv_contributions(P), theirs, rtol=REL, atol=REL * _moocore_hv(P, np.zeros(3)))


def test_duplicates_and_dominated_points_get_no_credit():
    P = np.array([[2.0, 1.0, 1.0], [2.0, 1.0, 1.0], [1.0, 2.0, 1.0], [0.5, 0.5, 0.5]])
    c = hv_contributions(P)
    assert c[0] == 0.0 and c[1] == 0.0 and c[3] == 0.0
    assert c[2] == pytest.approx(hypervolume(P) - hypervolume(np.delete(P, 2, axis=0)))


def test_a_dominated_point_reduces_its_only_dominators_contribution():
    P = np.array([[2.0, 2.0], [1.0, 1.0]])
    np.testing.assert_allclose(hv_contributions(P), [3.0, 0.0])


def test_grid_contributions_equal_leave_one_out_on_fronts():
    rng = np.random.default_rng(5)
    for n in (2, 5, 30, 80):
        P = _front(rng, n, 3)
        loo = np.array([_leave_one_out(P, i) for i in range(n)])
        np.testing.assert_allclose(_contrib3_grid(P), loo, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("d", [2, 3, 4])
def test_delta_hv_is_the_volume_gain(d):
    rng = np.random.default_rng(400 + d)
    for P in _cases(rng, d, count=10):
        c = rng.random(d)
        gain = hypervolume(np.vstack([P, c])) - hypervolume(P)
        assert delta_hv(P, c) == pytest.approx(gain, rel=1e-10, abs=1e-12)
        assert delta_hv(P, c) >= 0.0


def test_delta_hv_of_a_dominated_candidate_is_zero():
    assert delta_hv([[0.9, 0.9, 0.9]], [0.5, 0.5, 0.5]) == 0.0


def _shaped_fronts(rng):
    """3-D fronts of several shapes (convex, concave, linear), including sizes past the 8-bit rank path."""
    for n in (2, 3, 7, 40, 120, 254, 255, 300):
        for power in (0.4, 1.0, 2.5):
            yield n, _front(rng, n, 3) ** power
    for n in (5, 60):
        S = rng.dirichlet(np.ones(3), size=n)  # points on the simplex x + y + z = 1
        yield n, S


def _sweep_contributions(P):
    fast, ok = _sweep3d.contributions3(np.ascontiguousarray(P, dtype=float))
    return fast if ok else None


def test_general_position_contributions_match_moocore_and_the_grid():
    rng = np.random.default_rng(77)
    for n, P in _shaped_fronts(rng):
        fast = _sweep_contributions(P)
        assert fast is not None, n
        theirs = moocore.hv_contributions(P, ref=np.zeros(3), maximise=True)
        scale = REL * _moocore_hv(P, np.zeros(3))
        np.testing.assert_allclose(fast, theirs, rtol=REL, atol=scale)
        np.testing.assert_allclose(fast, _contrib3_grid(P), rtol=1e-10, atol=scale)
        assert np.all(fast > 0)  # every point of a front in general position has an exclusive box


def test_general_position_path_declines_ties_and_dominated_rows():
    P = _front(np.random.default_rng(8), 30, 3)
    tie = P.copy()
    tie[3, 0] = tie[7, 0]
    dominated = np.vstack([P, P[4] * 0.9])
    tie_y = P.copy()
    tie_y[5, 1] = tie_y[2, 1]
    tie_z = P.copy()
    tie_z[9, 2] = tie_z[1, 2]
    for declined in (tie, tie_y, tie_z, dominated):
        assert _sweep_contributions(declined) is None
    # The public function still answers them exactly through the general path.
    for Q in (tie, tie_y, tie_z, dominated):
        loo = np.array([_leave_one_out(Q, i) for i in range(Q.shape[0])])
        np.testing.assert_allclose(hv_contributions(Q), loo, rtol=1e-10, atol=1e-13)


def test_rows_on_the_reference_are_dropped_before_the_front_path():
    P = _front(np.random.default_rng(9), 50, 3)
    with_flat = np.vstack([P[:20], [[0.5, 0.0, 0.5]], P[20:]])
    c = hv_contributions(with_flat)
    assert c[20] == 0.0
    np.testing.assert_allclose(np.delete(c, 20), hv_contributions(P), rtol=1e-14, atol=0)


def test_three_d_sweep_is_exact_with_heavy_ties_and_duplicates():
    # Coarse grids put many points on the same x (zero-width staircase steps) and repeat rows.
    rng = np.random.default_rng(21)
    for k in (2, 3, 5, 8):
        P = np.round(rng.random((250, 3)) * k) / k + 0.01
        P = np.vstack([P, P[:40]])
        theirs = _moocore_hv(P, np.zeros(3))
        assert abs(hypervolume(P) - theirs) <= REL * theirs
        assert abs(_hv_general(P) - theirs) <= REL * theirs


def test_python_and_compiled_volume_sweeps_agree_on_both_sides_of_the_switch(monkeypatch):
    import milo_ray.kernels.hypervolume as hv_module

    rng = np.random.default_rng(31)
    sizes = (1, 2, 9, _COMPILED_HV3_MIN_POINTS - 1, _COMPILED_HV3_MIN_POINTS, 400)
    inputs = []
    for n in sizes:
        inputs += [_front(rng, n, 3), rng.random((n, 3)), np.round(rng.random((n, 3)) * 4) / 4 + 0.01]
    compiled = [_sweep3d.hypervolume3(np.ascontiguousarray(P)) for P in inputs]
    monkeypatch.setattr(hv_module, "_COMPILED_HV3_MIN_POINTS", 10**9)
    for P, c in zip(inputs, compiled):
        theirs = _moocore_hv(P, np.zeros(3))
        assert abs(c - theirs) <= REL * theirs
        assert abs(hypervolume(P) - theirs) <= REL * theirs  # the Python loop


def test_small_three_d_volumes_do_not_load_the_compiler():
    # MILO's admission fronts are small; their processes must not pay numba's start-up.
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from milo_ray.kernels.hypervolume import delta_hv, hypervolume\n"
        "P = np.random.default_rng(0).random((60, 3))\n"
        "assert hypervolume(P) > 0 and delta_hv(P, [0.9, 0.9, 0.9]) >= 0\n"
        "print('numba' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@settings(max_examples=150, deadline=None)
@given(
    cells=st.lists(st.tuples(*[st.integers(1, 5)] * 3), min_size=2, max_size=25),
    on_plane=st.booleans(),
    jitter=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_contributions_match_moocore_on_near_degenerate_clouds(cells, on_plane, jitter, seed):
    # Coarse grids give ties, duplicates and dominated rows (the general path); on the
    # plane x + y + z = const every distinct row is on the front; a jitter far below
    # the grid step breaks every tie and sends such fronts through the compiled sweep
    # with nearly coincident staircase steps.
    P = np.asarray(cells, dtype=float)
    if on_plane:
        P[:, 2] = 16.0 - P[:, 0] - P[:, 1]
    P /= 5.0
    if jitter:
        P = P + np.random.default_rng(seed).permutation(P.size).reshape(P.shape) * 1e-7
    # Oracle: leave-one-out with moocore's volumes.  (moocore 0.3.2's own
    # ``hv_contributions(..., ignore_dominated=False)`` gives 0 to the second of two
    # jittered near-duplicates although neither dominates the other.)
    ref = np.zeros(3)
    total = _moocore_hv(P, ref)
    theirs = [total - _moocore_hv(np.delete(P, i, axis=0), ref) for i in range(P.shape[0])]
    np.testing.assert_allclose(hv_contributions(P), theirs, rtol=1e-9, atol=4 * REL * total)
