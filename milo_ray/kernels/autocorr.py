"""EinsteinArena scores for the instance-level track (MILO App. E; DESIGN §4.5).

A construction is a vector of ``n`` step heights ``h`` on equal steps of
[-1/4, 1/4].  All three problems are minimizations (lower is better):

* ``first_autocorrelation``: ``2n * max(h*h) / (sum h)^2`` with ``h >= 0``;
* ``third_autocorrelation``: ``2n * |max(h*h)| / (sum h)^2`` with signed ``h``
  (the absolute value of the maximum, not the maximum of absolute values);
* ``erdos_overlap``: ``2 * max(correlate(h, 1 - h, "full")) / n`` with
  ``h`` in [0, 1] and ``sum h = n / 2``.

``h*h`` is the full discrete autoconvolution (length ``2n - 1``).  Scores use the
FFT (O(n log n)); ``verify`` re-scores with the direct O(n^2) convolution, which
is what a reported record must pass.  ``smooth_max_and_grad`` gives optimizers a
log-sum-exp smoothed objective with its exact gradient.

The FFT formulas themselves live in :mod:`milo_ray.kernels.autocorr_kit`, the standalone
file optimizer programs are given in their sandbox; this module adds the input checks,
the constraint errors and the direct O(n^2) path.

Constraint tolerances: Erdős heights may leave [0, 1] by at most ``_TOL_BOX`` and
``sum h`` may differ from ``n / 2`` by at most ``_TOL_SUM_REL * n``; anything
beyond raises ``ValueError`` naming the constraint and the offending value.
"""

from __future__ import annotations

import numpy as np

from milo_ray.kernels import autocorr_kit as kit
from milo_ray.kernels._validate import as_array, as_scalar

__all__ = [
    "PROBLEMS",
    "autoconvolution",
    "first_autocorrelation",
    "third_autocorrelation",
    "erdos_overlap",
    "smooth_max_and_grad",
    "verify",
]

PROBLEMS = kit.PROBLEMS

_TOL_BOX = kit.VERIFIER_BOX_TOL  # Erdős: allowed excursion of a height outside [0, 1]
_TOL_SUM_REL = kit.ERDOS_SUM_TOL  # Erdős: allowed |sum h - n/2| relative to n


def _heights(h, name: str = "h") -> np.ndarray:
    return as_array(name, h, ndim=1, allow_empty=False)


def _conv(a: np.ndarray, b: np.ndarray, method: str) -> np.ndarray:
    """Full linear convolution of two real vectors."""
    if method == "direct":
        return np.convolve(a, b)
    if method == "fft":
        return kit.conv(a, b)
    raise ValueError(f"method: expected 'fft' or 'direct', got {method!r}")


def autoconvolution(h, *, method: str = "fft") -> np.ndarray:
    """Full autoconvolution ``(h*h)_k = sum_i h_i h_{k-i}``, length ``2n - 1``.

    ``method="fft"``: O(n log n) (real FFT at a fast length); ``"direct"``:
    O(n^2) exact-order summation.  MILO App. E.
    """
    h = _heights(h)
    return _conv(h, h, method)


def _sum_nonzero(h: np.ndarray, problem: str) -> float:
    s = float(np.sum(h))
    if s == 0.0:
        raise ValueError(f"h: {problem} needs a non-zero integral, got sum(h) = 0")
    return s


def _check_first(h: np.ndarray) -> None:
    if h.min() < 0:
        i = int(np.argmin(h))
        raise ValueError(f"h: first_autocorrelation needs heights >= 0, got h[{i}] = {float(h[i])!r}")


def _check_erdos(h: np.ndarray) -> None:
    n = h.shape[0]
    if h.min() < -_TOL_BOX or h.max() > 1 + _TOL_BOX:
        i = int(np.argmin(h)) if h.min() < -_TOL_BOX else int(np.argmax(h))
        raise ValueError(f"h: erdos_minimum_overlap needs heights in [0, 1], got h[{i}] = {float(h[i])!r}")
    s = float(np.sum(h))
    if abs(s - n / 2) > _TOL_SUM_REL * n:
        raise ValueError(f"h: erdos_minimum_overlap needs sum(h) = n/2 = {n / 2!r}, got {s!r}")


def first_autocorrelation(h, *, method: str = "fft") -> float:
    """``2n * max(h*h) / (sum h)^2`` for ``h >= 0``. O(n log n) (fft) or O(n^2) (direct). MILO App. E."""
    h = _heights(h)
    _check_first(h)
    s = _sum_nonzero(h, "first_autocorrelation")
    return float(2 * h.shape[0] * _conv(h, h, method).max() / (s * s))


def third_autocorrelation(h, *, method: str = "fft") -> float:
    """``2n * |max(h*h)| / (sum h)^2`` for signed ``h``. O(n log n) (fft) or O(n^2) (direct). MILO App. E."""
    h = _heights(h)
    s = _sum_nonzero(h, "third_autocorrelation")
    return float(2 * h.shape[0] * abs(_conv(h, h, method).max()) / (s * s))


def erdos_overlap(h, *, method: str = "fft") -> float:
    """``2 * max(correlate(h, 1 - h, "full")) / n`` for ``h`` in [0, 1], ``sum h = n/2``. MILO App. E."""
    h = _heights(h)
    _check_erdos(h)
    n = h.shape[0]
    corr = _conv(h, (1.0 - h)[::-1], method)  # correlate(a, v, "full") == convolve(a, v[::-1])
    return float(2 * corr.max() / n)


_SCORERS = {
    "first_autocorrelation": first_autocorrelation,
    "third_autocorrelation": third_autocorrelation,
    "erdos_minimum_overlap": erdos_overlap,
}


def _problem(problem) -> str:
    if problem not in _SCORERS:
        raise ValueError(f"problem: expected one of {PROBLEMS}, got {problem!r}")
    return problem


def verify(problem: str, h) -> float:
    """Exact re-verification: the score of ``h`` by direct O(n^2) convolution (constraints enforced)."""
    return _SCORERS[_problem(problem)](h, method="direct")


def smooth_max_and_grad(h, *, temperature: float, problem: str) -> tuple[float, np.ndarray]:
    """Log-sum-exp smoothed score and its exact gradient with respect to ``h``.

    The max over shifts of the normalized per-shift vector ``v`` (``v_k =
    2n (h*h)_k / (sum h)^2`` for the autocorrelation problems, ``v_k = 2
    corr_k / n`` for Erdős) is replaced by ``T log sum_k exp(v_k / T)``, so
    ``temperature`` is in score units and ``score <= smooth <= score + T
    log(2n - 1)`` (for the third problem the bound holds for the signed max
    before the absolute value).  The gradient is exact for that smoothed value
    (chain rule through softmax weights, correlations by FFT): O(n log n).
    Constraints are not enforced here (optimizers may step outside them and
    project), only finiteness and, for the autocorrelation problems, a non-zero
    sum.  MILO App. E.
    """
    T = as_scalar("temperature", temperature, low=0.0, strict_low=True)
    problem = _problem(problem)
    h = _heights(h)
    if problem != "erdos_minimum_overlap":
        _sum_nonzero(h, problem)
    # Third problem: the autoconvolution sums to (sum h)^2 > 0, so its maximum is
    # positive and the signed smoothed value is the score's: no sign case.
    return kit.smooth_value_grad(h, T, problem)
