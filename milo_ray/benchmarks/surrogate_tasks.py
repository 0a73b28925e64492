"""Surrogate benchmark presets and synthetic task generation (a SIMULATOR).

A surrogate task is a latent description, not a real environment: difficulty, a
failure-mode propensity vector over ``FAILURE_MODES``, a hidden-test count, a time
and token cap, nominal output tokens/seconds, and a synthetic instruction text
distinct per task. The presets mirror the split sizes of the papers' benchmarks:

* ``surrogate_swepro`` — SWE-Pro-V as in SSR: train/val/test 80/20/100 (disjoint).
* ``surrogate_deepswe`` — DeepSWE as in SSR: train/val/test 50/13/50 (113 tasks).
* ``surrogate_tb21`` — Terminal-Bench 2.1, 89 tasks: ``search`` = a fixed seeded subset
  of 40 tasks (MILO's B_search), ``val`` = 20 further tasks held out from search (the
  held-out monitor), ``test`` = all 89 tasks, because the paper reports the full
  benchmark. A test task shares its task_id (and cached rollouts) with its copy in
  search/val.
* ``surrogate_gaia2`` — GAIA-2 as in SSR: train/val/test 80/20/100 scenarios, pass/fail.
* ``surrogate_paperbench`` — PaperBench-CodeDev as in MILO: 20 papers, ``search`` 8 and
  ``val`` 4 of them, ``test`` all 20; rubric partial credit.

Every preset also has an ``audit`` split of 160 further tasks (papers/002 §6.5: the
racing audit's matrix is 160 tasks disjoint from candidate generation and test), drawn
from the same task distribution *after* the pool, so the pool, its splits and the
calibration are the same with or without it. It is exposed only when asked for
(``SurrogateBenchmark(audit_split=True)``, as ``scripts/racing_audit.py`` does), so
runs that walk every split never see it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np

from milo_ray.core.tasks import Task
from milo_ray.harness.mechanisms import FAILURE_MODES

M = len(FAILURE_MODES)


@dataclass(frozen=True)
class Preset:
    """Everything that distinguishes one simulated benchmark.

    target_resolve: resolve rate of the best seed on ``test`` the calibration solves for.
    effect_scale: multiplies every mechanism effect (sets the gap to the reachable
    optimum; tuned with scripts/calibrate_surrogate.py).
    mode_prior: mean failure-mode propensities; tasks draw Dirichlet(concentration*prior).
    """

    name: str
    splits: dict[str, int]
    n_tasks: int
    target_resolve: float
    effect_scale: float
    mode_prior: tuple[float, ...]
    time_caps_s: tuple[float, ...]
    tests_range: tuple[int, int]
    tokens_median: float
    input_output_ratio: float = 8.0
    token_cap: int = 20_000_000
    concentration: float = 4.0
    difficulty_sd: float = 1.0
    full_test: bool = False  # test = every task (Terminal-Bench) instead of a disjoint split
    audit_tasks: int = 160  # the racing audit's split, generated after the pool
    seed_names: tuple[str, ...] = ("minimal", "stock", "division_of_labor", "plan_and_solve", "reproduce_first")
    extra: dict = field(default_factory=dict)
    # Per-FAILURE_MODES partial credit (the chance a hidden test passes after that ending);
    # None: the quality model's CREDIT, which every preset before the pass/fail and rubric ones uses.
    credit: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.credit is not None and (len(self.credit) != M or not all(0.0 <= c <= 1.0 for c in self.credit)):
            raise ValueError(f"preset {self.name}: credit={self.credit} needs {M} values in [0, 1], one per "
                             f"failure mode {FAILURE_MODES}")


PRESETS: dict[str, Preset] = {
    "surrogate_swepro": Preset(
        "surrogate_swepro", {"train": 80, "val": 20, "test": 100}, 200, target_resolve=0.577, effect_scale=0.7,
        mode_prior=(0.20, 0.10, 0.30, 0.20, 0.12, 0.08), time_caps_s=(3600.0,), tests_range=(3, 25),
        tokens_median=45_000.0,
    ),
    "surrogate_deepswe": Preset(
        "surrogate_deepswe", {"train": 50, "val": 13, "test": 50}, 113, target_resolve=0.59, effect_scale=0.75,
        mode_prior=(0.15, 0.25, 0.20, 0.12, 0.20, 0.08), time_caps_s=(5400.0,), tests_range=(5, 40),
        tokens_median=90_000.0,
    ),
    "surrogate_tb21": Preset(
        "surrogate_tb21", {"search": 40, "val": 20, "test": 89}, 89, target_resolve=0.741, effect_scale=1.0,
        mode_prior=(0.25, 0.25, 0.20, 0.15, 0.08, 0.07), time_caps_s=(900.0, 1800.0, 3600.0, 7200.0, 10800.0),
        tests_range=(2, 20), tokens_median=60_000.0, full_test=True,
    ),
    # GAIA-2 as in SSR (papers/002 §5 "Benchmarks and models"): Retro's 200-scenario mini
    # configuration of the official validation split, train/val/test 80/20/100. Table 1's
    # initial harness (the platform default, ``stock``: conf/benchmark/surrogate_gaia2.yaml
    # calibrates it) scores 29.0 Avg Pass@1 (%) on test with Codex (GPT 5.5 high; 26.0 with
    # Claude Code, Opus 4.8 high); SSR reaches 38.0 (36.0). A scenario is pass/fail (ARE's
    # judge accepts it or not): one hidden check, so a rollout scores 0 or 1, and ``credit``
    # is the chance the judge still accepts after a failure ending (CREDIT's partial credit
    # would pass half the failed scenarios and floor the pass rate near 50%). The cap is ARE's
    # 30 minutes per scenario (benchmark=are's time_cap_s). effect_scale puts the seeds within
    # 3 points (27.9-30.8%) and the reachable optimum at 53.1%, above SSR's 38.0: on pass/fail
    # scores combined mechanisms compound fast, and a smaller scale leaves the seeds alike
    # (scripts/calibrate_surrogate.py --presets surrogate_gaia2 --calibrate-to stock prints them).
    "surrogate_gaia2": Preset(
        "surrogate_gaia2", {"train": 80, "val": 20, "test": 100}, 200, target_resolve=0.29, effect_scale=0.55,
        mode_prior=(0.25, 0.10, 0.15, 0.20, 0.10, 0.20), time_caps_s=(1800.0,), tests_range=(1, 1),
        tokens_median=30_000.0, credit=(0.05, 0.0, 0.20, 0.05, 0.05, 0.10),
    ),
    # PaperBench-CodeDev as in MILO (papers/000 §5.2, App. A.2, Table 2(a)): 20 papers, 12 h
    # each, k=3; an attempt's score is the rubric-weighted replication score in [0, 1], and
    # RR@3 counts attempts scoring >= 0.9. Best-of-3 seed: PR@3 74.5, RR@3 26.7 (calibrated:
    # the best seed's test resolve rate is 0.267, and ``credit`` is set so its PR lands on
    # 74.5: 74.9 here); minimal harness 65.7 / 15.0 (here 75.0 / 19.9: not fitted); MILO 88.6 / 55.0 (the
    # reachable optimum here: 91.3 / 63.8). The rubric is 7-9 equally weighted
    # top-level components (n_tests), so a score >= 0.9 is exactly a full score and the
    # framework's resolved (score == 1) is PaperBench's. The paper gives no search/val split:
    # as on Terminal-Bench 2.1 (40/20 of 89, test = the full benchmark the paper reports),
    # search 8 and val 4 papers, test all 20; the 8 papers in neither are the held-out figure.
    # Failure modes lean to stopping early and not running the replication (premature
    # completion, lax verification); with 12 h, overruns are rare.
    "surrogate_paperbench": Preset(
        "surrogate_paperbench", {"search": 8, "val": 4, "test": 20}, 20, target_resolve=0.267, effect_scale=0.9,
        mode_prior=(0.35, 0.05, 0.30, 0.12, 0.10, 0.08), time_caps_s=(43200.0,), tests_range=(7, 9),
        tokens_median=400_000.0, full_test=True, credit=(0.74, 0.50, 0.74, 0.64, 0.64, 0.61),
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"surrogate preset {name!r}: unknown; choose one of {sorted(PRESETS)}") from None


def preset_rng(preset: str, seed: int, purpose: str) -> np.random.Generator:
    """A Generator for (preset, seed, purpose): independent streams, stable across runs."""
    digest = hashlib.sha256(f"{preset}|{purpose}".encode()).digest()
    return np.random.default_rng([int(seed), int.from_bytes(digest[:8], "little")])


_VERBS = ("Fix", "Implement", "Repair", "Extend", "Configure", "Port", "Harden", "Refactor", "Restore", "Build")
_OBJECTS = (
    "the CSV export in {mod}", "pagination of the {mod} REST endpoint", "the {mod} cache invalidation",
    "a systemd-style service for {mod}", "unicode handling in {mod}", "the retry policy of {mod}",
    "the build of the {mod} C extension", "timezone parsing in {mod}", "the {mod} migration script",
    "log rotation for {mod}", "the {mod} dependency resolver", "concurrent writes in {mod}",
)
_CONSTRAINTS = (
    "without changing the public API", "so that it runs on port {port}", "keeping memory under {mb} MB",
    "while preserving backward compatibility with v{ver}", "so that {n} hidden tests pass",
    "using only the standard library", "within {sec} seconds per request",
)
_MODULES = ("ledger", "atlas", "quill", "harbor", "sprocket", "lumen", "cobalt", "pylon", "mosaic", "tundra",
            "ember", "vertex", "basalt", "orchid", "relay", "summit")


def _instruction(rng: np.random.Generator, i: int, n_tests: int) -> str:
    mod = f"{_MODULES[rng.integers(len(_MODULES))]}_{i:03d}"
    obj = _OBJECTS[rng.integers(len(_OBJECTS))].format(mod=mod)
    con = _CONSTRAINTS[rng.integers(len(_CONSTRAINTS))].format(
        port=int(rng.integers(1024, 65000)), mb=int(rng.integers(64, 2048)), ver=int(rng.integers(1, 9)),
        n=n_tests, sec=int(rng.integers(1, 30)))
    path = f"/app/{mod}/"
    return (f"{_VERBS[rng.integers(len(_VERBS))]} {obj} {con}. The project lives in {path}; "
            f"the grader runs hidden tests against the final state of the environment.")


def generate_tasks(preset: Preset, seed: int, extra: int = 0) -> list[Task]:
    """The preset's task pool (no splits assigned yet: ``split=''``), deterministic in seed,
    followed by ``extra`` further tasks of the same distribution (the audit split). The
    tasks are drawn one after another from one stream, so the first ``n_tasks`` do not
    depend on ``extra``.

    Metadata (read by the surrogate executor only): difficulty, propensity (list over
    FAILURE_MODES), n_tests, tokens (nominal output tokens), seconds (nominal agent seconds).
    """
    rng = preset_rng(preset.name, seed, "tasks")
    prior = np.asarray(preset.mode_prior, dtype=float)
    prior = prior / prior.sum()
    tasks = []
    for i in range(preset.n_tasks + int(extra)):
        difficulty = float(rng.normal(0.0, preset.difficulty_sd))
        propensity = rng.dirichlet(preset.concentration * prior * M)
        lo, hi = preset.tests_range
        n_tests = int(rng.integers(lo, hi + 1))
        cap = float(preset.time_caps_s[rng.integers(len(preset.time_caps_s))])
        seconds = float(cap * rng.uniform(0.15, 0.45) * np.exp(0.25 * difficulty))
        tokens = float(preset.tokens_median * rng.lognormal(0.0, 0.5) * np.exp(0.3 * difficulty))
        tasks.append(Task(
            task_id=f"{preset.name.removeprefix('surrogate_')}-{i:03d}",
            split="",
            instruction=_instruction(rng, i, n_tests),
            time_cap_s=cap,
            token_cap=preset.token_cap,
            metadata={"difficulty": difficulty, "propensity": [float(p) for p in propensity],
                      "n_tests": n_tests, "tokens": tokens, "seconds": seconds},
        ))
    return tasks


def assign_splits(preset: Preset, tasks: list[Task], seed: int) -> dict[str, list[Task]]:
    """Seeded split assignment; with ``full_test`` the test split is the whole pool. Tasks
    past the pool's ``n_tasks`` (from ``generate_tasks(extra=...)``) form the ``audit``
    split, outside every other split."""
    tasks, beyond = tasks[: preset.n_tasks], tasks[preset.n_tasks:]
    rng = preset_rng(preset.name, seed, "splits")
    order = rng.permutation(len(tasks))
    out: dict[str, list[Task]] = {}
    at = 0
    for name, size in preset.splits.items():
        if preset.full_test and name == "test":
            out[name] = [dataclasses.replace(t, split="test") for t in tasks]
            continue
        idx = sorted(order[at: at + size])
        at += size
        out[name] = [dataclasses.replace(tasks[i], split=name) for i in idx]
    if at > len(tasks):
        raise ValueError(f"preset {preset.name}: splits {preset.splits} need {at} tasks, pool has {len(tasks)}")
    if beyond:
        out["audit"] = [dataclasses.replace(t, split="audit") for t in beyond]
    return out
