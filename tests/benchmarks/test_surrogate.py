"""Surrogate benchmark: determinism, ground truth, calibration bands."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.benchmarks.surrogate import SurrogateBenchmark
from milo_ray.benchmarks.surrogate_executor import SurrogateExecutor
from milo_ray.harness.mechanisms import add_mechanism, detect_mechanisms, remove_mechanism
from milo_ray.harness.model import Harness
from milo_ray.harness.seeds import load_seeds


@pytest.fixture(scope="module")
def tb():
    return SurrogateBenchmark("surrogate_tb21", seed=3)


def _executor(b):
    cfg = {k: v for k, v in b.executor_config().items() if k != "_target_"}
    return SurrogateExecutor(**cfg)


def test_splits_have_the_preset_sizes():
    assert {k: len(v) for k, v in SurrogateBenchmark("surrogate_swepro").splits().items()} == \
        {"train": 80, "val": 20, "test": 100}
    assert {k: len(v) for k, v in SurrogateBenchmark("surrogate_deepswe").splits().items()} == \
        {"train": 50, "val": 13, "test": 50}
    tb = SurrogateBenchmark("surrogate_tb21")
    s = tb.splits()
    assert len(s["test"]) == 89 and not {t.task_id for t in s["search"]} & {t.task_id for t in s["val"]}
    assert len({t.instruction for t in s["test"]}) == 89


@pytest.mark.parametrize("preset", ["surrogate_swepro", "surrogate_deepswe", "surrogate_tb21"])
def test_the_audit_split_is_160_further_tasks_and_changes_nothing_else(preset):
    plain, audited = SurrogateBenchmark(preset), SurrogateBenchmark(preset, audit_split=True)
    a, b = plain.splits(), audited.splits()
    assert "audit" not in a and set(b) == set(a) | {"audit"} and len(b["audit"]) == 160
    for name in a:  # the pool, its splits and the calibration are untouched
        assert [(t.task_id, t.metadata) for t in a[name]] == [(t.task_id, t.metadata) for t in b[name]]
    assert plain.offset == audited.offset
    others = {t.task_id for name in a for t in a[name]}
    assert not {t.task_id for t in b["audit"]} & others
    seed = load_seeds()[0]
    assert 0 < audited.true_quality(seed, "audit")["score"] < 1


def test_rollouts_do_not_depend_on_order_or_executor_instance(tb):
    hs = load_seeds()
    reqs = [(h, t, i) for h in hs for t in tb.tasks("search")[:10] for i in range(2)]
    a = {(h.harness_id, t.task_id, i): _executor(tb).execute(h, t, i, 7) for h, t, i in reqs}
    rng = np.random.default_rng(0)
    ex = _executor(tb)
    for j in rng.permutation(len(reqs)):
        h, t, i = reqs[j]
        r = ex.execute(h, t, i, 7)
        ref = a[(h.harness_id, t.task_id, i)]
        assert (r.score, r.output_tokens, r.latency_s, r.timed_out, r.trace) == \
            (ref.score, ref.output_tokens, ref.latency_s, ref.timed_out, ref.trace)


def test_invalid_harness_scores_zero_with_harness_error(tb):
    bad = Harness.from_source("def build_agent(model, backend)\n    return None\n")
    r = _executor(tb).execute(bad, tb.tasks("search")[0], 0, 0)
    assert r.score == 0 and r.error_kind == "harness"
    assert tb.true_quality(bad, "search")["score"] == 0


def test_deleting_mechanism_code_changes_true_quality(tb):
    seed = load_seeds(["reproduce_first"])[0]
    gutted = seed.with_source(remove_mechanism(seed.source, "rubric_gate"))
    assert "rubric_gate" not in detect_mechanisms(gutted.source)
    assert tb.true_quality(gutted, "test") != tb.true_quality(seed, "test")
    # also when only the wiring is deleted and the class stays
    unwired = seed.with_source(seed.source.replace("[DefaultRubricGate(model=model, max_iterations=2)]", "[]"))
    assert tb.true_quality(unwired, "test") == tb.true_quality(gutted, "test")


def test_sampled_means_converge_to_the_exact_expectation(tb):
    h = load_seeds(["division_of_labor"])[0]
    ex = _executor(tb)
    rs = [ex.execute(h, t, i, 11) for t in tb.tasks("test") for i in range(30)]
    q = tb.true_quality(h, "test")
    assert abs(np.mean([r.score for r in rs]) - q["score"]) < 0.02
    assert abs(np.mean([r.resolved for r in rs]) - q["resolve_rate"]) < 0.025
    assert abs(np.mean([r.output_tokens for r in rs]) / q["output_tokens"] - 1) < 0.05
    assert abs(np.mean([r.latency_s for r in rs]) / q["seconds"] - 1) < 0.05


def test_timeouts_end_at_the_cap_and_a_scaffold_floor_earns_partial_credit(tb):
    seed = load_seeds(["stock"])[0]
    floored = seed.with_source(add_mechanism(seed.source, "scaffold_floor"))
    ex = _executor(tb)
    plain = [ex.execute(seed, t, i, 1) for t in tb.tasks("test") for i in range(10)]
    floor = [ex.execute(floored, t, i, 1) for t in tb.tasks("test") for i in range(10)]
    to_plain = [r for r in plain if r.timed_out]
    to_floor = [r for r in floor if r.timed_out]
    assert to_plain and to_floor
    assert all(r.latency_s == tb.task(r.task_id).time_cap_s for r in to_plain)
    assert np.mean([r.score for r in to_floor]) > np.mean([r.score for r in to_plain]) + 0.2
    assert all(r.trace["trajectory"]["final"]["status"] == "timeout" for r in to_plain)


def test_trace_has_trajectory_steps_and_a_ctrf_report(tb):
    r = _executor(tb).execute(load_seeds(["minimal"])[0], tb.tasks("search")[0], 0, 0)
    traj, report = r.trace["trajectory"], r.trace["ctrf"]["results"]
    assert traj["steps"][0]["role"] == "user" and all("timestamp" in s for s in traj["steps"])
    assert report["tool"]["name"] and report["summary"]["tests"] == len(report["tests"])
    assert report["summary"]["passed"] / report["summary"]["tests"] == r.score


@pytest.mark.parametrize("preset", ["surrogate_tb21", "surrogate_swepro", "surrogate_deepswe"])
def test_best_seed_lands_on_the_preset_target_and_minimal_is_weaker(preset):
    b = SurrogateBenchmark(preset, seed=0)
    q = {h.name: b.true_quality(h, "test")["resolve_rate"] for h in load_seeds()}
    assert abs(max(q.values()) - b.preset.target_resolve) < 0.005
    assert q["minimal"] < max(q.values()) - 0.02


def test_optimum_is_several_points_above_the_best_seed_and_needs_combinations(tb):
    best = tb.best_reachable("test", metric="resolve_rate")
    seeds = max(tb.true_quality(h, "test")["resolve_rate"] for h in load_seeds())
    gap = best["quality"]["resolve_rate"] - seeds
    assert 0.05 <= gap <= 0.20
    assert len(best["mechanisms"]) >= 4
    # no single added mechanism gets a seed even halfway there
    single = 0.0
    for h in load_seeds():
        present = detect_mechanisms(h.source)
        for name in best["mechanisms"]:
            if name not in present:
                single = max(single, tb.quality_of({**present, name: best["mechanisms"][name]})["resolve_rate"])
    assert single - seeds < gap / 2


def test_a_harness_directory_of_ones_own_is_a_seed_graded_by_its_mechanisms(tmp_path):
    # benchmark.seeds takes paths on the surrogate as on real tasks: the surrogate grades
    # any harness.py by the mechanisms wired in it, and calibration stays on the bundled
    # seeds, so the bundled harnesses score as without it.
    [minimal] = load_seeds(["minimal"])
    mine = tmp_path / "with_gate"
    mine.mkdir()
    (mine / "harness.py").write_text(add_mechanism(minimal.source, "verifier_gate"))
    plain = SurrogateBenchmark("surrogate_tb21")
    bench = SurrogateBenchmark("surrogate_tb21", seeds=["minimal", str(mine)])
    seeds = bench.seed_harnesses()
    assert [h.name for h in seeds] == ["minimal", "with_gate"]
    assert "verifier_gate" in detect_mechanisms(seeds[1].source)
    assert bench.true_quality(seeds[0], "test") == plain.true_quality(minimal, "test")
    assert bench.true_quality(seeds[1], "test") != bench.true_quality(seeds[0], "test")
    assert [h.name for h in plain.seed_harnesses()] == list(plain.preset.seed_names)


def test_a_seed_that_is_neither_bundled_nor_a_harness_directory_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"benchmark\.seeds: .*my_harness"):
        SurrogateBenchmark("surrogate_tb21", seeds=[str(tmp_path / "my_harness")])


def test_every_surrogate_preset_config_takes_seed_paths(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from milo_ray.run import CONF_DIR

    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "harness.py").write_text(load_seeds(["minimal"])[0].source)
    for preset in ("surrogate_tb21", "surrogate_swepro", "surrogate_deepswe", "surrogate_swepro_stock"):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=["method=eval", f"benchmark={preset}",
                                               f"benchmark.seeds=[minimal,{tmp_path / 'h'}]"])
        bench = instantiate(cfg.benchmark, _convert_="all")
        assert [h.name for h in bench.seed_harnesses()] == ["minimal", "h"], preset
