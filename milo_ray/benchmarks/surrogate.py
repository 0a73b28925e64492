"""SurrogateBenchmark: a calibrated SIMULATOR of an agentic benchmark with ground truth.

No agent runs here. A harness is reduced to the mechanisms ``detect_mechanisms`` finds
in its source (present and wired, with literal parameters), and the quality model in
``surrogate_quality`` turns (mechanisms, task) into a distribution over failure-mode
endings, partial credit, tokens and seconds. ``SurrogateExecutor`` samples from it;
``true_quality`` gives the exact expectation; ``best_reachable`` searches mechanism sets
exhaustively (then a parameter grid) for the optimum. Calibration solves one logit
offset per (preset, seed, ``calibrate_to``) so that a seed harness's test resolve rate
equals the preset's target (the paper's initial-harness number): the best seed by
default, ``stock`` in the SSR experiments (papers/002 starts from the platform default).

Modules: ``surrogate_tasks`` (presets, task generation, splits), ``surrogate_quality``
(the model), ``surrogate_calibration`` (the offset and the calibrated pool),
``surrogate_traces`` (trajectory + ctrf text), ``surrogate_executor`` (the executor, chosen
by the ``executor`` config group, not by the benchmark).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from milo_ray.benchmarks import surrogate_quality as Q
from milo_ray.benchmarks.base import SplitTasks, seed_names
from milo_ray.benchmarks.surrogate_calibration import (
    base_logits, calibrated_tasks, check_calibrate_to, quality, task_arrays,
)
from milo_ray.benchmarks.surrogate_tasks import PRESETS, Preset, get_preset
from milo_ray.core.tasks import Task
from milo_ray.harness.mechanisms import MECHANISMS, detect_mechanisms
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import load_seeds

__all__ = ["PRESETS", "SurrogateBenchmark", "base_logits", "calibrated_tasks", "task_arrays"]


class SurrogateBenchmark(SplitTasks):
    """Benchmark + GroundTruth over a simulated task pool (see module docstring).

    preset: one of ``PRESETS`` (surrogate_swepro, surrogate_deepswe, surrogate_tb21, surrogate_gaia2,
    surrogate_paperbench).
    seed: generates the task pool and the splits (rollout randomness comes from the run seed).
    label_noise: probability that a failed rollout's trace ending shows a different,
    or an ambiguous, failure mode than the one that occurred (scores are unaffected).
    calibrate_to: the seed harness whose test resolve rate calibration puts at the
    preset's target (None: the best seed).
    audit_split: also expose the preset's ``audit`` split (160 tasks disjoint from every
    other split, for the racing audit); off for runs, whose splits stay the paper's.
    seeds: the harnesses the methods start from (``eval`` evaluates): bundled seed names or
    paths of harness directories of one's own (None: the preset's five). The surrogate
    grades any ``harness.py`` by the mechanisms it finds in it; calibration stays on the
    bundled seeds, so adding a harness of one's own changes no other harness's score.
    """

    def __init__(self, preset: str = "surrogate_swepro", seed: int = 0, label_noise: float = 0.1,
                 calibrate_to: str | None = None, audit_split: bool = False, seeds: list[str] | None = None) -> None:
        if not 0.0 <= float(label_noise) <= 1.0:
            raise ValueError(f"benchmark.label_noise={label_noise}: must be in [0, 1] (the chance a failed trace shows "
                             "the wrong failure mode)")
        self.preset: Preset = get_preset(preset)
        check_calibrate_to(preset, calibrate_to)
        self.seed_names = seed_names(seeds)
        self.name = preset
        self.seed = int(seed)
        self.label_noise = float(label_noise)
        self.calibrate_to = calibrate_to
        self.audit_split = bool(audit_split)
        self.offset, self._splits = calibrated_tasks(preset, self.seed, calibrate_to, self.audit_split)
        self._by_id: dict[str, Task] = {}
        for split in self._splits.values():  # first split wins: search/train copy over test copy
            for t in split:
                self._by_id.setdefault(t.task_id, t)
        self._arrays: dict[str, Q.TaskArrays] = {}

    # ---------------------------------------------------------------- Benchmark
    def executor_config(self, model: Any = None) -> dict[str, Any]:
        """The ``executor`` spec ``conf/executor/surrogate.yaml`` composes for this benchmark
        (``model``: a model mapping; None: the offline model), for code that builds a
        RolloutScheduler without the entry point (tests, scripts). Not part of the
        Benchmark protocol: a run takes its executor from the ``executor`` config group."""
        from milo_ray.config.schemas import model_config

        return {"_target_": "milo_ray.benchmarks.surrogate_executor.SurrogateExecutor", "preset": self.name,
                "seed": self.seed, "label_noise": self.label_noise, "calibrate_to": self.calibrate_to,
                "model": dataclasses.asdict(model_config(model))}

    def seed_harnesses(self) -> list[Harness]:
        return load_seeds(self.seed_names or list(self.preset.seed_names))

    # -------------------------------------------------------------- GroundTruth
    def _ta(self, split: str) -> Q.TaskArrays:
        if split not in self._arrays:
            self._arrays[split] = task_arrays(self.tasks(split))
        return self._arrays[split]

    def quality_of(self, mechanisms: dict[str, dict[str, Any]], split: str = "test") -> dict[str, float]:
        """Exact expected quality of a mechanism set {name: params} on a split."""
        unknown = set(mechanisms) - set(MECHANISMS)
        if unknown:
            raise ValueError(f"mechanisms: unknown {sorted(unknown)}")
        return quality(mechanisms, self._ta(split), self.preset.effect_scale, self.preset.credit)

    def true_quality(self, harness: Harness, split: str) -> dict[str, float]:
        """Exact {'score', 'resolve_rate', 'output_tokens', 'seconds'} per task, averaged over
        the split. A harness whose source does not compile scores 0 (as its rollouts do)."""
        try:
            compile(harness.source, "harness.py", "exec")
        except (SyntaxError, ValueError):
            return {"score": 0.0, "resolve_rate": 0.0, "output_tokens": 0.0, "seconds": 0.0}
        return self.quality_of(detect_mechanisms(harness.source), split)

    def best_reachable(self, split: str = "test", metric: str = "score", top_k: int = 8) -> dict[str, Any]:
        """The optimum over mechanism sets: exhaustive over every feasible subset at default
        parameters (vectorized closed form), then coordinate ascent over each mechanism's
        parameter grid for the ``top_k`` best subsets. Returns the quality, the mechanism
        set with parameters, and the number of subsets evaluated."""
        if metric not in ("score", "resolve_rate"):
            raise ValueError(f"metric: 'score' or 'resolve_rate', got {metric!r}")
        ta = self._ta(split)
        n = len(Q.NAMES)
        tb = Q.build_tables({}, self.preset.effect_scale, self.preset.credit)
        req = [(Q.IDX[a], [Q.IDX[r] for r in MECHANISMS[a].requires]) for a in Q.NAMES if MECHANISMS[a].requires]
        best_vals: list[tuple[float, int]] = []
        total = 0
        chunk = 4096
        codes = np.arange(1 << n, dtype=np.int64)
        bits = 1 << np.arange(n, dtype=np.int64)
        for start in range(0, 1 << n, chunk):
            c = codes[start:start + chunk]
            X = (c[:, None] & bits[None, :]) > 0
            ok = np.ones(len(c), dtype=bool)
            for i, rs in req:
                for r in rs:
                    ok &= ~X[:, i] | X[:, r]
            c, X = c[ok], X[ok]
            if not len(c):
                continue
            total += len(c)
            vals = Q.expectations(Q.aggregate(X, tb), ta)[metric]
            k = min(top_k, len(vals))
            top = np.argpartition(-vals, k - 1)[:k]
            best_vals += [(float(vals[j]), int(c[j])) for j in top]
            best_vals = sorted(best_vals, reverse=True)[:top_k]
        best: tuple[float, dict[str, dict[str, Any]]] | None = None
        for _v, code in best_vals:
            mechs = {Q.NAMES[i]: dict(MECHANISMS[Q.NAMES[i]].params) for i in range(n) if code >> i & 1}
            val = self.quality_of(mechs, split)[metric]
            improved = True
            while improved:  # coordinate ascent over the parameter grid
                improved = False
                for name in sorted(mechs):
                    for p, grid in MECHANISMS[name].grid.items():
                        for g in grid:
                            trial = {**mechs, name: {**mechs[name], p: g}}
                            tv = self.quality_of(trial, split)[metric]
                            if tv > val + 1e-12:
                                mechs, val, improved = trial, tv, True
            if best is None or val > best[0]:
                best = (val, mechs)
        assert best is not None
        return {"quality": self.quality_of(best[1], split), "mechanisms": best[1], "metric": metric,
                "split": split, "subsets_evaluated": total}

