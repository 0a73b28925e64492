"""SurrogateBenchmark: a calibrated SIMULATOR of an agentic benchmark with ground truth.

No agent runs here. A harness is reduced to the mechanisms ``detect_mechanisms`` finds
in its source (present and wired, with literal parameters), and the quality model in
``surrogate_quality`` turns (mechanisms, task) into a distribution over failure-mode
endings, partial credit, tokens and seconds. ``SurrogateExecutor`` samples from it;
``true_quality`` gives the exact expectation; ``best_reachable`` searches mechanism sets
exhaustively (then a parameter grid) for the optimum. Calibration solves one logit
offset per (preset, seed) so the best seed harness's test resolve rate equals the
preset's target (the paper's initial-harness number).

Modules: ``surrogate_tasks`` (presets, task generation, splits), ``surrogate_quality``
(the model), ``surrogate_traces`` (trajectory + ctrf text), ``surrogate_executor``.
"""

from __future__ import annotations

import dataclasses
import itertools
from functools import lru_cache
from typing import Any

import numpy as np

from milo_ray.benchmarks import surrogate_quality as Q
from milo_ray.benchmarks.surrogate_tasks import PRESETS, Preset, assign_splits, generate_tasks, get_preset
from milo_ray.execution.types import Task
from milo_ray.harness.mechanisms import FAILURE_MODES, MECHANISMS, detect_mechanisms
from milo_ray.harness.model import Harness

__all__ = ["PRESETS", "SurrogateBenchmark", "SurrogateExecutor", "base_logits", "calibrated_tasks", "task_arrays"]


def base_logits(task_meta: dict[str, Any], offset: float) -> np.ndarray:
    prop = np.asarray(task_meta["propensity"], dtype=float)
    return offset + task_meta["difficulty"] + np.log(np.maximum(prop, 1e-9) * len(FAILURE_MODES))


def task_arrays(tasks: list[Task]) -> Q.TaskArrays:
    md = [t.metadata for t in tasks]
    return Q.TaskArrays(
        L=np.array([m["base_logits"] for m in md]), n_tests=np.array([m["n_tests"] for m in md], dtype=float),
        tokens=np.array([m["tokens"] for m in md]), seconds=np.array([m["seconds"] for m in md]),
        caps=np.array([t.time_cap_s for t in tasks]))


def _quality(mechs: dict[str, dict[str, Any]], ta: Q.TaskArrays, scale: float) -> dict[str, float]:
    tb = Q.build_tables(mechs, scale)
    out = Q.expectations(Q.aggregate(Q.indicator(mechs), tb), ta)
    return {k: float(v[0]) for k, v in out.items()}


@lru_cache(maxsize=16)
def _calibrate(preset_name: str, seed: int) -> float:
    """The logit offset that puts the best seed's test resolve rate on the target."""
    from milo_ray.harness.seeds import load_seeds

    preset = get_preset(preset_name)
    raw = generate_tasks(preset, seed)
    test = assign_splits(preset, raw, seed)["test"]
    seeds = [detect_mechanisms(h.source) for h in load_seeds(preset.seed_names)]

    def best(offset: float) -> float:
        tasks = [dataclasses.replace(t, metadata={**t.metadata, "base_logits": base_logits(t.metadata, offset)})
                 for t in test]
        ta = task_arrays(tasks)
        return max(_quality(s, ta, preset.effect_scale)["resolve_rate"] for s in seeds)

    lo, hi = -12.0, 6.0  # resolve rate falls as the offset rises
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if best(mid) > preset.target_resolve:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@lru_cache(maxsize=16)
def calibrated_tasks(preset_name: str, seed: int) -> tuple[float, dict[str, tuple[Task, ...]]]:
    """(offset, splits) with ``base_logits`` in every task's metadata."""
    preset = get_preset(preset_name)
    offset = _calibrate(preset_name, seed)
    raw = generate_tasks(preset, seed)
    raw = [dataclasses.replace(t, metadata={**t.metadata, "base_logits": [float(x) for x in base_logits(t.metadata, offset)]})
           for t in raw]
    return offset, {k: tuple(v) for k, v in assign_splits(preset, raw, seed).items()}


class SurrogateBenchmark:
    """Benchmark + GroundTruth over a simulated task pool (see module docstring).

    preset: one of ``PRESETS`` (surrogate_swepro, surrogate_deepswe, surrogate_tb21).
    seed: generates the task pool and the splits (rollout randomness comes from the run seed).
    label_noise: probability that a failed rollout's trace ending shows a different,
    or an ambiguous, failure mode than the one that occurred (scores are unaffected).
    """

    def __init__(self, preset: str = "surrogate_swepro", seed: int = 0, label_noise: float = 0.1,
                 model_id: str = "offline-surrogate") -> None:
        if not 0.0 <= float(label_noise) <= 1.0:
            raise ValueError(f"label_noise: must be in [0, 1], got {label_noise}")
        self.preset: Preset = get_preset(preset)
        self.name = preset
        self.seed = int(seed)
        self.label_noise = float(label_noise)
        self.model_id = model_id
        self.offset, self._splits = calibrated_tasks(preset, self.seed)
        self._by_id: dict[str, Task] = {}
        for split in self._splits.values():  # first split wins: search/train copy over test copy
            for t in split:
                self._by_id.setdefault(t.task_id, t)
        self._arrays: dict[str, Q.TaskArrays] = {}

    # ---------------------------------------------------------------- Benchmark
    def splits(self) -> dict[str, list[Task]]:
        return {k: list(v) for k, v in self._splits.items()}

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"split {split!r}: {self.name} has {list(self._splits)}")
        return list(self._splits[split])

    def task(self, task_id: str) -> Task:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise ValueError(f"task_id {task_id!r}: not in {self.name} (seed {self.seed})") from None

    def executor_config(self) -> dict[str, Any]:
        return {"_target_": "milo_ray.benchmarks.surrogate_executor.SurrogateExecutor", "preset": self.name,
                "seed": self.seed, "label_noise": self.label_noise, "model_id": self.model_id}

    def seed_harnesses(self) -> list[Harness]:
        from milo_ray.harness.seeds import load_seeds

        return load_seeds(self.preset.seed_names)

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
        return _quality(mechanisms, self._ta(split), self.preset.effect_scale)

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
        tb = Q.build_tables({}, self.preset.effect_scale)
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


def __getattr__(name: str):  # SurrogateExecutor lives in its own module; keep it importable from here
    if name == "SurrogateExecutor":
        from milo_ray.benchmarks.surrogate_executor import SurrogateExecutor

        return SurrogateExecutor
    raise AttributeError(name)
