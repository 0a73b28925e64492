"""SurrogateExecutor: samples one simulated rollout from the surrogate quality model.

Deterministic: the stream is seeded from (run seed, harness_id, task_id, rollout_idx)
only, so results do not depend on worker count, scheduling order or process. The
harness is analysed once per harness_id (AST only, never imported). A harness that
does not compile or has no build_agent scores 0 with ``error_kind="harness"``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from milo_ray.benchmarks import surrogate_quality as Q, surrogate_traces as TR
from milo_ray.benchmarks.surrogate_calibration import calibrated_tasks, check_calibrate_to
from milo_ray.benchmarks.surrogate_tasks import get_preset
from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.harness.mechanisms import FAILURE_MODES, detect_mechanisms, parse_harness

ENDINGS = ("success",) + FAILURE_MODES
_SURROGATE_BENCHMARK = "milo_ray.benchmarks.surrogate.SurrogateBenchmark"  # named, never imported (no cycle)


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


class SurrogateExecutor:
    """Executor protocol implementation for the surrogate benchmarks (a SIMULATOR).

    preset, seed, label_noise, calibrate_to: the surrogate benchmark's generator settings
    (``conf/executor/surrogate.yaml`` takes them from the benchmark config).
    model: the ``model`` config (a mapping or ModelConfig; None: the offline model). The
    executor simulates the solver, so only a model without a litellm ``solver`` fits;
    its id is the model named in every trace.
    """

    def __init__(self, preset: str = "surrogate_swepro", seed: int = 0, label_noise: float = 0.1,
                 calibrate_to: str | None = None, model: Any = None) -> None:
        from milo_ray.config.schemas import model_config

        self.preset = get_preset(preset)
        check_calibrate_to(preset, calibrate_to)
        self.seed = int(seed)
        self.label_noise = float(label_noise)
        self.calibrate_to = calibrate_to
        self.model = model_config(model)
        self.preflight(self.model)
        self.model_id = self.model.id
        self._effects: dict[str, tuple[Any, str | None]] = {}

    @staticmethod
    def preflight(model: Any, benchmark: Any = None) -> None:
        """Refuse a model or benchmark this executor cannot run (the entry point calls it on
        the class, before the run writes anything; ``benchmark`` is the benchmark's config
        mapping, None when built outside a run). ``ValueError`` names both config choices."""
        solver = getattr(model, "solver", None)
        if solver:
            raise ValueError(f"model.solver={solver}: executor=surrogate simulates the solver and never calls a "
                             "model; use model=offline, or an executor that runs the harness against the model")
        target = benchmark.get("_target_") if isinstance(benchmark, Mapping) else None
        if target is not None and target != _SURROGATE_BENCHMARK:
            raise ValueError(f"benchmark._target_={target}: executor=surrogate runs only the surrogate benchmarks "
                             f"({_SURROGATE_BENCHMARK}); choose the executor that runs this benchmark's tasks")

    def _effect(self, harness) -> tuple[Any, str | None]:
        hid = harness.harness_id
        if hid not in self._effects:
            source = harness.files.get("harness.py", "")
            try:
                compile(source, "harness.py", "exec")
            except (SyntaxError, ValueError) as e:
                self._effects[hid] = (None, f"harness.py does not compile: {e}")
                return self._effects[hid]
            if parse_harness(source) is None:
                self._effects[hid] = (None, "harness.py has no top-level build_agent(model, backend)")
                return self._effects[hid]
            mechs = detect_mechanisms(source)
            agg = Q.aggregate(Q.indicator(mechs), Q.build_tables(mechs, self.preset.effect_scale, self.preset.credit))
            credit = Q.credits(agg)[0]
            self._effects[hid] = ((agg.shift[0], float(agg.log_time[0]), float(agg.log_tokens[0]), credit), None)
        return self._effects[hid]

    def _task_logits(self, task: Task) -> np.ndarray:
        bl = task.metadata.get("base_logits")
        if bl is None:  # a task built without calibration: take it from the calibrated pool
            _off, splits = calibrated_tasks(self.preset.name, self.seed, self.calibrate_to)
            by_id = {t.task_id: t for s in splits.values() for t in s}
            if task.task_id not in by_id:
                raise ValueError(f"task {task.task_id!r}: not a {self.preset.name} task (no base_logits)")
            bl = by_id[task.task_id].metadata["base_logits"]
        return np.asarray(bl, dtype=float)

    def execute(self, harness, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        effect, error = self._effect(harness)
        if effect is None:
            return RolloutResult(harness.harness_id, task.task_id, rollout_idx, score=0.0, error_kind="harness",
                                 error=error, trace=None)
        shift, log_time, log_tokens, credit = effect
        rng = np.random.default_rng([int(seed) & (2**63 - 1), _h64(harness.harness_id), _h64(task.task_id),
                                     int(rollout_idx)])
        md = task.metadata
        logits = self._task_logits(task) - shift
        logits[Q.DEAD] += Q.KAPPA * log_time
        hazard = 1.0 / (1.0 + np.exp(-logits))
        fired = np.flatnonzero(rng.random(len(FAILURE_MODES)) < hazard)
        e = 0 if fired.size == 0 else 1 + int(fired[0])
        n = int(md["n_tests"])
        passed = n if e == 0 else int(rng.binomial(n, credit[e]))
        timed_out = ENDINGS[e] == "deadline_overrun"
        nominal = min(md["seconds"] * math.exp(log_time), Q.MAX_SECONDS_FRAC * task.time_cap_s)
        seconds = task.time_cap_s if timed_out else nominal * Q.SECOND_MULT[e] * rng.uniform(0.5, 1.5)
        out_tok = int(md["tokens"] * math.exp(log_tokens) * Q.TOKEN_MULT[e] * rng.uniform(0.5, 1.5))
        in_tok = int(out_tok * self.preset.input_output_ratio * rng.uniform(0.8, 1.2))
        true_ending = "success" if passed == n else ENDINGS[e]
        shown = TR.shown_ending(true_ending, self.label_noise, rng)
        trace = {"trajectory": TR.trajectory(task, harness.harness_id, rollout_idx, self.model_id, shown, seconds,
                                             out_tok, timed_out, rng),
                 "ctrf": TR.ctrf(task.task_id, n, passed, shown, seconds)}
        return RolloutResult(harness.harness_id, task.task_id, rollout_idx, score=passed / n, input_tokens=in_tok,
                             output_tokens=out_tok, latency_s=float(seconds), timed_out=timed_out, trace=trace)

    async def aexecute(self, harness, task: Task, rollout_idx: int, seed: int) -> RolloutResult:
        return self.execute(harness, task, rollout_idx, seed)
