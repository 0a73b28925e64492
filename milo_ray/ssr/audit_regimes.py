"""Synthetic audit matrices with a known truth: the racing audit's regime sweep.

The generator (documented here because the sweep's conclusions rest on it):

* a parent and M children; harness h has a logit effect θ_h (the parent's is θ_0 =
  logit(``base``)); the children's effects are θ_0 + δ_h with δ drawn per regime;
* every task t has a difficulty a_t ~ N(0, ``task_sd``²) shared by all harnesses (what
  makes paired comparisons on shared tasks work), and every (harness, task) pair an
  interaction e_ht ~ N(0, ``interaction_sd``²) (a child helps on some tasks, hurts on
  others; it is what a finite task sample cannot average away);
* each execution is Bernoulli(sigmoid(θ_h + a_t + e_ht)): R rollouts per cell, so the
  per-execution noise is that of pass/fail on one task;
* history (what a race may read before it starts, never a selection cell): ``history``
  earlier harnesses, θ_0 + N(−0.1, 0.2²) (the parent's predecessors and rivals, a little
  worse on average), one execution each per task, on the same task difficulties with
  their own interactions;
* truth_h = E[sigmoid(θ_h + Z)], Z ~ N(0, task_sd² + interaction_sd²): the harness's
  expected score on a fresh task of the same distribution (Gauss-Hermite quadrature,
  exact to ~1e-12).

Regimes (δ in logits; 0.1 logit ≈ 2 points near 55%):

* ``near_tied``: δ ~ U(−0.05, 0.05): every child within ~1 point of the parent;
* ``surrogate_like``: δ ~ N(0.15, 0.12²): children a few points apart, most better than
  the parent (the scale the surrogate's offline optimizer produces);
* ``wide``: δ ~ U(−0.6, 0.6): ~25 points between the best and the worst child;
* ``bimodal``: a third of the children good (δ ~ N(0.3, 0.05²)), the rest broken edits
  (δ ~ N(−0.8, 0.1²)).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from milo_ray.ssr.audit import RewardMatrix

Draw = Callable[[np.random.Generator, int], np.ndarray]


def _bimodal(rng: np.random.Generator, m: int) -> np.ndarray:
    good = max(1, m // 3)
    d = np.concatenate([rng.normal(0.3, 0.05, good), rng.normal(-0.8, 0.1, m - good)])
    return rng.permutation(d)


REGIMES: dict[str, Draw] = {
    "near_tied": lambda rng, m: rng.uniform(-0.05, 0.05, m),
    "surrogate_like": lambda rng, m: rng.normal(0.15, 0.12, m),
    "wide": lambda rng, m: rng.uniform(-0.6, 0.6, m),
    "bimodal": _bimodal,
}


def expected_score(theta: np.ndarray, sd: float) -> np.ndarray:
    """E[sigmoid(θ + Z)], Z ~ N(0, sd²), by 64-node Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite.hermgauss(64)
    z = np.sqrt(2.0) * sd * x
    return (w * (1.0 / (1.0 + np.exp(-(np.asarray(theta)[:, None] + z[None]))))).sum(axis=1) / np.sqrt(np.pi)


def synthetic_matrix(regime: str, *, seed: int, children: int = 12, tasks: int = 160, rollouts: int = 2,
                     base: float = 0.55, task_sd: float = 1.5, interaction_sd: float = 0.5,
                     history: int = 5) -> RewardMatrix:
    """One matrix of ``regime`` (see the module docstring), deterministic in ``seed``."""
    if regime not in REGIMES:
        raise ValueError(f"regime={regime!r}: choose one of {sorted(REGIMES)}")
    rng = np.random.default_rng([int(seed), sum(map(ord, regime))])
    theta0 = np.log(base / (1 - base))
    theta = np.concatenate([[theta0], theta0 + REGIMES[regime](rng, children)])
    a = rng.normal(0.0, task_sd, tasks)
    e = rng.normal(0.0, interaction_sd, (len(theta), tasks))
    p = 1.0 / (1.0 + np.exp(-(theta[:, None] + a[None] + e)))
    rewards = (rng.random((len(theta), tasks, rollouts)) < p[:, :, None]).astype(float)
    truth = expected_score(theta, float(np.hypot(task_sd, interaction_sd)))
    # Drawn after everything above, so a matrix is the same whatever ``history`` is.
    theta_h = theta0 + rng.normal(-0.1, 0.2, history)
    p_h = 1.0 / (1.0 + np.exp(-(theta_h[:, None] + a[None] + rng.normal(0.0, interaction_sd, (history, tasks)))))
    hist = (rng.random((history, tasks, 1)) < p_h[:, :, None]).astype(float) if history else None
    return RewardMatrix(tuple(f"h{i}" for i in range(len(theta))), tuple(f"x{t}" for t in range(tasks)), rewards,
                        truth=tuple(float(x) for x in truth), truth_source=f"exact:synthetic {regime}",
                        history=hist)
