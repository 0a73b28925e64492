"""Tiny finished runs that several test files read (the results API, the report and its
figures, MLflow tracking), produced once per test session in one process
(tests/entry/cli_jobs.py: one Ray start for all of them).

Each run is as small as the checks on it allow:

* ``milo``: MILO on surrogate_tb21, 3 islands, 2 rounds with patience 1 (so the
  orchestrator reassigns mutators), logged to MLflow (experiment ``tiny``), and written
  its report as a finished run does by default;
* ``ssr``: SSR on surrogate_tb21, one refresh and races, logged to MLflow;
* ``sweep``: a Hydra multirun of MILO's rungs A and B (``sweep/0``, ``sweep/1``);
* ``einstein``: MILO on the first autocorrelation problem, 2 islands (two seed programs), one round;
* ``eval``: two seed harnesses evaluated;
* ``failing``: MILO with a tracking backend that raises (tests/tracking/failing_tracker.py).

Only ``milo`` writes a report; ``stdout.txt`` holds what the runs printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "entry" / "cli_jobs.py"

COMMON = ["run.progress=false", "execution.num_cpus=2"]
QUIET = [*COMMON, "run.report=false"]
# k_test=2 > k_search=1: the final test reuses the rollouts the search already ran on
# test tasks (surrogate_tb21's search tasks are test tasks too) and runs one more each.
MILO_TINY = ["method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1", "method.k_test=2",
             "method.max_rounds=1"]
MILO_SMALL = ["method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1", "method.k_test=1",
              "method.max_rounds=2", "method.patience=1"]
SSR_TINY = ["method=ssr", "benchmark=surrogate_tb21", "method.scales=[0.5,1.0]", "method.b_v=[2,2]", "method.b_s=1",
            "method.b_f=1", "method.rollouts=1", "method.patience=1", "method.test_rollouts=2",
            "run.budget.executions=60"]
EINSTEIN_PROBLEM = "first_autocorrelation"
EINSTEIN_SMALL = ["+experiment=milo_einstein", f"benchmark.problem={EINSTEIN_PROBLEM}", "benchmark.budget_s=2",
                  "benchmark.grace_s=1", "run.time_limit_s=null", "method.search_size=2", "method.val_size=1",
                  "method.max_rounds=1", "method.num_islands=2", "method.seeds=[lse_adam,subgradient]"]


def jobs(root: Path) -> dict[str, list[str]]:
    return {
        "milo": [*MILO_SMALL, *COMMON, "tracking=mlflow", "tracking.experiment=tiny", f"run.dir={root / 'milo'}"],
        "ssr": [*SSR_TINY, *QUIET, "tracking=mlflow", f"run.dir={root / 'ssr'}"],
        "sweep": ["-m", "method=milo_A,milo_B", *MILO_TINY, *QUIET, f"run.dir={root / 'sweep'}"],
        "einstein": [*EINSTEIN_SMALL, *QUIET, f"run.dir={root / 'einstein'}"],
        "eval": ["method=eval", "method.k=2", "method.names=[minimal,stock]", *QUIET, f"run.dir={root / 'eval'}"],
        "failing": [*MILO_TINY, *QUIET, "tracking._target_=failing_tracker.FailingTracker",
                    f"run.dir={root / 'failing'}"],
    }


def produce(root: Path) -> Path:
    """Run every job into ``root``; a job that fails fails the caller with its output."""
    todo = jobs(root)
    (root / "jobs.json").write_text(json.dumps(todo))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "PYTHONPATH": os.pathsep.join([str(HERE / "tracking"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(RUNNER), str(root / "jobs.json"), str(root / "out.json")], cwd=root,
                          capture_output=True, text=True, timeout=900, env=env)
    (root / "stdout.txt").write_text(proc.stdout)
    out = json.loads((root / "out.json").read_text()) if (root / "out.json").exists() else {}
    failed = {name: out.get(name) for name in todo if out.get(name, {}).get("code") != 0}
    assert not failed, f"shared runs failed: {failed}\n{proc.stderr[-4000:]}"
    return root
