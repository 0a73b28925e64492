"""A program written before the runner gave programs their helpers: the ``lse_adam`` seed
as it was then, with its own copies of the scores, gradients, projections, ratchet and
stage driver (tests/boundary/test_optimizer_runner.py runs it beside today's seed).

Seed optimizer ``lse_adam``: Adam on the log-sum-exp smoothed max over shifts.

The temperature follows a geometric schedule from hot to cold over the stage's
time (relative to the current score: T is in score units), the learning rate
follows it down; every step is projected back to the feasible set. Stages:
``anneal`` (hot -> cold), ``cold`` (a cold run from the best point) and ``fine``
(a colder run with tiny steps, which is what moves a near-optimal start).
Only strictly better, feasible, exactly (FFT) scored points are published.
"""

import math
import time

import numpy as np
from scipy import fft as sfft

CONFIG = {
    "t_hot": 1e-2,          # anneal: first temperature, relative to the current score
    "t_cold": 1e-5,         # anneal: last temperature; cold: its temperature
    "lr_hot": 1e-2,         # anneal: first learning rate, relative to the mean |height|
    "lr_cold": 1e-4,        # anneal: last learning rate; cold: its learning rate
    "t_fine": 1e-6,         # fine: temperature (polishing a near-optimal point)
    "lr_fine": 1e-6,        # fine: learning rate
    "beta1": 0.9,           # Adam first-moment decay
    "beta2": 0.999,         # Adam second-moment decay
    "offer_every": 10,      # iterations between two offers to the ratchet
    "margin_s": 0.05,       # return this long before the deadline at least ...
    "margin_frac": 0.02,    # ... or this fraction of the budget
}

STAGES = ["anneal", "cold", "fine"]

PROBLEM = None  # set by the runner: first_autocorrelation | third_autocorrelation | erdos_minimum_overlap


def publish(values):
    """Replaced by the runner: record an improved point (the last one counts if the run is killed)."""

# ---------------------------------------------------------------- problem kernel
# Self-contained copies of the scores (the program runs where only numpy/scipy are
# installed). Every score and gradient is O(n log n) through the real FFT.

FIRST, THIRD, ERDOS = "first_autocorrelation", "third_autocorrelation", "erdos_minimum_overlap"
_PROBLEMS = (FIRST, THIRD, ERDOS)
_ERDOS_SUM_TOL = 1e-9  # |sum h - n/2| allowed, relative to n (the verifier's tolerance)


def _conv(a, b):
    """Full linear convolution of two real vectors by FFT."""
    size = a.shape[0] + b.shape[0] - 1
    nfft = sfft.next_fast_len(size, real=True)
    return sfft.irfft(sfft.rfft(a, nfft) * sfft.rfft(b, nfft), nfft)[:size]


def _xcorr_valid(p, b):
    """out_m = sum_k p_k b_(k-m), m = 0..n-1, for len(p) = 2n - 1 and len(b) = n."""
    n = b.shape[0]
    return _conv(p, b[::-1])[n - 1:2 * n - 1]


def _shift_values(h, problem):
    """The per-shift vector whose maximum is the score (third problem: before |.|)."""
    n = h.shape[0]
    if problem == ERDOS:
        return 2.0 * _conv(h, (1.0 - h)[::-1]) / n
    s = float(np.sum(h))
    return 2.0 * n * _conv(h, h) / (s * s)


def score(h, problem):
    """The exact (FFT) score of a feasible point; inf when the point is infeasible."""
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 1 or h.shape[0] < 2 or not np.all(np.isfinite(h)):
        return math.inf
    n = h.shape[0]
    if problem == ERDOS:
        if h.min() < 0.0 or h.max() > 1.0 or abs(float(np.sum(h)) - n / 2) > _ERDOS_SUM_TOL * n:
            return math.inf
        return float(2 * _conv(h, (1.0 - h)[::-1]).max() / n)
    s = float(np.sum(h))
    if s == 0.0 or (problem == FIRST and h.min() < 0.0):
        return math.inf
    m = float(_conv(h, h).max())
    return float(2 * n * (abs(m) if problem == THIRD else m) / (s * s))


def _weighted_grad(h, p, v, problem):
    """Gradient of sum_k p_k v_k (v = _shift_values(h)) with respect to h."""
    n = h.shape[0]
    if problem == ERDOS:
        r = (1.0 - h)[::-1]
        # h enters corr directly and through r = reverse(1 - h).
        return (2.0 / n) * (_xcorr_valid(p, r) - _xcorr_valid(p, h)[::-1])
    s = float(np.sum(h))
    return (4.0 * n / (s * s)) * _xcorr_valid(p, h) - 2.0 * float(np.dot(p, v)) / s


def smooth_value_grad(h, temperature, problem):
    """Log-sum-exp smoothed max over shifts, T log sum exp(v / T), and its exact
    gradient; score <= value <= score + T log(2n - 1)."""
    # Third problem: the autoconvolution sums to (sum h)^2 > 0, so its maximum is
    # positive and |max| = max; no sign case is needed.
    v = _shift_values(h, problem)
    top = float(v.max())
    e = np.exp((v - top) / temperature)
    tot = float(e.sum())
    return top + temperature * math.log(tot), _weighted_grad(h, e / tot, v, problem)


def project(h, problem):
    """The nearest feasible point in the simple sense each problem needs: heights >= 0
    (first), unchanged (third), heights in [0, 1] with sum n/2 (Erdős: a shift found
    by bisection, then clipping)."""
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


# ---------------------------------------------------------------- ratchet
# The single record of the run: a point is kept (and published) only when it is
# feasible and its exact FFT score is strictly below the best so far.

_BEST = {"h": None, "score": math.inf}


def _reset(h, problem):
    _BEST["h"], _BEST["score"] = np.array(h, dtype=np.float64), score(h, problem)


def offer(h, problem):
    """Project h, score it exactly, keep and publish it if strictly better."""
    z = project(h, problem)
    s = score(z, problem)
    if s < _BEST["score"]:
        _BEST["h"], _BEST["score"] = z, s
        publish(z.copy())
        return True
    return False


def best():
    return _BEST["h"].copy()


def _problem_name():
    if PROBLEM is None:
        raise RuntimeError("PROBLEM is not set: the runner sets the module attribute PROBLEM to one of "
                           f"{_PROBLEMS} before calling optimize")
    if PROBLEM not in _PROBLEMS:
        raise ValueError(f"PROBLEM: expected one of {_PROBLEMS}, got {PROBLEM!r}")
    return PROBLEM


def optimize(values, *, seed, deadline):
    """Run STAGES in order from ``values``; each stage gets an equal share of the
    time left (a stage that ends early leaves its time to the next ones). Returns
    the best verified point, before ``deadline`` (a time.monotonic() value)."""
    problem = _problem_name()
    h = project(np.asarray(values, dtype=np.float64), problem)
    _reset(np.asarray(values, dtype=np.float64), problem)
    if not math.isfinite(_BEST["score"]):
        _reset(h, problem)
    rng = np.random.default_rng(seed)
    start = time.monotonic()
    # Stop short of the deadline by a margin: returning and serializing take time.
    end = deadline - max(CONFIG["margin_s"], CONFIG["margin_frac"] * max(0.0, deadline - start))
    for i, name in enumerate(STAGES):
        now = time.monotonic()
        if now >= end:
            break
        stage_deadline = now + (end - now) / (len(STAGES) - i)
        out = globals()["stage_" + name](h, rng, stage_deadline, problem)
        h = project(out, problem) if out is not None else h
    return best()


# ---------------------------------------------------------------- stages


def _adam(h, deadline, problem, t0, t1, lr0, lr1):
    """Adam with temperature and learning rate moving geometrically from (t0, lr0)
    to (t1, lr1) as the stage's time runs out."""
    start = time.monotonic()
    span = max(deadline - start, 1e-9)
    m = np.zeros_like(h)
    v = np.zeros_like(h)
    b1, b2 = CONFIG["beta1"], CONFIG["beta2"]
    scale = float(np.mean(np.abs(h))) or 1.0
    it = 0
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        frac = min(1.0, (now - start) / span)
        temperature = t0 * (t1 / t0) ** frac * _BEST["score"]
        lr = lr0 * (lr1 / lr0) ** frac * scale
        _, g = smooth_value_grad(h, temperature, problem)
        if problem == ERDOS:
            g = g - g.mean()  # stay on sum h = n/2 before the projection
        it += 1
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = (m / (1 - b1 ** it)) / (np.sqrt(v / (1 - b2 ** it)) + 1e-12)
        h = project(h - lr * step, problem)
        if it % int(CONFIG["offer_every"]) == 0:
            offer(h, problem)
    offer(h, problem)
    return best()


def stage_anneal(h, rng, deadline, problem):
    return _adam(h, deadline, problem, CONFIG["t_hot"], CONFIG["t_cold"], CONFIG["lr_hot"], CONFIG["lr_cold"])


def stage_cold(h, rng, deadline, problem):
    return _adam(best(), deadline, problem, CONFIG["t_cold"], CONFIG["t_cold"], CONFIG["lr_cold"], CONFIG["lr_cold"])


def stage_fine(h, rng, deadline, problem):
    return _adam(best(), deadline, problem, CONFIG["t_fine"], CONFIG["t_fine"], CONFIG["lr_fine"], CONFIG["lr_fine"])
