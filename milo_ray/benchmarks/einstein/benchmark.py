"""The instance-level track as a benchmark (MILO App. E): one task per (problem, start).

A task asks for an optimizer program (a harness whose entry is ``optimize``) that
improves a given starting construction of one EinsteinArena problem within a time
budget. The task carries only the start's spec (``metadata["start"]``); a worker
rebuilds the start with :func:`~milo_ray.benchmarks.einstein.starts.start_values`, so
nothing large travels with a task. How a program runs on a task is the executor's
business (``executor=optimizer``).

The default bank of starts, per problem (see :func:`default_starts`): AlphaEvolve's
published construction at its own size and refined x4 and x16 (same step function,
same score); the x4 one perturbed (relative noise 1e-3 and 1e-2, seeds 0 and 1); and
two weak baselines at a few hundred points, the flat function and seeded random
heights. Ten tasks per problem, thirty in all.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from milo_ray.benchmarks.base import BenchmarkDataMissing, SplitTasks
from milo_ray.benchmarks.einstein.problems import PROBLEMS, check, score
from milo_ray.benchmarks.einstein.starts import (
    BASES, construction_digest, load_construction, published, ship_construction, start_values,
)
from milo_ray.benchmarks.splits import DEFAULT_SPLITS, split_sizes
from milo_ray.core.seeds import derive_seed
from milo_ray.core.tasks import Task
from milo_ray.harness.model import ENTRY_FILE, Harness

SEEDS_DIR = Path(__file__).resolve().parent / "seeds"

# Short, filesystem-safe names for task ids (``first-ae-n2400-p0.001-s1``).
PROBLEM_TAGS = {"first_autocorrelation": "first", "third_autocorrelation": "third",
                "erdos_minimum_overlap": "erdos"}
BASE_TAGS = {"alphaevolve": "ae", "constant": "const", "random": "rand", "file": "file"}
SPEC_FIELDS = ("base", "n", "perturb", "seed", "problem", "path")

# Refinement factors of the published construction in the default bank; the largest
# (x16: 9,600 points for the first problem) keeps an FFT score well under a millisecond
# and stays far below the 65,536 points a construction may have.
DEFAULT_REFINEMENTS = (1, 4, 16)
DEFAULT_PERTURB_FACTOR = 4
DEFAULT_PERTURBS = (1e-3, 1e-2)
DEFAULT_PERTURB_SEEDS = (0, 1)
BASELINE_N = 300
BASELINE_RANDOM_SEEDS = (0, 1)

# Wall time a rollout needs beyond the program's own deadline + grace: starting the
# sandboxed interpreter (numpy/scipy imports) and checking and scoring the final point.
SCORING_ALLOWANCE_S = 30.0

DEFINITIONS = {
    "first_autocorrelation": (
        "First autocorrelation inequality. A construction is a vector h of n step heights on n equal steps of "
        "[-1/4, 1/4], all heights >= 0. Its score is 2n * max(h*h) / (sum h)^2, where h*h is the full discrete "
        "autoconvolution of h (length 2n-1). Lower is better."),
    "third_autocorrelation": (
        "Third autocorrelation inequality. A construction is a vector h of n step heights on n equal steps of "
        "[-1/4, 1/4]; heights may be negative. Its score is 2n * |max(h*h)| / (sum h)^2, where h*h is the full "
        "discrete autoconvolution of h (length 2n-1): the absolute value of the maximum, not the maximum of "
        "absolute values. sum h must not be 0. Lower is better."),
    "erdos_minimum_overlap": (
        "Erdos minimum overlap. A construction is a vector h of n step heights on n equal steps of [-1/4, 1/4], "
        "every height in [0, 1], with sum h = n/2 exactly (tolerance 1e-9 * n; heights may leave [0, 1] by at "
        "most 1e-12). Its score is 2 * max(correlate(h, 1 - h, mode='full')) / n. Lower is better."),
}

# What the runner gives a program as module globals (milo_ray.boundary.inside.optimizer_runner:
# kernels/autocorr_kit.py and boundary/inside/optimizer_blocks.py).
GIVEN_NAMES = """\
The runner gives the program these module globals (no import needed; a name the program defines itself replaces
the given one): PROBLEM, the problem's name ({problem!r}); publish(values), which records an improved point (if
the program overruns its deadline it is killed, and the last published point counts); the problem's exact
formulas score(h, problem) (the FFT score, inf when h is infeasible), smooth_value_grad(h, temperature, problem)
(the log-sum-exp smoothed max over shifts and its exact gradient), project(h, problem) (a nearby feasible point),
shift_values, weighted_grad, conv, xcorr_valid and FIRST, THIRD, ERDOS, PROBLEMS; a ratchet, offer(h, problem)
(project, score exactly, publish only a strictly better point), best(), best_score(), reset_best(h, problem,
score=None); run_stages(values, seed=, deadline=, stages=, margin_s=, margin_frac=), which runs each
stage_<name>(h, rng, deadline, problem) of `stages` in order with an equal share of the time left and returns
best(); building blocks, every setting a keyword argument: lbfgs_smooth(h, temperature, problem, deadline,
maxiter=, memory=, erdos_sum_weight=) (L-BFGS-B on the smoothed max), temperature_ladder(h, deadline, problem,
t_hot=, t_cold=, rungs=, maxiter=, memory=, erdos_sum_weight=), polish(deadline, problem, t_start=, cool=, floor=,
maxiter=, memory=, erdos_sum_weight=), upsample(problem, factor=, max_points=), warm_restarts(deadline, rng,
problem, ladder=, polish=, seconds=, ladder_share=, sigma=, sigma_min=, shrink=, grow=), jitter(h, sigma, rng,
problem), normalize(h, problem); and ready-made stages stage_upsample, stage_ladder, stage_polish, stage_restarts
on those blocks, which read their settings from the program's CONFIG dict (a missing key is named in the error;
a stage_<name> the program defines replaces the given one)."""

CONTRACT = """\
Write a Python file harness.py that defines

    def optimize(values, *, seed, deadline):
        # values: np.ndarray of float64, the start; seed: int; deadline: a time.monotonic() value
        return best_values  # np.ndarray of float64 for the same problem

""" + GIVEN_NAMES + """
Publish every strictly better feasible point. The returned array may have a different length than the start
(refining the grid is allowed). Import only numpy, scipy and the standard library (never milo_ray); the program
runs in a sandbox without network access."""


def default_starts(problem: str) -> list[dict[str, Any]]:
    """The default bank of start specs of ``problem`` (see the module docstring)."""
    n0 = len(published(problem))
    specs = [{"base": "alphaevolve", "n": n0 * f, "perturb": 0.0, "seed": 0} for f in DEFAULT_REFINEMENTS]
    specs += [{"base": "alphaevolve", "n": n0 * DEFAULT_PERTURB_FACTOR, "perturb": p, "seed": s}
              for p in DEFAULT_PERTURBS for s in DEFAULT_PERTURB_SEEDS]
    specs.append({"base": "constant", "n": BASELINE_N, "perturb": 0.0, "seed": 0})
    specs += [{"base": "random", "n": BASELINE_N, "perturb": 0.0, "seed": s} for s in BASELINE_RANDOM_SEEDS]
    return specs


def task_id(problem: str, spec: Mapping[str, Any]) -> str:
    """``<problem>-<base>-n<n>[-p<perturb>][-s<seed>]`` (a file start's base carries its
    content digest: ``file-1a2b3c4d``); the seed appears only where it changes the start
    (perturbed or random), so two ids differ exactly when the starts do."""
    base = BASE_TAGS[spec["base"]] + (f"-{spec['digest'][:8]}" if spec["base"] == "file" else "")
    tid = f"{PROBLEM_TAGS[problem]}-{base}-n{spec['n']}"
    if spec["perturb"]:
        tid += f"-p{spec['perturb']:g}"
    if spec["perturb"] or spec["base"] == "random":
        tid += f"-s{spec['seed']}"
    return tid


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def normalize_spec(raw: Any, field: str) -> tuple[dict[str, Any], str | None]:
    """(the start spec with every field explicit, the problem it is restricted to or
    None), or ``ValueError`` naming ``field.<key>``. The seed is set to 0 where it has no
    effect (an unperturbed alphaevolve or constant start), so equal starts compare equal."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{field}={raw!r}: expected a mapping like {{base: alphaevolve, n: 2400, perturb: 0.001, "
                         "seed: 1}")
    unknown = [k for k in raw if k not in SPEC_FIELDS]
    if unknown:
        raise ValueError(f"{field}.{unknown[0]}: unknown field; a start has {list(SPEC_FIELDS)}")
    base = raw.get("base", "alphaevolve")
    if base not in BASES:
        raise ValueError(f"{field}.base={base!r}: choose one of {list(BASES)}")
    problem = raw.get("problem")
    if problem is not None and problem not in PROBLEMS:
        raise ValueError(f"{field}.problem={problem!r}: choose one of {list(PROBLEMS)} (or omit it: every problem)")
    n = raw.get("n")
    if n is not None and (not _is_int(n) or n < 2):
        raise ValueError(f"{field}.n={n!r}: must be an integer >= 2 (grid points)")
    if n is None and base not in ("alphaevolve", "file"):
        raise ValueError(f"{field}.n: a {base} start needs its number of grid points")
    path = raw.get("path")
    if (base == "file") != (path is not None):
        raise ValueError(f"{field}.path: " + ("a file start needs the path of a stored construction (e.g. "
                                              "records/first_autocorrelation.json)" if base == "file" else
                                              f"only a file start reads one (base is {base})"))
    if base == "file" and (not isinstance(path, str) or not path):
        raise ValueError(f"{field}.path={path!r}: must be a file path")
    perturb = raw.get("perturb", 0.0)
    if not _is_number(perturb) or perturb < 0:
        raise ValueError(f"{field}.perturb={perturb!r}: must be a finite number >= 0 (relative noise; 0: none)")
    seed = raw.get("seed", 0)
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"{field}.seed={seed!r}: must be an integer >= 0")
    effective = bool(perturb) or base == "random"
    spec = {"base": base, "n": n, "perturb": float(perturb), "seed": int(seed) if effective else 0}
    if base == "file":
        spec["path"] = str(Path(path).expanduser().resolve())
    return spec, problem


def describe_start(problem: str, spec: Mapping[str, Any]) -> str:
    """The start of ``spec`` in words (``n = 2400 grid points, AlphaEvolve's ...``)."""
    what = {"alphaevolve": "AlphaEvolve's published construction"
                           + (f" ({len(published(problem))} points) refined to {spec['n']} points by repeating each "
                              "height (the same step function, the same score)"
                              if spec["n"] != len(published(problem)) else ""),
            "constant": "the flat function (all heights equal)",
            "random": f"uniform random heights (seed {spec['seed']})",
            "file": f"a construction found earlier (stored in {Path(spec.get('path', '')).name})"}[spec["base"]]
    if spec["perturb"]:
        what += (f", each height multiplied by (1 + {spec['perturb']:g} * standard normal noise, seed {spec['seed']}) "
                 "and projected back onto the constraints")
    return f"n = {spec['n']} grid points, {what}."


def instruction(problem: str, spec: Mapping[str, Any], start_score: float, budget_s: float) -> str:
    """The self-contained text an agent writing an optimizer program reads."""
    return "\n\n".join([
        f"Problem: {problem}.\n{DEFINITIONS[problem]}",
        f"Start: {describe_start(problem, spec)} Its score is {start_score:.10g}.",
        "Task: improve the start as much as possible (a lower score). The reward is the relative gain over the "
        "start's score on a log scale; an infeasible point or one no better than the start earns 0.",
        CONTRACT.format(problem=problem),
        f"Budget: optimize has {budget_s:g} s of wall time (until `deadline`); return or publish before it.",
    ])


def stratified_splits(groups: Mapping[str, list[str]], sizes: Mapping[str, Any], *,
                      seed: int) -> dict[str, list[str]]:
    """Disjoint splits drawn within each group (problem) of task ids: fractions are of
    each group's tasks, counts are per group. A pooled draw over ten tasks per problem
    can leave a problem nearly absent from the search split (the default bank, pooled
    with seed 0, gave search 8 of the 10 third-autocorrelation tasks and 3 Erdős ones);
    drawn per problem, every split sees every problem in proportion. Each group is
    shuffled by its own derived seed after sorting, so the draw depends only on the ids
    and ``seed``; a split empty over all groups is refused."""
    out: dict[str, list[str]] = {name: [] for name in sizes}
    for group, ids in groups.items():
        ids = sorted(ids)
        counts = split_sizes(len(ids), sizes, field=f"benchmark.splits (per problem; {group} has {len(ids)} tasks)")
        perm = np.random.default_rng(derive_seed(seed, "benchmark-splits", group)).permutation(len(ids))
        start = 0
        for name, c in counts.items():
            out[name] += [ids[i] for i in perm[start:start + c]]
            start += c
    empty = [name for name, ids in out.items() if not ids]
    if empty:
        raise ValueError(f"benchmark.splits: split(s) {empty} would get no task; give them a larger share or drop them")
    return {name: sorted(ids) for name, ids in out.items()}


class EinsteinBenchmark(SplitTasks):
    """EinsteinArena problems as tasks for optimizer programs (``artifact_entry = "optimize"``).

    problem: one of :data:`~milo_ray.benchmarks.einstein.problems.PROBLEMS`, or None for all three.
    starts: start specs ``{base, n, perturb, seed}`` (see :mod:`.starts`), each optionally
      restricted to one problem by a ``problem`` field (a spec without it applies to every
      selected problem; one restricted to an unselected problem is skipped). An
      alphaevolve start without ``n`` keeps the published size. None: :func:`default_starts`.
    budget_s: each optimizer run's own wall-time budget (its ``deadline``).
    grace_s: how long past the deadline the executor waits before killing the program;
      a task's ``time_cap_s`` is ``budget_s + grace_s``.
    splits / split_seed: split name -> fraction (floats) of each problem's tasks or count
      (ints) per problem, drawn within each problem (:func:`stratified_splits`). None:
      search/val/test = 0.5/0.25/0.25; MILO reads ``search`` and SSR falls back to it
      when the benchmark has no ``train``.
    seeds: seed program names (directory names under ``seeds_dir``); None: all of them.
    seeds_dir: the directory of seed programs ``<name>/harness.py``; None: the bundled
      ``milo_ray/benchmarks/einstein/seeds``.
    """

    artifact_entry = "optimize"
    name = "einstein"
    # The config fields naming the optimizer programs (``<field>`` and ``<field>_dir``):
    # here the seeds the methods evolve.
    programs_field = "seeds"

    def __init__(self, problem: str | None = None, starts: list[dict] | None = None, budget_s: float = 20.0,
                 grace_s: float = 5.0, splits: Mapping[str, Any] | None = None, split_seed: int = 0,
                 seeds: list[str] | None = None, seeds_dir: str | None = None):
        if problem is not None and problem not in PROBLEMS:
            raise ValueError(f"benchmark.problem={problem!r}: choose one of {list(PROBLEMS)} (or null: all three)")
        if not _is_number(budget_s) or budget_s <= 0:
            raise ValueError(f"benchmark.budget_s={budget_s!r}: must be a positive number of seconds")
        if not _is_number(grace_s) or grace_s < 0:
            raise ValueError(f"benchmark.grace_s={grace_s!r}: must be a number of seconds >= 0")
        if not _is_int(split_seed):
            raise ValueError(f"benchmark.split_seed={split_seed!r}: must be an integer")
        if splits is not None and not isinstance(splits, Mapping):
            raise ValueError(f"benchmark.splits={splits!r}: must map split names to fractions or counts")
        if starts is not None and (isinstance(starts, (str, Mapping)) or not isinstance(starts, (list, tuple))
                                   or not starts):
            raise ValueError(f"benchmark.starts={starts!r}: must be a non-empty list of start specs (or null: "
                             "the default bank)")
        if seeds is not None and (isinstance(seeds, str) or not all(isinstance(s, str) and s for s in seeds)):
            raise ValueError(f"benchmark.{self.programs_field}={seeds!r}: must be a list of seed program names (or "
                             "null: all)")
        self.problems = (problem,) if problem else tuple(PROBLEMS)
        self.budget_s, self.grace_s = float(budget_s), float(grace_s)
        self.seed_names = list(seeds) if seeds else None
        self.seeds_dir = Path(seeds_dir).expanduser() if seeds_dir else SEEDS_DIR
        self._built = self._build(starts)
        # Splits are drawn over starts: the tasks sharing one start (meta["start_id"]; a
        # variant may pose one start several ways) always land in the same split.
        units: dict[str, list[str]] = {}
        groups: dict[str, list[str]] = {}
        for tid, (meta, _) in self._built.items():
            unit = meta.get("start_id", tid)
            if unit not in units:
                groups.setdefault(meta["problem"], []).append(unit)
            units.setdefault(unit, []).append(tid)
        assignment = stratified_splits(groups, dict(splits.items()) if splits else DEFAULT_SPLITS, seed=split_seed)
        self._splits = {name: [self._task(t, name) for u in ids for t in units[u]] for name, ids in assignment.items()}
        self._by_id = {t.task_id: t for ts in self._splits.values() for t in ts}

    def _build(self, starts: list[dict] | None) -> dict[str, tuple[dict[str, Any], str]]:
        """task id -> (metadata, instruction), in bank order. Every start is built and
        checked once, so a spec that yields no feasible start is refused here, naming it."""
        out: dict[str, tuple[dict[str, Any], str]] = {}
        origin: dict[str, str] = {}
        for problem in self.problems:
            if starts is None:
                entries = [(f"default start {i} of {problem}", s) for i, s in enumerate(default_starts(problem))]
            else:
                entries = []
                for i, raw in enumerate(starts):
                    spec, only = normalize_spec(raw, f"benchmark.starts[{i}]")
                    if only is None or only == problem:
                        entries.append((f"benchmark.starts[{i}]", spec))
            if not entries:
                raise ValueError(f"benchmark.starts: no start for problem {problem} (add one without a problem field "
                                 f"or with problem: {problem})")
            for field, spec in entries:
                spec = dict(spec)
                n0 = len(published(problem))
                if spec["base"] == "alphaevolve":
                    spec["n"] = spec["n"] or n0
                    if spec["n"] % n0:
                        raise ValueError(f"{field}.n={spec['n']}: an alphaevolve start of {problem} refines its "
                                         f"{n0} published points, so n must be a multiple of {n0}")
                if spec["base"] == "file":
                    try:
                        stored = load_construction(spec["path"], problem)
                    except ValueError as exc:
                        raise ValueError(f"{field}: {exc}") from None
                    spec["n"], spec["digest"] = spec["n"] or stored.size, construction_digest(stored)
                    spec["files"] = ship_construction(spec["path"])  # workers read the content, not the path
                    if spec["n"] % stored.size:
                        raise ValueError(f"{field}.n={spec['n']}: a file start refines its {stored.size} points, so "
                                         f"n must be a multiple of {stored.size}")
                values = start_values(spec, problem)
                reason = check(problem, values)
                if reason:
                    raise ValueError(f"{field}: the start of {problem} is infeasible: {reason}")
                tid = task_id(problem, spec)
                if tid in out:
                    raise ValueError(f"{field}: the same start of {problem} as {origin[tid]} (task {tid}); "
                                     "drop one of them")
                origin[tid] = field
                meta = {"format": "einstein", "problem": problem, "start": spec, "budget_s": self.budget_s}
                out[tid] = (meta, instruction(problem, spec, score(problem, values), self.budget_s))
        return out

    def _task(self, tid: str, split: str) -> Task:
        # An optimizer program calls no model, so a task has no token cap (0).
        meta, text = self._built[tid]
        return Task(task_id=tid, split=split, instruction=text, time_cap_s=self.budget_s + self.grace_s,
                    token_cap=0, metadata={**meta, "start": dict(meta["start"])},
                    grading_cap_s=SCORING_ALLOWANCE_S)

    def seed_harnesses(self) -> list[Harness]:
        """The seed optimizer programs (:meth:`programs`)."""
        return self.programs()

    def programs(self) -> list[Harness]:
        """The optimizer programs, one per directory ``seeds_dir/<name>/harness.py``
        (named by the directory), in name order or in the order ``seeds`` lists them.
        Errors name the config fields as :attr:`programs_field` says."""
        root, field = self.seeds_dir, self.programs_field
        if not root.is_dir():
            raise BenchmarkDataMissing(f"benchmark.{field}_dir={str(root)!r}: no such directory (it should hold one "
                                       f"directory per seed program, each with {ENTRY_FILE})")
        found = {d.name: d for d in sorted(root.iterdir())
                 if d.is_dir() and not d.name.startswith((".", "_")) and (d / ENTRY_FILE).is_file()}
        if not found:
            raise BenchmarkDataMissing(f"benchmark.{field}_dir={str(root)!r}: holds no seed program (a directory "
                                       f"<name>/{ENTRY_FILE})")
        names = self.seed_names or list(found)
        unknown = [s for s in names if s not in found]
        if unknown:
            raise ValueError(f"benchmark.{field}: unknown seed program(s) {unknown}; {root} has {list(found)}")
        return [Harness.from_dir(found[s], name=s) for s in names]
