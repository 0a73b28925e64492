"""`python -m milo_ray.einstein best`: the lowest exactly re-verified construction per
problem, read from a real Parquet run store, with anchors, JSON output and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from milo_ray.benchmarks.einstein.problems import ANCHORS, score
from milo_ray.core.rollouts import RolloutResult
from milo_ray.einstein import best_records, main
from milo_ray.store import ParquetRunStore

ROOT = Path(__file__).resolve().parents[2]


def _exact_first(h) -> float:
    """Independent of the package: 2n max(h*h) / (sum h)^2 by direct summation."""
    h = np.asarray(h, dtype=np.float64)
    n = h.size
    conv = [sum(h[i] * h[k - i] for i in range(max(0, k - n + 1), min(k, n - 1) + 1)) for k in range(2 * n - 1)]
    return 2 * n * max(conv) / h.sum() ** 2


def _trace(problem, values, stored=None, reason=None):
    return {"problem": problem, "n": len(values) if values is not None else 0, "start_score": 2.0,
            "score": (score(problem, values) if stored is None else stored) if values is not None else None,
            "reason": reason, "trajectory": [[0.5, 1.9]], "values": None if values is None else list(values),
            "stdout_tail": "", "stderr_tail": ""}


GOOD = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]  # first autocorrelation 1.865
MID = [0.9, 1.0, 1.1, 1.0, 0.95, 1.05, 1.0, 0.9]  # 2.007
BAD = [0.1, 0.1, 0.1, 3.0, 0.1, 0.1, 0.1, 0.1]  # 10.59
THIRD = [1.0, -0.3, 0.8, 0.2, -0.1, 0.9, 0.4, 0.6]


def _roll(hid, task, idx, trace, reward=0.5, **kw):
    return RolloutResult(hid, task, idx, score=reward, trace=trace, run_id="run-a", cache_key=f"{hid}/{task}/{idx}", **kw)


def _run(tmp_path, results, harnesses=()):
    root = tmp_path / "run"
    with ParquetRunStore(root, run_id="run-a", flush_seconds=None) as store:
        store.append_rollouts(results)
        if harnesses:
            store.append("harnesses", [{"harness_id": h, "name": n} for h, n in harnesses])
    return root


@pytest.fixture
def run_dir(tmp_path):
    assert score("first_autocorrelation", GOOD) < score("first_autocorrelation", MID) < score("first_autocorrelation", BAD)
    return _run(tmp_path, [
        _roll("h-mid", "first-0", 0, _trace("first_autocorrelation", MID)),
        _roll("h-good", "first-1", 1, _trace("first_autocorrelation", GOOD)),
        _roll("h-bad", "first-2", 0, _trace("first_autocorrelation", BAD)),
        # A trace claiming a tiny score for a poor point: the order comes from the values.
        _roll("h-liar", "first-3", 0, _trace("first_autocorrelation", BAD, stored=0.5)),
        # Infeasible: no point, and a point violating h >= 0 under a feasible-looking score.
        _roll("h-crash", "first-4", 0, _trace("first_autocorrelation", None, reason="crashed"), reward=0.0,
              error_kind="harness", error="crashed"),
        _roll("h-neg", "first-5", 0, _trace("first_autocorrelation", [-1.0] + GOOD[1:], stored=0.1)),
        _roll("h-third", "third-0", 0, _trace("third_autocorrelation", THIRD)),
        # An agent rollout in the same run: not an einstein trace.
        _roll("h-agent", "swe-1", 0, {"trajectory": {"steps": []}, "ctrf": None}),
    ], harnesses=[("h-good", "seed-anneal+")])


def test_best_is_the_lowest_exact_score_per_problem(run_dir):
    rr = best_records(run_dir)
    first = rr.records["first_autocorrelation"]
    assert (first.candidate.harness_id, first.candidate.task_id, first.candidate.rollout_idx) == ("h-good", "first-1", 1)
    assert first.score == pytest.approx(_exact_first(GOOD), rel=1e-14)
    assert first.n_candidates == 4  # mid, good, bad, liar; the crash and the negative point are infeasible
    assert rr.records["third_autocorrelation"].candidate.task_id == "third-0"
    assert "erdos_minimum_overlap" not in rr.records and rr.n_rollouts == 7


def test_main_prints_anchors_and_writes_json(run_dir, tmp_path, capsys):
    out = tmp_path / "records"
    assert main(["best", str(run_dir), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    exact = _exact_first(GOOD)
    assert f"best {exact:.10f}" in text and "harness h-good (seed-anneal+), task first-1, rollout 1" in text
    for anchor, value in ANCHORS["first_autocorrelation"].items():
        assert f"{anchor:<12} {value:>14.10f} {exact - value:>+14.3e}" in text
    assert "run run-a" in text
    data = json.loads((out / "first_autocorrelation.json").read_text())
    assert data["problem"] == "first_autocorrelation" and data["values"] == GOOD
    assert data["score"] == pytest.approx(exact, rel=1e-14)
    assert sorted(p.name for p in out.iterdir()) == ["first_autocorrelation.json", "third_autocorrelation.json"]


def test_problem_filter_and_default_out_dir(run_dir, capsys):
    assert main(["best", str(run_dir), "--problem", "third_autocorrelation"]) == 0
    assert "first_autocorrelation" not in capsys.readouterr().out
    assert sorted(p.name for p in (run_dir / "records").iterdir()) == ["third_autocorrelation.json"]
    assert json.loads((run_dir / "records" / "third_autocorrelation.json").read_text())["values"] == THIRD


def test_errors_exit_2_with_one_line(tmp_path, run_dir, capsys):
    assert main(["best", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert "run directory not found" in err and "\n" not in err
    # A run of agent rollouts only.
    agents = _run(tmp_path / "a", [_roll("h", "swe-1", 0, {"trajectory": {"steps": []}})])
    assert main(["best", str(agents)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no einstein rollouts" in err and "\n" not in err
    # A problem the run never tried.
    assert main(["best", str(run_dir), "--problem", "erdos_minimum_overlap"]) == 2
    assert "no erdos_minimum_overlap rollouts" in capsys.readouterr().err
    # Einstein rollouts, none feasible.
    dead = _run(tmp_path / "d", [_roll("h", "first-0", 0, _trace("first_autocorrelation", None, reason="x"), reward=0.0)])
    assert main(["best", str(dead)]) == 2
    assert "feasible" in capsys.readouterr().err


def test_command_line(run_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "cli"
    p = subprocess.run([sys.executable, "-m", "milo_ray.einstein", "best", str(run_dir), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "h-good" in p.stdout and (out / "first_autocorrelation.json").exists()
    p = subprocess.run([sys.executable, "-m", "milo_ray.einstein", "best", str(tmp_path / "missing")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: ")


def test_record_score_is_the_exact_verifier_value(run_dir, tmp_path, monkeypatch):
    """At small n FFT and direct sums agree to the bit, so watch the exact verifier itself:
    the reported and written score is its value for the chosen construction."""
    import milo_ray.einstein as records
    from milo_ray.kernels import autocorr

    calls = []

    def spy(problem, h):
        calls.append((problem, list(h)))
        return autocorr.verify(problem, h) + 1e-9  # a mark the FFT score cannot carry

    monkeypatch.setattr(records, "verify", spy)
    assert main(["best", str(run_dir), "--out", str(tmp_path / "o")]) == 0
    assert ("first_autocorrelation", GOOD) in calls
    data = json.loads((tmp_path / "o" / "first_autocorrelation.json").read_text())
    assert data["score"] == autocorr.verify("first_autocorrelation", GOOD) + 1e-9
