"""The instance-level track's tasks: starts rebuilt from small specs keep their scores and
feasibility, the reward is monotone, and the benchmark's tasks, splits, seeds and config
hold their contracts."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from milo_ray.benchmarks.einstein import EinsteinBenchmark, PROBLEMS, check, refine, reward, score, start_values
from milo_ray.benchmarks.einstein.benchmark import default_starts
from milo_ray.benchmarks.einstein.starts import project, published
from milo_ray.harness.model import Harness

CONF = Path(__file__).resolve().parents[2] / "conf"

PROGRAM = '''\
import numpy as np

CONFIG = {"steps": 3}
STAGES = ["noop"]


def publish(values):
    """Replaced by the runner."""


def stage_noop(h, rng, deadline, problem):
    return h


def optimize(values, *, seed, deadline):
    h = np.asarray(values, dtype=np.float64)
    for name in STAGES:
        h = globals()["stage_" + name](h, np.random.default_rng(seed), deadline, None)
    return h
'''


@pytest.fixture
def seeds_dir(tmp_path: Path) -> Path:
    (tmp_path / "noop").mkdir()
    (tmp_path / "noop" / "harness.py").write_text(PROGRAM)
    return tmp_path


@pytest.fixture(scope="module")
def bench() -> EinsteinBenchmark:
    return EinsteinBenchmark()


def _random_feasible(problem: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if problem == "third_autocorrelation":
        return rng.uniform(-0.3, 1.0, n)
    return project(problem, rng.uniform(0.0, 1.0, n))


# -- starts ------------------------------------------------------------------------------

@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("factor", [2, 3, 4, 7])
def test_refinement_keeps_the_score(problem, factor):
    for h in (np.asarray(published(problem)), _random_feasible(problem, 57, factor)):
        assert check(problem, h) is None
        fine = refine(h, factor)
        assert fine.size == h.size * factor
        assert check(problem, fine) is None
        assert score(problem, fine) == pytest.approx(score(problem, h), rel=1e-10)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_every_default_start_is_deterministic_and_feasible(problem):
    for spec in default_starts(problem):
        a, b = start_values(spec, problem), start_values(dict(spec), problem)
        assert a.size == spec["n"] and np.array_equal(a, b), spec
        assert check(problem, a) is None, spec


@pytest.mark.parametrize("problem", PROBLEMS)
def test_an_alphaevolve_start_scores_as_published(problem):
    pub = published(problem)
    h = start_values({"base": "alphaevolve", "n": 4 * len(pub)}, problem)
    assert score(problem, h) == pytest.approx(score(problem, pub), rel=1e-10)


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("perturb", [1e-3, 1e-2])
def test_a_perturbed_start_differs_from_its_base_and_is_feasible(problem, perturb):
    n = 4 * len(published(problem))
    base = start_values({"base": "alphaevolve", "n": n}, problem)
    noisy = [start_values({"base": "alphaevolve", "n": n, "perturb": perturb, "seed": s}, problem) for s in (0, 1)]
    for h in noisy:
        assert h.shape == base.shape and not np.array_equal(h, base)
        assert check(problem, h) is None
        # Relative noise of this size moves heights by about that fraction, not more.
        assert np.max(np.abs(h - base)) <= 10 * perturb * max(1.0, float(np.max(np.abs(base))))
    assert not np.array_equal(noisy[0], noisy[1])


@pytest.mark.parametrize("values, problem, words", [
    ([0.5, -0.1, 0.3], "first_autocorrelation", "heights >= 0"),
    ([0.2, 1.5, 0.3, 0.0], "erdos_minimum_overlap", "[0, 1]"),
    ([-0.2, 1.0, 0.7, 0.5], "erdos_minimum_overlap", "[0, 1]"),
    ([0.9, 0.9, 0.9, 0.9], "erdos_minimum_overlap", "sum(h)"),
    ([0.5, float("nan"), 0.5], "third_autocorrelation", "non-finite"),
    ([0.5, float("inf"), 0.5], "first_autocorrelation", "non-finite"),
    ([[0.5, 0.5], [0.5, 0.5]], "first_autocorrelation", "shape"),
    ([0.5], "erdos_minimum_overlap", "shape"),
    (["a", "b"], "first_autocorrelation", "not a vector of numbers"),
    ([0.0, 0.0, 0.0], "third_autocorrelation", "non-zero integral"),
])
def test_check_gives_a_reason_for_each_violation(values, problem, words):
    reason = check(problem, values)
    assert reason is not None and words in reason, reason
    assert "\n" not in reason


def test_check_accepts_a_feasible_construction_exactly_at_the_erdos_bounds():
    assert check("erdos_minimum_overlap", [0.0, 1.0, 1.0, 0.0]) is None


# -- reward ------------------------------------------------------------------------------

_scores = st.floats(min_value=1e-3, max_value=10.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(start=_scores, a=_scores, b=_scores)
def test_reward_is_monotone_in_the_score(start, a, b):
    a, b = min(a, b), max(a, b)
    ra, rb = reward(start, a), reward(start, b)
    assert 0.0 <= rb <= ra <= 1.0


@settings(max_examples=200, deadline=None)
@given(start=_scores, worse=st.floats(min_value=0.0, max_value=10.0))
def test_reward_is_zero_when_not_better(start, worse):
    assert reward(start, start + worse) == 0.0


def test_reward_grows_with_the_gain():
    start = 1.5052939684
    assert reward(start, start * (1 - 1e-4)) > 0.0
    assert reward(start, start * (1 - 1e-3)) > reward(start, start * (1 - 1e-4))
    assert reward(start, start * 0.4) == 1.0
    assert reward(start, float("nan")) == 0.0


# -- the benchmark -----------------------------------------------------------------------

def test_splits_are_disjoint_cover_the_tasks_and_see_every_problem(bench):
    splits = bench.splits()
    assert list(splits) == ["search", "val", "test"]
    ids = [t.task_id for ts in splits.values() for t in ts]
    assert len(ids) == len(set(ids)) == 3 * len(default_starts("first_autocorrelation"))
    for name, tasks in splits.items():
        assert all(t.split == name for t in tasks)
        assert {t.metadata["problem"] for t in tasks} == set(PROBLEMS), name
    assert {bench.task(i).task_id for i in ids} == set(ids)


def test_splits_are_deterministic_in_split_seed(bench):
    def ids(b):
        return {k: [t.task_id for t in v] for k, v in b.splits().items()}

    assert ids(EinsteinBenchmark(split_seed=0)) == ids(bench)
    assert ids(EinsteinBenchmark(split_seed=1)) != ids(bench)


def test_split_counts_are_per_problem():
    b = EinsteinBenchmark(splits={"train": 4, "val": 3, "test": 3})
    for name, k in (("train", 4), ("val", 3), ("test", 3)):
        tasks = b.tasks(name)
        assert len(tasks) == 3 * k
        for p in PROBLEMS:
            assert sum(t.metadata["problem"] == p for t in tasks) == k


def test_problem_keeps_only_that_problem():
    b = EinsteinBenchmark(problem="erdos_minimum_overlap")
    tasks = [t for ts in b.splits().values() for t in ts]
    assert len(tasks) == len(default_starts("erdos_minimum_overlap"))
    assert {t.metadata["problem"] for t in tasks} == {"erdos_minimum_overlap"}
    assert all(t.task_id.startswith("erdos-") for t in tasks)


def test_tasks_carry_small_json_metadata_that_rebuilds_the_start(bench):
    for t in bench.tasks("search") + bench.tasks("val") + bench.tasks("test"):
        text = json.dumps(t.metadata)
        assert len(text) < 300, text  # the construction itself never travels with a task
        assert set(t.metadata) == {"format", "problem", "start", "budget_s"}
        assert t.metadata["format"] == "einstein" and set(t.metadata["start"]) == {"base", "n", "perturb", "seed"}
        h = start_values(json.loads(text))
        assert h.size == t.metadata["start"]["n"] and check(t.metadata["problem"], h) is None
        assert "/" not in t.task_id and " " not in t.task_id
        assert t.time_cap_s == 25.0 and t.token_cap == 0


def test_task_ids_are_readable(bench):
    t = bench.task("first-ae-n2400-p0.001-s1")
    assert t.metadata["start"] == {"base": "alphaevolve", "n": 2400, "perturb": 0.001, "seed": 1}
    assert bench.task("erdos-ae-n95").metadata["start"]["perturb"] == 0.0
    assert bench.task("third-rand-n300-s1").metadata["start"]["seed"] == 1


def test_the_instruction_is_self_contained(bench):
    t = bench.task("third-ae-n1600-p0.01-s0")
    text = t.instruction
    for words in ("third_autocorrelation", "2n * |max(h*h)| / (sum h)^2", "Lower is better", "n = 1600",
                  "0.01", "def optimize(values, *, seed, deadline)", "publish(",
                  "PROBLEM", "numpy", "20 s"):
        assert words in text, words
    start = score("third_autocorrelation", start_values(t.metadata))
    assert f"{start:.10g}" in text


def test_custom_starts_restricted_to_one_problem():
    starts = [{"base": "alphaevolve"}, {"base": "random", "n": 40, "seed": 3, "problem": "erdos_minimum_overlap"},
              {"base": "constant", "n": 16}]
    b = EinsteinBenchmark(starts=starts, budget_s=7.5, grace_s=0.5, splits={"search": 1.0})
    assert list(b.splits()) == ["search"]
    tasks = b.tasks("search")
    assert [t.task_id for t in tasks] == ["erdos-ae-n95", "erdos-const-n16", "erdos-rand-n40-s3", "first-ae-n600",
                                         "first-const-n16", "third-ae-n400", "third-const-n16"]
    # An alphaevolve start without n keeps the published size, and the metadata says so.
    assert b.task("first-ae-n600").metadata["start"]["n"] == 600
    assert all(t.time_cap_s == 8.0 and t.metadata["budget_s"] == 7.5 for t in tasks)


@pytest.mark.parametrize("kwargs, field", [
    ({"problem": "second_autocorrelation"}, "benchmark.problem"),
    ({"budget_s": 0}, "benchmark.budget_s"),
    ({"budget_s": float("nan")}, "benchmark.budget_s"),
    ({"grace_s": -1.0}, "benchmark.grace_s"),
    ({"split_seed": "a"}, "benchmark.split_seed"),
    ({"splits": {"search": 0.9, "val": 0.9}}, "benchmark.splits"),
    ({"splits": {"search": 1.0, "val": 0.0}}, "benchmark.splits"),
    ({"splits": ["search"]}, "benchmark.splits"),
    ({"seeds": "noop"}, "benchmark.seeds"),
    ({"starts": []}, "benchmark.starts"),
    ({"starts": {"base": "constant"}}, "benchmark.starts"),
    ({"starts": ["constant"]}, "benchmark.starts[0]"),
    ({"starts": [{"base": "alphaevolve"}, {"base": "gaussian", "n": 10}]}, "benchmark.starts[1].base"),
    ({"starts": [{"base": "constant"}]}, "benchmark.starts[0].n"),
    ({"starts": [{"base": "constant", "n": 1}]}, "benchmark.starts[0].n"),
    ({"starts": [{"base": "constant", "n": 10.5}]}, "benchmark.starts[0].n"),
    ({"starts": [{"base": "alphaevolve", "n": 1000}], "problem": "first_autocorrelation"}, "benchmark.starts[0].n"),
    ({"starts": [{"base": "constant", "n": 10, "perturb": -0.1}]}, "benchmark.starts[0].perturb"),
    ({"starts": [{"base": "random", "n": 10, "seed": -1}]}, "benchmark.starts[0].seed"),
    ({"starts": [{"base": "random", "n": 10, "noise": 0.1}]}, "benchmark.starts[0].noise"),
    ({"starts": [{"base": "random", "n": 10, "problem": "first"}]}, "benchmark.starts[0].problem"),
    ({"starts": [{"base": "constant", "n": 10, "problem": "first_autocorrelation"}]}, "benchmark.starts"),
    ({"starts": [{"base": "constant", "n": 10}, {"base": "constant", "n": 10, "seed": 4}]}, "benchmark.starts[1]"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(ValueError) as info:
        EinsteinBenchmark(**kwargs)
    assert field in str(info.value).splitlines()[0], str(info.value)


def test_seed_harnesses_come_from_the_seeds_dir(seeds_dir):
    (seeds_dir / "_template").mkdir()
    (seeds_dir / "_template" / "harness.py").write_text(PROGRAM)
    (seeds_dir / "notes").mkdir()  # no harness.py: not a program
    b = EinsteinBenchmark(problem="erdos_minimum_overlap", seeds_dir=str(seeds_dir))
    [h] = b.seed_harnesses()
    assert isinstance(h, Harness) and h.name == "noop" and h.source == PROGRAM
    assert b.artifact_entry == "optimize" and b.name == "einstein"
    ns: dict = {}
    exec(h.source, ns)
    start = start_values(b.tasks("test")[0].metadata)
    assert np.array_equal(ns["optimize"](start, seed=0, deadline=math.inf), start)


def test_missing_or_empty_seeds_dir_is_a_clear_error(tmp_path, seeds_dir):
    for d in (tmp_path / "absent", tmp_path / "empty"):
        if d.name == "empty":
            d.mkdir()
        with pytest.raises(Exception, match="benchmark.seeds_dir"):
            EinsteinBenchmark(problem="first_autocorrelation", seeds_dir=str(d)).seed_harnesses()
    with pytest.raises(ValueError, match=r"benchmark.seeds: unknown seed program\(s\) \['annealing'\]"):
        EinsteinBenchmark(problem="first_autocorrelation", seeds_dir=str(seeds_dir),
                          seeds=["annealing"]).seed_harnesses()


def test_the_config_names_every_constructor_field_and_builds():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    node = OmegaConf.load(CONF / "benchmark" / "einstein.yaml")
    params = set(inspect.signature(EinsteinBenchmark.__init__).parameters) - {"self"}
    assert node.pop("defaults") == [{"/executor@_global_.executor": "optimizer"}]  # its usual executor
    assert set(node) - {"_target_"} == params
    b = instantiate(node, _convert_="all")
    assert isinstance(b, EinsteinBenchmark) and len(b.tasks("search")) == 15


def test_a_file_start_continues_from_a_stored_construction(tmp_path):
    # What the records command writes: {"problem", "values", "score"}.
    from milo_ray.benchmarks.einstein.starts import construction_digest

    stored = start_values({"base": "alphaevolve", "n": 1200, "perturb": 0.001, "seed": 4}, "first_autocorrelation")
    path = tmp_path / "first_autocorrelation.json"
    path.write_text(json.dumps({"problem": "first_autocorrelation", "values": stored.tolist(),
                                "score": score("first_autocorrelation", stored)}))
    bench = EinsteinBenchmark(problem="first_autocorrelation", splits={"search": 1.0},
                              starts=[{"base": "file", "path": str(path)}, {"base": "file", "path": str(path), "n": 2400}])
    tasks = sorted(bench.splits()["search"], key=lambda t: t.metadata["start"]["n"])
    digest = construction_digest(stored)
    assert [t.task_id for t in tasks] == [f"first-file-{digest[:8]}-n1200", f"first-file-{digest[:8]}-n2400"]
    json.dumps({k: v for k, v in tasks[0].metadata["start"].items() if k != "files"})
    assert np.array_equal(start_values(tasks[0].metadata), stored)
    refined = start_values(tasks[1].metadata)
    assert refined.size == 2400 and score("first_autocorrelation", refined) == pytest.approx(
        score("first_autocorrelation", stored), rel=1e-12)
    # The construction travels as content: a worker that cannot see the file, or sees it
    # changed, starts from what the run validated.
    path.write_text(json.dumps(list(stored[::-1])))
    assert np.array_equal(start_values(tasks[0].metadata), stored)
    path.unlink()
    assert np.array_equal(start_values(tasks[0].metadata), stored)
    # A spec without the shipped content (built before it shipped) still checks the file.
    path.write_text(json.dumps(list(stored[::-1])))
    bare = {k: v for k, v in tasks[0].metadata["start"].items() if k != "files"}
    with pytest.raises(ValueError, match=r"start\.path=.*changed since"):
        start_values(bare, "first_autocorrelation")


@pytest.mark.parametrize("spec, match", [
    ({"base": "file"}, r"starts\[0\]\.path: a file start needs"),
    ({"base": "alphaevolve", "path": "x.json"}, r"starts\[0\]\.path: only a file start"),
    ({"base": "file", "path": "/nonexistent/first.json"}, r"starts\[0\]: start\.path=.*cannot read"),
])
def test_bad_file_starts_are_refused_naming_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        EinsteinBenchmark(problem="first_autocorrelation", starts=[spec], splits={"search": 1})


def test_a_file_of_another_problem_or_not_a_vector_is_refused(tmp_path):
    other = tmp_path / "erdos.json"
    other.write_text(json.dumps({"problem": "erdos_minimum_overlap", "values": [0.5] * 10}))
    with pytest.raises(ValueError, match="not of 'first_autocorrelation'"):
        EinsteinBenchmark(problem="first_autocorrelation", starts=[{"base": "file", "path": str(other)}],
                          splits={"search": 1})
    garbage = tmp_path / "garbage.json"
    garbage.write_text(json.dumps({"values": "abc"}))
    with pytest.raises(ValueError, match="at least 2 finite heights"):
        EinsteinBenchmark(problem="first_autocorrelation", starts=[{"base": "file", "path": str(garbage)}],
                          splits={"search": 1})
