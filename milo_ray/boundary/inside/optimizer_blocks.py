"""The optimizer building blocks a program is given (the instance-level track, MILO App. E).

Like :mod:`milo_ray.kernels.autocorr_kit` (the problem's formulas), this file imports
numpy, scipy and the standard library only (never milo_ray): the optimizer executor
uploads it beside the runner (:mod:`milo_ray.boundary.inside.optimizer_runner`), which gives
the names in :data:`GIVEN` to each program as module globals, bound to that program's
own :class:`Blocks` (one record per run). A program then holds only its own optimizer:
its ``CONFIG``, its ``STAGES`` and the stages no other program shares.

What is given:

* the ratchet: ``offer``, ``best``, ``best_score``, ``reset_best`` (:class:`Blocks`);
* the stage driver ``run_stages``;
* L-BFGS-B on the log-sum-exp smoothed max: ``lbfgs_smooth`` (one run), ``temperature_ladder``
  (rungs hot -> cold), ``polish`` (cold runs from the best point, cooling after a failure);
* ``upsample`` (refine the record's grid by an integer factor: same score, more freedom),
  ``jitter`` and ``warm_restarts`` (jittered restarts from the best point, the jitter
  adapting to success), ``normalize`` (heights O(1) for the scale-invariant problems);
* ready-made stages on those blocks, ``stage_upsample``, ``stage_ladder``, ``stage_polish``
  and ``stage_restarts``, which read their settings from the program's ``CONFIG`` under
  the keys :data:`STAGE_SETTINGS` names: a program that names them in ``STAGES`` and
  holds those keys in ``CONFIG`` needs no code of its own for them.

Every block's setting is a keyword argument (no default hides a tunable): a program
passes its ``CONFIG`` values, so its ``CONFIG`` stays the one place its tunables live. The bound
helpers call each other and the formulas of the kit, never a program's replacement of
a name (a program that defines its own ``lbfgs_smooth`` must define its own
``temperature_ladder`` too for the ladder to use it).
"""

import math
import time

import numpy as np

if __package__:  # imported as milo_ray.boundary.inside.optimizer_blocks (the runner on the host, tests)
    from milo_ray.kernels import autocorr_kit as kit
else:  # in the sandbox: the copy uploaded beside this file
    import autocorr_kit as kit

_LBFGS = ("lbfgs_memory", "erdos_sum_weight")
_POLISH = ("t_polish", "polish_cool", "polish_floor", "polish_maxiter")
# The ready-made stages and the keys of the program's CONFIG each one reads (the seeds'
# names for the blocks' settings).
STAGE_SETTINGS = {
    "upsample": ("upsample_factor", "max_points"),
    "ladder": ("t_hot", "t_cold", "rungs", "lbfgs_maxiter") + _LBFGS,
    "polish": _POLISH + _LBFGS,
    "restarts": ("restart_t_hot", "restart_rungs", "t_cold", "lbfgs_maxiter") + _POLISH + _LBFGS
                + ("restart_seconds", "restart_ladder_share", "jitter", "jitter_min", "jitter_shrink", "jitter_grow"),
}
# The names a program is given from here (the runner adds the formulas, PROBLEM and publish).
GIVEN = ("offer", "best", "best_score", "reset_best", "run_stages", "lbfgs_smooth", "temperature_ladder",
         "polish", "upsample", "jitter", "warm_restarts", "normalize") + tuple(f"stage_{s}" for s in STAGE_SETTINGS)
# The given names whose work may call L-BFGS (scipy.optimize): the runner imports it before
# optimize() for a program that names one (see optimizer_runner.import_what_it_names).
USES_LBFGS = ("run_stages", "lbfgs_smooth", "temperature_ladder", "polish", "warm_restarts", "stage_ladder",
              "stage_polish", "stage_restarts")


class _OutOfTime(Exception):
    pass


def normalize(h, problem):
    """First/third scores are scale-invariant: keep heights O(1) so step lengths and
    the optimizer's tolerances mean the same thing at every stage (Erdős: unchanged)."""
    if problem == kit.ERDOS:
        return h
    m = abs(float(np.mean(h)))
    return h / m if m > 0 else h


def lbfgs_smooth(h, temperature, problem, deadline, *, maxiter, memory, erdos_sum_weight):
    """Minimize the smoothed max at ``temperature`` (score units) with L-BFGS-B from ``h``
    for at most ``maxiter`` iterations with ``memory`` correction pairs, until
    ``deadline``; returns the point of lowest objective seen (feasible after ``project``).
    Bounds: h >= 0 (first), [0, 1] (Erdős). Erdős's sum n/2 is a quadratic penalty
    (``erdos_sum_weight * (sum h - n/2)^2 / (2n)``), not a reparametrization: a shift that
    restores the sum inside the optimizer would let heights leave [0, 1], where the
    smoothed value is lower than any feasible one, and the final projection would undo
    the gain. A uniform shift barely changes the Erdős score, so the projection after a
    penalized run costs little."""
    h = normalize(np.asarray(h, dtype=np.float64), problem)
    n = h.shape[0]
    seen = {"h": h.copy(), "f": math.inf}
    weight = erdos_sum_weight / n

    def fun(x):
        if time.monotonic() >= deadline:
            raise _OutOfTime
        f, g = kit.smooth_value_grad(x, temperature, problem)
        if problem == kit.ERDOS:
            d = float(x.sum()) - n / 2.0
            f, g = f + 0.5 * weight * d * d, g + weight * d
        if f < seen["f"]:
            seen["h"], seen["f"] = x.copy(), f
        return f, g

    # Here, not at the top: scipy.optimize costs ~0.3 s to import, which a program that
    # never calls L-BFGS should not pay (the runner imports this file for every program).
    from scipy.optimize import Bounds, minimize

    if problem == kit.FIRST:
        bounds = Bounds(np.zeros(n), np.full(n, np.inf))
    elif problem == kit.ERDOS:
        bounds = Bounds(np.zeros(n), np.ones(n))
    else:
        bounds = None
    try:
        minimize(fun, h, jac=True, method="L-BFGS-B", bounds=bounds,
                 options={"maxiter": int(maxiter), "maxcor": int(memory), "ftol": 1e-16, "gtol": 1e-14})
    except _OutOfTime:
        pass
    return seen["h"]


def jitter(h, sigma, rng, problem):
    """Multiplicative noise for the autocorrelation problems (keeps signs and zeros of
    h), additive noise for Erdős (heights at 0 or 1 may move inward)."""
    if problem == kit.ERDOS:
        return h + sigma * rng.standard_normal(h.shape[0])
    return h * (1.0 + sigma * rng.standard_normal(h.shape[0]))


def _problem_of(namespace: dict) -> str:
    problem = namespace.get("PROBLEM")
    if problem is None:
        raise RuntimeError("PROBLEM is not set: the runner sets the module attribute PROBLEM to one of "
                           f"{kit.PROBLEMS} before calling optimize")
    if problem not in kit.PROBLEMS:
        raise ValueError(f"PROBLEM: expected one of {kit.PROBLEMS}, got {problem!r}")
    return problem


class Blocks:
    """One program's record and the blocks that use it. The record (the ratchet) keeps a
    point, and publishes it, only when it is feasible and its exact score is strictly
    below the best so far. It publishes through ``namespace["publish"]`` (the program's
    module dict) at the time of the call, so whoever sets the program's ``publish``
    receives the ratchet's points too; ``run_stages`` finds the program's stages there."""

    def __init__(self, namespace: dict) -> None:
        self._namespace = namespace
        self._h = None
        self._score = math.inf

    # ------------------------------------------------------------ the ratchet

    def reset_best(self, h, problem, score=None) -> None:
        """Make ``h`` the record without publishing it, at its exact score (or ``score``:
        e.g. the lower of two equal-up-to-rounding scores of a refined point)."""
        self._h = np.array(h, dtype=np.float64)
        self._score = kit.score(h, problem) if score is None else float(score)

    def offer(self, h, problem) -> bool:
        """Project ``h``, score it exactly, keep and publish it if strictly better."""
        z = kit.project(h, problem)
        s = kit.score(z, problem)
        if s < self._score:
            self._h, self._score = z, s
            self._namespace["publish"](z.copy())
            return True
        return False

    def best(self):
        """A copy of the record."""
        return self._h.copy()

    def best_score(self) -> float:
        """The record's exact score (inf before a feasible point was kept)."""
        return self._score

    # ------------------------------------------------------------ the stage driver

    def run_stages(self, values, *, seed, deadline, stages, margin_s, margin_frac):
        """Run the stages named in ``stages`` (each ``x`` the program's
        ``stage_x(h, rng, deadline, problem)``) in order from ``values``: the record
        starts at ``values`` (at its projection when ``values`` is infeasible), each stage
        gets an equal share of the time left (one that ends early leaves its time to the
        next) and returns a point or None (keep the current one). Returns the best
        verified point, ``max(margin_s, margin_frac * budget)`` before ``deadline``
        (returning and serializing take time)."""
        problem = _problem_of(self._namespace)
        h = kit.project(np.asarray(values, dtype=np.float64), problem)
        self.reset_best(np.asarray(values, dtype=np.float64), problem)
        if not math.isfinite(self.best_score()):
            self.reset_best(h, problem)
        rng = np.random.default_rng(seed)
        start = time.monotonic()
        end = deadline - max(margin_s, margin_frac * max(0.0, deadline - start))
        for i, name in enumerate(stages):
            now = time.monotonic()
            if now >= end:
                break
            stage_deadline = now + (end - now) / (len(stages) - i)
            out = self._namespace["stage_" + name](h, rng, stage_deadline, problem)
            h = kit.project(out, problem) if out is not None else h
        return self.best()

    # ------------------------------------------------------------ L-BFGS on the smoothed max

    def temperature_ladder(self, h, deadline, problem, *, t_hot, t_cold, rungs, maxiter, memory,
                           erdos_sum_weight):
        """``lbfgs_smooth`` at ``rungs`` temperatures from ``t_hot`` down to ``t_cold``
        (geometric, relative to the record's score: T is in score units), each rung an
        equal share of the time left, offering each rung's point to the ratchet. Each rung
        continues from the previous rung's point, so a hot rung may leave the basin; the
        ratchet keeps the best verified point. Returns the last rung's point, projected."""
        rungs = max(1, int(rungs))
        for i in range(rungs):
            now = time.monotonic()
            if now >= deadline:
                break
            frac = i / (rungs - 1) if rungs > 1 else 1.0
            t_rel = t_hot * (t_cold / t_hot) ** frac
            rung_deadline = now + (deadline - now) / (rungs - i)
            out = lbfgs_smooth(h, t_rel * self.best_score(), problem, rung_deadline, maxiter=maxiter,
                               memory=memory, erdos_sum_weight=erdos_sum_weight)
            self.offer(out, problem)
            h = kit.project(out, problem)
        return h

    def polish(self, deadline, problem, *, t_start, cool, floor, maxiter, memory, erdos_sum_weight):
        """Cold ``lbfgs_smooth`` runs restarted from the record (a restart drops curvature
        pairs gathered far from it) at ``t_start`` relative to its score; after a run that
        did not improve, ``cool`` times colder; ends at ``deadline`` or below ``floor``.
        Returns the record."""
        t_rel = t_start
        while time.monotonic() < deadline and t_rel >= floor:
            out = lbfgs_smooth(self.best(), t_rel * self.best_score(), problem, deadline, maxiter=maxiter,
                               memory=memory, erdos_sum_weight=erdos_sum_weight)
            if not self.offer(out, problem):
                t_rel *= cool
        return self.best()

    # ------------------------------------------------------------ grid and restarts

    def upsample(self, problem, *, factor, max_points):
        """Repeat each height of the record ``factor`` times (when that stays within
        ``max_points``). The refined point has the same score, so it replaces the record
        without being published; later stages publish refined points. Returns the point
        to continue from (the record when nothing was refined)."""
        factor = int(factor)
        h = self.best()
        if factor <= 1 or h.shape[0] * factor > max_points:
            return h
        refined = kit.project(np.repeat(h, factor), problem)
        s = kit.score(refined, problem)
        if math.isfinite(s):
            # Keep the lower of the two (equal up to rounding): a later point must beat both.
            self.reset_best(refined, problem, score=min(s, self.best_score()))
        return refined

    def warm_restarts(self, deadline, rng, problem, *, ladder, polish, seconds, ladder_share, sigma, sigma_min,
                      shrink, grow):
        """Until ``deadline``: restart from the record jittered by ``sigma`` (``jitter``),
        run ``ladder(start, until)`` for ``ladder_share`` of the restart's ``seconds``,
        then ``polish(until)`` for the rest (the program's own local searches, offering to
        the ratchet). After a restart that improved the record the jitter grows by
        ``grow``, else it shrinks by ``shrink`` down to ``sigma_min``. Returns the record."""
        while True:
            now = time.monotonic()
            if now >= deadline - 0.05 * seconds:
                break
            restart_deadline = min(deadline, now + seconds)
            before = self.best_score()
            start = kit.project(jitter(self.best(), sigma, rng, problem), problem)
            ladder(start, now + ladder_share * (restart_deadline - now))
            polish(restart_deadline)
            if self.best_score() < before:
                sigma = sigma * grow
            else:
                sigma = max(sigma_min, sigma * shrink)
        return self.best()

    # ------------------------------------------------------------ ready-made stages

    def _settings(self, stage: str) -> dict:
        """The CONFIG values ``stage_<stage>`` reads; a clear error names missing keys."""
        config = self._namespace.get("CONFIG")
        keys = STAGE_SETTINGS[stage]
        missing = [k for k in keys if not isinstance(config, dict) or k not in config]
        if missing:
            raise KeyError(f"the given stage_{stage} reads CONFIG keys {missing}: add them to the program's "
                           f"CONFIG dict (it reads {list(keys)}), or define stage_{stage} in the program")
        return {k: config[k] for k in keys}

    def _ladder(self, h, deadline, problem, c, t_hot, rungs):
        return self.temperature_ladder(h, deadline, problem, t_hot=t_hot, t_cold=c["t_cold"], rungs=rungs,
                                       maxiter=c["lbfgs_maxiter"], memory=c["lbfgs_memory"],
                                       erdos_sum_weight=c["erdos_sum_weight"])

    def _polish(self, deadline, problem, c):
        return self.polish(deadline, problem, t_start=c["t_polish"], cool=c["polish_cool"], floor=c["polish_floor"],
                           maxiter=c["polish_maxiter"], memory=c["lbfgs_memory"],
                           erdos_sum_weight=c["erdos_sum_weight"])

    def stage_upsample(self, h, rng, deadline, problem):
        """``upsample`` by CONFIG's ``upsample_factor`` up to ``max_points``."""
        c = self._settings("upsample")
        return self.upsample(problem, factor=c["upsample_factor"], max_points=c["max_points"])

    def stage_ladder(self, h, rng, deadline, problem):
        """``temperature_ladder`` from ``h``, ``rungs`` from ``t_hot`` to ``t_cold``."""
        c = self._settings("ladder")
        return self._ladder(h, deadline, problem, c, c["t_hot"], c["rungs"])

    def stage_polish(self, h, rng, deadline, problem):
        """``polish`` from ``t_polish``."""
        return self._polish(deadline, problem, self._settings("polish"))

    def stage_restarts(self, h, rng, deadline, problem):
        """``warm_restarts``: a ladder of ``restart_rungs`` from ``restart_t_hot``, then
        polishing, each restart ``restart_seconds`` long."""
        c = self._settings("restarts")
        return self.warm_restarts(
            deadline, rng, problem,
            ladder=lambda start, until: self._ladder(start, until, problem, c, c["restart_t_hot"], c["restart_rungs"]),
            polish=lambda until: self._polish(until, problem, c), seconds=c["restart_seconds"],
            ladder_share=c["restart_ladder_share"], sigma=c["jitter"], sigma_min=c["jitter_min"],
            shrink=c["jitter_shrink"], grow=c["jitter_grow"])

    def given(self) -> dict:
        """The names of :data:`GIVEN`, bound to this record."""
        names = {"lbfgs_smooth": lbfgs_smooth, "jitter": jitter, "normalize": normalize}
        names.update((name, getattr(self, name)) for name in GIVEN if name not in names)
        return names
