"""What the optimizer runner gives a program (in-process, no sandbox): the formulas, the
ratchet and the stage driver are in its namespace before its code runs, a name the
program defines itself wins, and a program written before the names were given (its
own copies of everything) still runs, bit for bit as the seed that now uses them."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from milo_ray.benchmarks.einstein.problems import PROBLEMS, check, score
from milo_ray.benchmarks.einstein.starts import start_values
from milo_ray.boundary.inside.optimizer_runner import load_program
from milo_ray.kernels import autocorr_kit

SEEDS_DIR = Path(__file__).resolve().parents[2] / "milo_ray" / "benchmarks" / "einstein" / "seeds"
SELF_CONTAINED = Path(__file__).resolve().parent / "data" / "self_contained_lse_adam.py"


def _write(tmp_path: Path, source: str) -> str:
    path = tmp_path / "harness.py"
    path.write_text(source)
    return str(path)


def test_a_programs_own_definition_wins_and_the_given_helpers_keep_their_own(tmp_path):
    source = '''
import numpy as np

def score(h, problem):  # the program's own: replaces the given one in its namespace
    return -1.0

def optimize(values, *, seed, deadline):
    assert score(values, PROBLEM) == -1.0
    offer(project(values * 0.5, PROBLEM), PROBLEM)  # the ratchet scores with the given score
    return best()
'''
    published = []
    module = load_program(_write(tmp_path, source), "first_autocorrelation", published.append)
    assert module.score is not autocorr_kit.score and module.project is autocorr_kit.project
    h = start_values({"base": "random", "n": 32, "seed": 1}, "first_autocorrelation")
    out = module.optimize(h, seed=0, deadline=time.monotonic() + 1)
    assert len(published) == 1 and np.array_equal(published[0], out)
    assert module.best_score() == pytest.approx(score("first_autocorrelation", out), rel=1e-12)


def test_problem_and_publish_are_the_runners_even_over_a_programs_placeholders(tmp_path):
    source = 'PROBLEM = None\n\ndef publish(values):\n    raise AssertionError("placeholder")\n\n' \
             'def optimize(values, *, seed, deadline):\n    offer(values, PROBLEM)\n    return best()\n'
    published = []
    module = load_program(_write(tmp_path, source), "third_autocorrelation", published.append)
    assert module.PROBLEM == "third_autocorrelation"
    module.optimize(np.ones(8), seed=0, deadline=time.monotonic() + 1)
    assert len(published) == 1


def test_two_loaded_programs_keep_separate_ratchets(tmp_path):
    source = 'def optimize(values, *, seed, deadline):\n    offer(values, PROBLEM)\n    return best()\n'
    a = load_program(_write(tmp_path, source), "first_autocorrelation", lambda v: None, module_name="a")
    b = load_program(_write(tmp_path, source), "first_autocorrelation", lambda v: None, module_name="b")
    a.optimize(np.ones(8), seed=0, deadline=0)
    assert np.isfinite(a.best_score()) and b.best_score() == float("inf")


def _step_clock(real):
    """A monotonic clock that advances 1 ms per call from this thread; other threads (a
    previous test's loops and log workers live on in the process) keep the real one, so
    they cannot take this run's ticks."""
    ticks, here = itertools.count(1), threading.get_ident()
    return lambda: next(ticks) * 1e-3 if threading.get_ident() == here else real()


@pytest.mark.parametrize("problem", PROBLEMS)
def test_a_self_contained_program_runs_bit_for_bit_as_the_seed_using_the_given_names(problem, monkeypatch):
    """Under a clock that advances a fixed step per call a run depends only on the code:
    the old self-contained lse_adam and today's (its helpers given) reach the same point."""
    h0 = start_values({"base": "random", "n": 64, "seed": 2}, problem)
    runs = []
    for path in (SELF_CONTAINED, SEEDS_DIR / "lse_adam" / "harness.py"):
        monkeypatch.setattr(time, "monotonic", _step_clock(time.monotonic))
        published = []
        module = load_program(str(path), problem, published.append, module_name=f"adam_{path.parent.name}")
        out = module.optimize(h0.copy(), seed=0, deadline=time.monotonic() + 0.6)
        monkeypatch.undo()
        runs.append((np.asarray(out), len(published)))
    (old, old_n), (new, new_n) = runs
    assert check(problem, new) is None and score(problem, new) < score(problem, h0)
    assert old_n == new_n > 0
    assert old.tobytes() == new.tobytes()


@pytest.mark.parametrize("module", ["milo_ray/kernels/autocorr_kit.py", "milo_ray/boundary/inside/optimizer_blocks.py",
                                    "milo_ray/boundary/inside/optimizer_runner.py"])
def test_the_files_uploaded_to_the_sandbox_import_only_numpy_scipy_and_the_standard_library(module):
    """milo_ray is not importable in the sandbox: the runner reaches the formulas as the
    file beside it there (its package import runs only on the host)."""
    import ast
    import sys

    tree = ast.parse((Path(__file__).resolve().parents[2] / module).read_text())
    top = [stmt for stmt in tree.body if isinstance(stmt, (ast.Import, ast.ImportFrom))]
    names = {alias.name.split(".")[0] for s in top if isinstance(s, ast.Import) for alias in s.names}
    names |= {s.module.split(".")[0] for s in top if isinstance(s, ast.ImportFrom) and s.module}
    assert names - {"__future__", "numpy", "scipy"} <= set(sys.stdlib_module_names), names


def test_a_seed_on_the_given_stages_runs_from_the_uploaded_files_alone(tmp_path):
    """In the sandbox the runner imports the kit and the blocks as the files beside it:
    a seed that is only a schedule of given stages runs there (as a script, no milo_ray)."""
    import os
    import subprocess
    import sys

    from milo_ray.boundary.optimizer_process import runner_files

    for name, content in runner_files("run_optimizer.py").items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "harness.py").write_bytes((SEEDS_DIR / "lse_lbfgs" / "harness.py").read_bytes())
    h0 = start_values({"base": "random", "n": 40, "seed": 1}, "erdos_minimum_overlap")
    np.save(tmp_path / "start.npy", h0)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "run_optimizer.py", "harness.py", "start.npy", "erdos_minimum_overlap",
                    "0", "1.0", "5"], cwd=tmp_path, env=env, check=True, timeout=60)
    import json

    assert json.loads((tmp_path / "status.json").read_text())["status"] == "returned"
    out = np.load(tmp_path / "best.npy")
    assert check("erdos_minimum_overlap", out) is None
    assert score("erdos_minimum_overlap", out) < score("erdos_minimum_overlap", h0)
