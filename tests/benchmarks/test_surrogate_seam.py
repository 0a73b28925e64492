"""The surrogate behind the executor seam: the executor comes from the ``executor`` config
group (never from the benchmark), the SSR experiments start from ``stock`` calibrated to
the SSR paper's initial figures, and MILO's calibration is left as it was."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import OmegaConf

from milo_ray.benchmarks.base import Benchmark
from milo_ray.benchmarks.surrogate import SurrogateBenchmark
from milo_ray.benchmarks.surrogate_executor import SurrogateExecutor
from milo_ray.config.schemas import ModelConfig, register_configs
from milo_ray.harness.seeds import load_seeds
from milo_ray.run import CONF_DIR

register_configs()

# papers/002 Table 1, "Initial harness" (the platform default, empty additional harness).
SSR_INITIAL = {"ssr_swepro": 0.577, "ssr_deepswe": 0.59}


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose("config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("experiment", sorted(SSR_INITIAL))
def test_each_ssr_experiment_starts_from_stock_at_the_papers_initial_figure(experiment):
    cfg = _compose([f"+experiment={experiment}"])
    assert cfg.method.initial == "stock"
    bench = instantiate(cfg.benchmark, _convert_="all")
    stock = next(h for h in bench.seed_harnesses() if h.name == "stock")
    truth = bench.true_quality(stock, cfg.method.test_split or "test")["resolve_rate"]
    assert truth == pytest.approx(SSR_INITIAL[experiment], abs=0.01)


@pytest.mark.parametrize("experiment,preset", [("milo_swepro", "surrogate_swepro"),
                                               ("milo_deepswe", "surrogate_deepswe"),
                                               ("milo_tb21", "surrogate_tb21")])
def test_milo_experiments_keep_the_best_seed_calibration(experiment, preset):
    cfg = _compose([f"+experiment={experiment}"])
    bench = instantiate(cfg.benchmark, _convert_="all")
    assert bench.calibrate_to is None
    reference = SurrogateBenchmark(preset)
    assert bench.offset == reference.offset
    best = max(bench.true_quality(h, "test")["resolve_rate"] for h in load_seeds(bench.preset.seed_names))
    assert best == pytest.approx(bench.preset.target_resolve, abs=1e-3)


def test_calibrating_stock_moves_every_task_not_only_stocks_score():
    milo, ssr = SurrogateBenchmark("surrogate_swepro"), SurrogateBenchmark("surrogate_swepro", calibrate_to="stock")
    assert ssr.offset != milo.offset
    assert [t.task_id for t in ssr.tasks("test")] == [t.task_id for t in milo.tasks("test")]
    stock = next(h for h in load_seeds(["stock"]))
    assert milo.true_quality(stock, "test")["resolve_rate"] < ssr.true_quality(stock, "test")["resolve_rate"]


def test_an_unknown_calibration_seed_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="calibrate_to='nope'"):
        SurrogateBenchmark("surrogate_swepro", calibrate_to="nope")


def test_the_benchmark_protocol_has_no_executor_and_benchmark_configs_no_model_id():
    assert "executor_config" not in Benchmark.__dict__
    for name in ("surrogate_tb21", "surrogate_swepro", "surrogate_deepswe"):
        cfg = _compose([f"benchmark={name}"])
        assert "model_id" not in cfg.benchmark and "model_id" not in cfg.executor


@pytest.mark.parametrize("overrides", [[], ["+experiment=ssr_deepswe"], ["benchmark=surrogate_swepro", "benchmark.seed=4"]])
def test_the_composed_executor_is_the_one_the_benchmark_convenience_describes(overrides):
    """conf/executor/surrogate.yaml and SurrogateBenchmark.executor_config() (used where no
    config is composed: tests, scripts) describe the same executor."""
    cfg = _compose(overrides)
    composed = OmegaConf.to_container(cfg.executor, resolve=True)
    bench = instantiate(cfg.benchmark, _convert_="all")
    described = bench.executor_config(composed["model"])
    assert composed == described
    ex = instantiate(composed)
    assert isinstance(ex, SurrogateExecutor) and ex.model_id == cfg.model.id == "offline-surrogate"
    assert ex.calibrate_to == bench.calibrate_to


def test_the_executor_traces_name_the_model_it_was_given():
    bench = SurrogateBenchmark("surrogate_deepswe")
    ex = instantiate(bench.executor_config({"id": "my-offline-model"}))
    r = ex.execute(bench.seed_harnesses()[0], bench.tasks("train")[0], 0, 0)
    assert r.trace["trajectory"]["model_id"] == "my-offline-model"


def test_the_surrogate_executor_refuses_a_real_solver():
    with pytest.raises(ValueError, match=r"model.solver=openai/x: executor=surrogate simulates the solver"):
        SurrogateExecutor("surrogate_swepro", model={"id": "x", "solver": "openai/x"})
    with pytest.raises(ValueError, match="executor=surrogate runs only the surrogate benchmarks"):
        SurrogateExecutor.preflight(ModelConfig(id="m"), {"_target_": "somewhere.HarborBenchmark"})
