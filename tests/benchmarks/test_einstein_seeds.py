"""Invariants of the seed optimizer programs of the instance-level track: each one,
loaded from its file the way the runner loads it (with the names the runner gives:
PROBLEM, publish, the problem's formulas, the ratchet, run_stages), improves a random
start of every problem within a short budget, returns a feasible point before the
deadline, publishes only strictly improving points, keeps the CONFIG/STAGES layout the
program mutator edits, and holds only its optimizer (no copy of a given name)."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import numpy as np
import pytest

from milo_ray.benchmarks.einstein.problems import PROBLEMS, check, score
from milo_ray.benchmarks.einstein.starts import start_values
from milo_ray.boundary.inside.optimizer_blocks import STAGE_SETTINGS
from milo_ray.boundary.inside.optimizer_runner import given_names, load_program

SEEDS_DIR = Path(__file__).resolve().parents[2] / "milo_ray" / "benchmarks" / "einstein" / "seeds"
SEEDS = sorted(p.parent.name for p in SEEDS_DIR.glob("*/harness.py"))
BUDGET_S = 1.5
N = 120


def load(name: str, problem: str, published: list):
    return load_program(str(SEEDS_DIR / name / "harness.py"), problem,
                        lambda values: published.append(np.array(values, dtype=np.float64)),
                        module_name=f"einstein_seed_{name}_{problem}")


def test_the_four_named_seeds_exist():
    assert {"subgradient", "lse_adam", "lse_lbfgs", "ratchet_upsample"} <= set(SEEDS)


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("name", SEEDS)
def test_seed_improves_a_random_start_feasibly_in_time_publishing_only_improvements(name, problem):
    h0 = start_values({"base": "random", "n": N, "seed": 3}, problem)
    s0 = score(problem, h0)
    published: list = []
    module = load(name, problem, published)
    t0 = time.monotonic()
    out = module.optimize(h0.copy(), seed=0, deadline=t0 + BUDGET_S)
    elapsed = time.monotonic() - t0
    assert elapsed <= BUDGET_S + 1.0
    out = np.asarray(out, dtype=np.float64)
    assert out.ndim == 1 and out.size % N == 0
    assert check(problem, out) is None
    end = score(problem, out)
    assert end < s0 * (1 - 1e-3)  # a random start leaves tens of percent; any real optimizer gains 0.1%
    assert published, "no improvement was published"
    scores = [s0]
    for p in published:
        assert check(problem, p) is None
        assert p.size % N == 0
        scores.append(score(problem, p))
    worse = [(i, a, b) for i, (a, b) in enumerate(zip(scores, scores[1:])) if not b < a]
    assert not worse, f"{len(worse)} published points not strictly better than the previous best, first: {worse[0]}"
    assert end == pytest.approx(scores[-1], rel=0, abs=1e-12)


def test_given_stage_names_the_config_keys_a_program_lacks(tmp_path):
    """A program that runs a given stage without its settings is told which keys to add."""
    path = tmp_path / "harness.py"
    path.write_text('CONFIG = {"t_hot": 1e-3}\nSTAGES = ["ladder"]\n\n'
                    'def optimize(values, *, seed, deadline):\n'
                    '    return run_stages(values, seed=seed, deadline=deadline, stages=STAGES, margin_s=0.0, '
                    'margin_frac=0.0)\n')
    module = load_program(str(path), "first_autocorrelation", lambda values: None)
    with pytest.raises(KeyError, match="t_cold.*add them to the program's CONFIG"):
        module.optimize(np.ones(8), seed=0, deadline=time.monotonic() + 1)


@pytest.mark.parametrize("name", SEEDS)
def test_seed_without_problem_raises_a_clear_error(name):
    module = load(name, "first_autocorrelation", [])
    module.PROBLEM = None
    with pytest.raises(RuntimeError, match="PROBLEM"):
        module.optimize(np.ones(8), seed=0, deadline=time.monotonic() + 1)


def _top_level_literal(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"no module-level {name} = <literal>")


@pytest.mark.parametrize("name", SEEDS)
def test_seed_keeps_the_config_and_stages_layout(name):
    text = (SEEDS_DIR / name / "harness.py").read_text()
    tree = ast.parse(text)
    config = _top_level_literal(tree, "CONFIG")
    stages = _top_level_literal(tree, "STAGES")
    assert isinstance(config, dict) and config
    assert all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
               for k, v in config.items())
    assert isinstance(stages, list) and stages and all(isinstance(s, str) for s in stages)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    given_stages = {stage for stage in stages if f"stage_{stage}" not in functions}
    for stage in stages:
        fn = functions.get(f"stage_{stage}")
        if fn is None:
            assert stage in STAGE_SETTINGS, f"STAGES names {stage!r} but no stage_{stage} is defined or given"
            continue
        assert [a.arg for a in fn.args.args] == ["h", "rng", "deadline", "problem"]
    assert "optimize" in functions
    # Only its optimizer: nothing the runner gives is defined (or assigned) again here.
    defined = set(functions) | {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                                if isinstance(t, ast.Name)}
    given = set(given_names({})) | {"PROBLEM", "publish"}
    assert not defined & given, f"{name} redefines given names {sorted(defined & given)}"
    # Self-contained: the program runs where only numpy, scipy and the standard library exist.
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"math", "time", "numpy", "scipy"}, imported
    # Every tunable is read, through CONFIG[...] here or by a given stage the program runs,
    # and every key read is defined: no dead knobs.
    read = {node.slice.value for node in ast.walk(tree)
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "CONFIG"
            and isinstance(node.slice, ast.Constant)}
    read |= {key for stage in given_stages for key in STAGE_SETTINGS[stage]}
    assert read == set(config), f"unread: {set(config) - read}, undefined: {read - set(config)}"


@pytest.mark.parametrize("problem", PROBLEMS)
def test_slp_stage_alone_improves_and_publishes_only_feasible_strict_improvements(problem):
    """The linear-programming stage of slp_polish, run by itself from a random start:
    its steps are accepted only through the exact score, so every published point is
    feasible and strictly better than the last, and it makes progress on its own."""
    h0 = start_values({"base": "random", "n": 60, "seed": 5}, problem)
    s0 = score(problem, h0)
    published: list = []
    module = load("slp_polish", problem, published)
    module.reset_best(h0, problem)
    out = module.stage_slp(h0.copy(), np.random.default_rng(0), time.monotonic() + 0.5, problem)
    assert check(problem, out) is None
    assert published, "the SLP stage published no improvement"
    scores = [s0]
    for p in published:
        assert check(problem, p) is None
        scores.append(score(problem, p))
    assert all(b < a for a, b in zip(scores, scores[1:]))
    assert scores[-1] < s0 * (1 - 1e-3)
    assert score(problem, out) == pytest.approx(scores[-1], rel=0, abs=1e-12)
