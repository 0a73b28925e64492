"""Every method on every benchmark it supports, and every experiment, runs from the
command line on a tiny budget; the MILO ablation rungs give their mutators what the
rung says (no evidence for one-shot, a flat archive for A and B).

All jobs run in one process through ``milo_ray.run.main`` (the function behind
``python -m milo_ray.run``), so they share one Ray start; the default command itself
runs as a real subprocess in ``test_cli_runs.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from milo_ray.run import CONF_DIR

# A cluster, containers or whole command-line runs: the slow suite (pytest -m slow; .ci/run runs it).
pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("cli_jobs.py")
METHODS = sorted(p.stem for p in (Path(CONF_DIR) / "method").glob("*.yaml"))
# Training (or search) split sizes: SSR's budget covers one refresh plus one race.
TRAIN_SIZE = {"surrogate_tb21": 40, "surrogate_swepro": 80, "surrogate_deepswe": 50}
# The presets only an experiment runs here (their train splits, for the SSR budget).
EXPERIMENT_TRAIN_SIZE = {**TRAIN_SIZE, "surrogate_gaia2": 80}
EXPERIMENT_BENCHMARK = {"ssr_swepro": "surrogate_swepro", "ssr_deepswe": "surrogate_deepswe",
                        "ssr_gaia2": "surrogate_gaia2"}
# The surrogate benchmarks (offline, every method on each); the real task sets run in
# tests/entry/test_real_run.py against a local endpoint, and the *_stock variants are
# the SSR experiments' benchmarks, run below through the experiments.
BENCHMARKS = sorted(TRAIN_SIZE)
# Every experiment that runs offline; one that needs a model endpoint (its defaults pick
# model=litellm) runs against a local one in its own test (milo_einstein_agent:
# tests/entry/test_einstein_agent_run.py).
EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml")
                     if "override /model: litellm" not in p.read_text())
ENDPOINT_EXPERIMENTS = {"milo_einstein_agent": "tests/entry/test_einstein_agent_run.py"}
RUNGS = [m for m in METHODS if m.startswith("milo_") and len(m) == 6]  # milo_A ... milo_E

MILO_TINY = ["method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1", "method.k_test=1",
             "method.max_rounds=1"]
# M=2 candidates, stage batches of 2+1+1 tasks, R=1: a race costs (2+1)*4 + (1+1)*4 = 20 executions.
SSR_TINY = ["method.scales=[0.5,1.0]", "method.b_v=[2,2]", "method.b_s=1", "method.b_f=1", "method.rollouts=1",
            "method.patience=1", "method.test_rollouts=1"]


# The instance-level experiments on one problem with 1-second optimizer runs.
EINSTEIN_COMMON = ["benchmark.problem=first_autocorrelation", "benchmark.budget_s=1", "benchmark.grace_s=1",
                   "run.time_limit_s=null"]
EINSTEIN_TINY = {
    "milo_einstein": [*EINSTEIN_COMMON, "method.search_size=2", "method.val_size=1", "method.max_rounds=1",
                      "method.seeds=[lse_adam,subgradient]", "method.num_islands=2"],
    "ssr_einstein": [*EINSTEIN_COMMON, "method.b_v=[1,1]", "method.patience=1", "run.budget.executions=20"],
}


def _tiny(method: str, benchmark: str) -> list[str]:
    if method == "eval":
        return ["method.k=1", "method.names=[minimal,stock]"]
    if method == "ssr":
        return [*SSR_TINY, f"run.budget.executions={EXPERIMENT_TRAIN_SIZE[benchmark] + 20}"]
    return list(MILO_TINY)


def _jobs(root: Path) -> dict[str, list[str]]:
    common = ["run.progress=false", "run.report=false", "execution.num_cpus=2"]
    jobs: dict[str, list[str]] = {}
    for method in METHODS:
        # The ladder rungs are the paper's TB2.1 ablation; the other methods run on every benchmark.
        for benchmark in (["surrogate_tb21"] if method in RUNGS else BENCHMARKS):
            name = f"{method}-{benchmark}"
            extra = ["method.patience=1", "method.max_rounds=2"] if method in ("milo_D", "milo_E") else []
            jobs[name] = [f"method={method}", f"benchmark={benchmark}", *_tiny(method, benchmark), *extra, *common,
                          f"run.dir={root / name}"]
    for exp in EXPERIMENTS:
        cfg_benchmark = EXPERIMENT_BENCHMARK.get(exp)
        if exp in EINSTEIN_TINY:
            tiny = EINSTEIN_TINY[exp]
        else:
            tiny = _tiny("ssr", cfg_benchmark) if exp.startswith("ssr") else list(MILO_TINY)
        jobs[f"exp-{exp}"] = [f"+experiment={exp}", *tiny, *common, f"run.dir={root / ('exp-' + exp)}"]
    return jobs


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("cli-matrix")
    jobs_file, out_file = root / "jobs.json", root / "out.json"
    jobs_file.write_text(json.dumps(_jobs(root)))
    proc = subprocess.run([sys.executable, str(RUNNER), str(jobs_file), str(out_file)], cwd=root,
                          capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert out_file.exists(), proc.stderr[-4000:]
    results = json.loads(out_file.read_text())
    results["_stderr"] = proc.stderr
    return root, results


def _job(matrix, name: str) -> tuple[Path, dict]:
    root, results = matrix
    assert name in results, f"job {name} never ran; runner stderr:\n{results['_stderr'][-3000:]}"
    res = results[name]
    assert res["code"] == 0, f"{name} exited {res['code']}; runner stderr:\n{results['_stderr'][-3000:]}"
    run_dir = root / name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    return run_dir, manifest


def _events(run_dir: Path, kind: str) -> list[dict]:
    rows = duckdb.sql(f"select payload from '{run_dir}/events/*.parquet' where kind = '{kind}'").fetchall()
    return [json.loads(p) for (p,) in rows]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in _jobs(Path("/x")) if not n.startswith("exp-")])
def test_every_method_runs_on_every_benchmark_it_supports(matrix, name):
    run_dir, manifest = _job(matrix, name)
    summary = manifest["summary"]
    method = name.split("-", 1)[0]
    n_rollouts = duckdb.sql(f"select count(*) from '{run_dir}/rollouts/*.parquet'").fetchall()[0][0]
    assert n_rollouts > 0
    assert manifest["models"]["solver"] == {"id": "offline-surrogate", "solver": None}
    embedder = manifest["models"]["embedder"]
    assert embedder["configured"] == "BAAI/bge-large-en-v1.5"
    if method == "eval":
        assert summary["k"] == 1 and [h["name"] for h in summary["harnesses"]] == ["minimal", "stock"]
        assert embedder["used"] == [] and not embedder["fell_back"], "eval embeds nothing"
    elif method == "ssr":
        assert summary["rounds"] >= 1 and summary["final_test"], "SSR ran no race or no final test"
        assert summary["executions_used"] <= manifest["config"]["run"]["budget"]["executions"]
        assert _events(run_dir, "ssr.selection"), "no race reached a selection"
        # the embedder model actually used (offline: the packaged fallback unless bge is cached)
        loads = _events(run_dir, "embedder.loaded")
        assert loads and sorted(embedder["used"]) == sorted({x["used"] for x in loads})
        assert embedder["fell_back"] == (embedder["used"] != ["BAAI/bge-large-en-v1.5"])
    else:
        assert embedder["used"] == [] and not embedder["fell_back"], "MILO embeds nothing"
        assert summary["final_test"] and all(r["k"] == 1 for r in summary["final_test"])
        nodes = [p["node"] for p in _events(run_dir, "milo.node")]
        assert any(n["origin"] == "mutation" for n in nodes), "no island ran a round"


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_runs_from_the_command_line(matrix, experiment):
    run_dir, manifest = _job(matrix, f"exp-{experiment}")
    assert manifest["summary"]["final_test"]


def test_every_experiment_left_out_for_its_endpoint_runs_in_its_own_test():
    every = {p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml")}
    assert every - set(EXPERIMENTS) == set(ENDPOINT_EXPERIMENTS)
    root = Path(__file__).resolve().parents[2]
    for experiment, test in ENDPOINT_EXPERIMENTS.items():
        assert f"+experiment={experiment}" in (root / test).read_text(), test


def _requests(run_dir: Path) -> list[dict]:
    files = sorted((run_dir / "workspace" / "mutations").glob("island-*/round-*.request.json"))
    assert files, "no mutation request recorded"
    return [json.loads(f.read_text()) for f in files]


# rung -> (mutator mode, memory the mutator reads, islands, orchestrator acts)
LADDER = {
    "milo_A": ("one_shot", "flat", 1, False),
    "milo_B": ("agentic", "flat", 1, False),
    "milo_C": ("agentic", "lineage", 1, False),
    "milo_D": ("agentic", "lineage", 3, False),
    "milo_E": ("agentic", "lineage", 3, True),
}


@pytest.mark.slow
@pytest.mark.parametrize("rung", sorted(LADDER))
def test_each_ablation_rung_gives_its_mutator_what_the_rung_says(matrix, rung):
    run_dir, _ = _job(matrix, f"{rung}-surrogate_tb21")
    mode, memory, islands, orchestrates = LADDER[rung]
    reqs = _requests(run_dir)
    for req in reqs:
        assert req["context"]["mode"] == mode
        if mode == "one_shot":
            assert req["evidence_files"] == [], "a one-shot mutator must see no evidence"
        else:
            assert "report.md" in req["evidence_files"] and any(f.startswith("traces/") for f in req["evidence_files"])
        text = Path(req["memory_path"]).read_text()
        if memory == "flat":
            assert text.startswith("# Archive") and "Lineage tree" not in text and "verdict:" not in text
        else:
            assert "## Lineage tree" in text and "verdict:" in text
    (init,) = _events(run_dir, "milo.init")
    assert len(init["islands"]) == islands
    decisions = _events(run_dir, "milo.decision")
    assert bool(decisions) == orchestrates, f"{len(decisions)} orchestrator decisions"


@pytest.mark.slow
def test_the_records_command_reads_an_instance_level_run(matrix):
    run_dir, _ = _job(matrix, "exp-milo_einstein")
    proc = subprocess.run([sys.executable, "-m", "milo_ray.einstein", "best", str(run_dir), "--out",
                           str(run_dir / "records")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((run_dir / "records" / "first_autocorrelation.json").read_text())
    assert record["problem"] == "first_autocorrelation" and len(record["values"]) >= 600
    assert "alphaevolve" in proc.stdout and f"{record['score']:.10f}" in proc.stdout
