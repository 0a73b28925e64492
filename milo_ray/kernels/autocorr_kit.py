"""The EinsteinArena formulas an optimizer program is given (MILO App. E; DESIGN §4.5).

One file, importing numpy, scipy and the standard library only (never milo_ray), because
it runs in two places: here, where :mod:`milo_ray.kernels.autocorr` builds its checked
kernels on it, and inside an optimizer's sandbox, where the executor uploads it beside
the runner (:mod:`milo_ray.boundary.inside.optimizer_runner`) and the runner gives its public
names to the program as module globals (see :data:`GIVEN`), the way it gives ``publish``
and ``PROBLEM``. A program therefore needs no copy of the scores, the smoothed max or the
projections; one that defines a name itself keeps its own definition.

The functions take arrays as they come and check nothing beyond what their result needs:
they sit in an optimizer's inner loop. Every score and gradient is O(n log n) through the
real FFT. Lower scores are better; ``n`` is the number of step heights ``h``.
"""

import math

import numpy as np


class _ScipyFFT:
    """``scipy.fft``, imported on first use: importing it costs ~0.2 s, which a sandboxed
    program that never calls these formulas should not pay (the runner imports this file
    for every program). The first attribute read replaces this stand-in by the module."""

    def __getattr__(self, name):
        global sfft
        from scipy import fft as module

        sfft = module
        return getattr(module, name)


sfft = _ScipyFFT()

FIRST, THIRD, ERDOS = "first_autocorrelation", "third_autocorrelation", "erdos_minimum_overlap"
PROBLEMS = (FIRST, THIRD, ERDOS)
# |sum h - n/2| allowed for Erdős, relative to n (the verifier's tolerance).
ERDOS_SUM_TOL = 1e-9
# How far the verifier lets an Erdős height leave [0, 1]. score() defaults to 0 (strict):
# a point an optimizer keeps must not lean on the verifier's slack.
VERIFIER_BOX_TOL = 1e-12

# The names a program is given (the runner adds PROBLEM, publish and the ratchet).
GIVEN = ("FIRST", "THIRD", "ERDOS", "PROBLEMS", "ERDOS_SUM_TOL", "conv", "xcorr_valid", "shift_values",
         "weighted_grad", "score", "smooth_value_grad", "project")


def conv(a, b):
    """Full linear convolution of two real vectors by FFT (length len(a) + len(b) - 1)."""
    size = a.shape[0] + b.shape[0] - 1
    nfft = sfft.next_fast_len(size, real=True)
    return sfft.irfft(sfft.rfft(a, nfft) * sfft.rfft(b, nfft), nfft)[:size]


def xcorr_valid(p, b):
    """out_m = sum_k p_k b_(k-m), m = 0..n-1, for len(p) = 2n - 1 and len(b) = n."""
    n = b.shape[0]
    return conv(p, b[::-1])[n - 1:2 * n - 1]


def shift_values(h, problem):
    """The per-shift vector whose maximum is the score (third problem: before |.|)."""
    n = h.shape[0]
    if problem == ERDOS:
        return 2.0 * conv(h, (1.0 - h)[::-1]) / n
    s = float(np.sum(h))
    return 2.0 * n * conv(h, h) / (s * s)


def score(h, problem, *, box_tol=0.0, convolve=None):
    """The exact (FFT) score of a feasible point; inf when the point is infeasible (Erdős
    heights may leave [0, 1] by ``box_tol``). ``convolve(a, b)``: the full convolution to
    use instead of :func:`conv` (the runner scores its trajectory with numpy's FFT, so a
    program that does not use these formulas never imports scipy)."""
    convolve = convolve or conv
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 1 or h.shape[0] < 2 or not np.all(np.isfinite(h)):
        return math.inf
    n = h.shape[0]
    if problem == ERDOS:
        if h.min() < -box_tol or h.max() > 1.0 + box_tol or abs(float(np.sum(h)) - n / 2) > ERDOS_SUM_TOL * n:
            return math.inf
        return float(2 * convolve(h, (1.0 - h)[::-1]).max() / n)
    s = float(np.sum(h))
    if s == 0.0 or (problem == FIRST and h.min() < 0.0):
        return math.inf
    m = float(convolve(h, h).max())
    return float(2 * n * (abs(m) if problem == THIRD else m) / (s * s))


def weighted_grad(h, p, v, problem):
    """Gradient of sum_k p_k v_k (v = shift_values(h)) with respect to h."""
    n = h.shape[0]
    if problem == ERDOS:
        r = (1.0 - h)[::-1]
        # h enters corr directly and through r = reverse(1 - h).
        return (2.0 / n) * (xcorr_valid(p, r) - xcorr_valid(p, h)[::-1])
    s = float(np.sum(h))
    # d v_k / d h_m = 2n/s^2 * 2 h_(k-m) - 2 v_k / s.
    return (4.0 * n / (s * s)) * xcorr_valid(p, h) - 2.0 * float(np.dot(p, v)) / s


def smooth_value_grad(h, temperature, problem):
    """Log-sum-exp smoothed max over shifts, T log sum exp(v / T), and its exact
    gradient; score <= value <= score + T log(2n - 1) (T in score units)."""
    # Third problem: the autoconvolution sums to (sum h)^2 > 0, so its maximum is
    # positive and |max| = max; no sign case is needed.
    v = shift_values(h, problem)
    top = float(v.max())
    e = np.exp((v - top) / temperature)
    tot = float(e.sum())
    return top + temperature * math.log(tot), weighted_grad(h, e / tot, v, problem)


def project(h, problem):
    """The nearest feasible point in the simple sense each problem needs: heights >= 0
    (first), unchanged (third), heights in [0, 1] with sum n/2 (Erdős: a shift found
    by bisection, then clipping). Returns a new array."""
    h = np.array(h, dtype=np.float64)
    if problem == FIRST:
        h = np.maximum(h, 0.0)
        if h.sum() <= 0.0:
            h[:] = 1.0
        return h
    if problem == THIRD:
        if h.sum() == 0.0:
            h = h + 1e-6
        return h
    n = h.shape[0]
    target = n / 2.0
    lo, hi = -1.0 - float(h.max()), 1.0 - float(h.min())
    for _ in range(100):  # sum(clip(h + c, 0, 1)) is monotone in c
        mid = 0.5 * (lo + hi)
        if np.clip(h + mid, 0.0, 1.0).sum() < target:
            lo = mid
        else:
            hi = mid
    out = np.clip(h + 0.5 * (lo + hi), 0.0, 1.0)
    inner = (out > 0.0) & (out < 1.0)
    if inner.any():  # spread the bisection's last residual over the free heights
        out[inner] += (target - out.sum()) / inner.sum()
    return np.clip(out, 0.0, 1.0)
