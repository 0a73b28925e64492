"""Low-rank racing: decide on each child's predicted mean over the task pool, from a
model of the runners × tasks matrix observed so far in the race.

The model: y[h, t] = μ + a_h + b_t + Σ_k u_hk·v_tk + ε (harness effects, task effects
shared by every harness, a rank-``rank`` interaction), fitted by least squares on the
per-task mean rewards of every runner of the stage (children and parent) over the tasks
raced (the double-centred matrix's truncated SVD). With b and v centred over the tasks,
the predicted mean over a fresh task of the pool is μ + a_h; its uncertainty comes from
the residuals ε, which the task effects and the interaction no longer inflate.

With ``prior`` (the default), earlier races' matrices of the same task pool join the
fit as extra rows (:attr:`StageView.prior`): they estimate the task effects and the
interaction's task factors on more harnesses, so less of the residual spread is
interaction the current runners alone could not separate. Their missing cells (tasks an
earlier harness never ran) are filled by the fit itself (iterated imputation), and only
the current runners' rows make decisions.

What it cannot do here: the race owns the batches (every survivor runs the same tasks),
so the rule decides who stays but cannot choose which cells run next.
"""

from __future__ import annotations

import numpy as np

from milo_ray.ssr.racing_view import RuleDecision, StageView


def lowrank_fit(y: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(row effects a_h + μ, residuals ε) of the additive + rank-``rank`` fit of ``y``
    (rows = harnesses, columns = tasks). The rank is capped so the residuals keep
    degrees of freedom: at most min(H, T) − 2."""
    mu = y.mean()
    a = y.mean(axis=1) - mu
    b = y.mean(axis=0) - mu
    z = y - mu - a[:, None] - b[None, :]
    r = max(0, min(int(rank), min(y.shape) - 2))
    if r:
        u, s, vt = np.linalg.svd(z, full_matrices=False)
        z = z - (u[:, :r] * s[:r]) @ vt[:r]
    return mu + a, z


def lowrank_fit_missing(y: np.ndarray, rank: int, iters: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lowrank_fit` of a matrix with missing (NaN) cells, every column observed at
    least once (the race's runners ran every task): the missing cells start at their
    column's observed mean and are replaced by the fit's reconstruction ``iters`` times.
    Residuals of missing cells are returned as 0."""
    mask = np.isfinite(y)
    if mask.all():
        return lowrank_fit(y, rank)
    col = np.nanmean(y, axis=0)
    filled = np.where(mask, y, col[None, :])
    for _ in range(iters):
        _, resid = lowrank_fit(filled, rank)
        filled = np.where(mask, y, filled - resid)
    pred, resid = lowrank_fit(filled, rank)
    return pred, np.where(mask, resid, 0.0)


class LowRankRacing:
    """Drop a child when its predicted mean is below the leader's by more than ``z``
    standard errors of the difference (the residuals' paired spread over √n), from
    ``min_tasks`` tasks on; stop when one child is left. The leader is the child with
    the highest predicted mean (ties: the race's ranking). ``prior``: fit on the view's
    earlier matrices too (see the module)."""

    name = "lowrank"

    def __init__(self, rank: int = 1, z: float = 2.5, min_tasks: int = 10, prior: bool = True) -> None:
        if int(rank) < 0:
            raise ValueError(f"method.racing: lowrank rank must be >= 0, got {rank}")
        if not float(z) > 0:
            raise ValueError(f"method.racing: lowrank z must be > 0, got {z}")
        if int(min_tasks) < 3:
            raise ValueError(f"method.racing: lowrank min_tasks must be >= 3, got {min_tasks}")
        self.rank, self.z, self.min_tasks, self.prior = int(rank), float(z), int(min_tasks), bool(prior)

    def after_stage(self, view: StageView) -> RuleDecision:
        n = len(view.tasks)
        if n < self.min_tasks or len(view.ranked) < 2:
            return RuleDecision(view.ranked, stop=len(view.ranked) == 1)
        rows = list(view.ranked) + [view.parent_id]
        y = np.stack([view.per_task[h] for h in rows])
        extra = [np.asarray(v, dtype=float) for v in view.prior.values()] if self.prior else []
        if extra:  # earlier matrices: more rows for the task side of the fit, no decisions
            pred, resid = lowrank_fit_missing(np.vstack([y, np.stack(extra)]), self.rank)
            pred, resid = pred[: len(rows)], resid[: len(rows)]
        else:
            pred, resid = lowrank_fit(y, self.rank)
        c = len(view.ranked)
        lead = int(np.argmax(pred[:c]))  # argmax takes the first maximum: the race's order breaks ties
        d = resid[:c] - resid[lead]
        se = np.sqrt(d.var(axis=1, ddof=1) / n)
        gap = pred[:c] - pred[lead]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(se > 0, gap < -self.z * se, gap < 0)
        out[lead] = False
        keep = tuple(h for h, o in zip(view.ranked, out) if not o)
        return RuleDecision(keep, stop=len(keep) == 1)
