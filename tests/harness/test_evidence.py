"""Evidence directory layout from real surrogate rollouts."""

from __future__ import annotations

import json

from milo_ray.benchmarks.surrogate import SurrogateBenchmark
from milo_ray.benchmarks.surrogate_executor import SurrogateExecutor
from milo_ray.harness.evidence import write_evidence_dir
from milo_ray.harness.seeds import load_seeds


class BlobStore:
    def __init__(self):
        self.blobs = {}

    def get_blob(self, ref):
        return self.blobs[ref]


def test_evidence_dir_has_report_traces_ctrf_and_results_for_failures(tmp_path):
    b = SurrogateBenchmark("surrogate_deepswe", seed=1)
    ex = SurrogateExecutor("surrogate_deepswe", seed=1)
    h = load_seeds(["minimal"])[0]
    tasks = b.tasks("train")[:12]
    store = BlobStore()
    results = []
    for t in tasks:
        for i in range(2):
            r = ex.execute(h, t, i, 0)
            if i == 1:  # stored trace: the writer must fetch it from the blob store
                store.blobs[f"ref-{t.task_id}"] = r.trace
                r.trace, r.trace_ref = None, f"ref-{t.task_id}"
            results.append(r)
    root = write_evidence_dir(tmp_path / "ev", h, results, tasks, store)
    report = (root / "report.md").read_text()
    assert all(t.task_id in report for t in tasks) and "accuracy" in report
    merged = json.loads((root / "ctrf.json").read_text())["results"]
    assert merged["summary"]["tests"] == len(merged["tests"]) > 0
    for t in tasks:
        rs = [r for r in results if r.task_id == t.task_id]
        tdir = root / "traces" / t.task_id
        worst = min(rs, key=lambda r: (r.score, r.rollout_idx))
        traj = json.loads((tdir / "trajectory.json").read_text())
        assert traj["rollout_idx"] == worst.rollout_idx
        assert (tdir / "rollout-0" / "trajectory.json").exists() and (tdir / "rollout-1" / "ctrf.json").exists()
        assert (tdir / "result.json").exists() == any(not r.resolved for r in rs)


def test_a_real_verifier_failure_is_in_result_json_and_leaves_no_null_ctrf(tmp_path):
    from milo_ray.core.rollouts import RolloutResult

    h = load_seeds(["minimal"])[0]
    verifier = {"score": 0.0, "reward": {}, "error": "test.sh wrote no reward (it needs the network)",
                "seconds": 1.5, "output": "curl: (6) Could not resolve host"}
    r = RolloutResult(h.harness_id, "needs-net", 0, score=0.0, error_kind="task", error=verifier["error"],
                      trace={"trajectory": {"steps": []}, "ctrf": None, "verifier": verifier})
    root = write_evidence_dir(tmp_path / "ev", h, [r], [])
    tdir = root / "traces" / "needs-net"
    assert (tdir / "trajectory.json").is_file() and not (tdir / "ctrf.json").exists()
    result = json.loads((tdir / "result.json").read_text())
    assert result["rollouts"][0]["verifier"] == verifier


def _rollout(task_id: str, idx: int, invalid: int | None, score: float = 0.0):
    from milo_ray.core.rollouts import RolloutResult

    steps = [{"role": "user", "content": "write 42"},
             {"role": "assistant", "content": "", "invalid_tool_calls": [
                 {"id": f"c{i}", "name": "write_file", "args": '{"content": "4', "error": "not valid JSON"}
                 for i in range(invalid or 0)]}]
    return RolloutResult("h", task_id, idx, score=score, invalid_tool_calls=invalid,
                         trace={"trajectory": {"steps": steps, "final": {"invalid_tool_calls": invalid}}})


def test_invalid_tool_calls_are_counted_in_the_report_and_result_json(tmp_path):
    h = load_seeds(["minimal"])[0]
    results = [_rollout("cut", 0, 2), _rollout("cut", 1, 0), _rollout("fine", 0, 0, score=1.0)]
    root = write_evidence_dir(tmp_path / "ev", h, results, [])
    report = (root / "report.md").read_text()
    assert ("- invalid tool calls (the model's tool calls whose arguments did not parse; not run): 2 in all, "
            "in 1 of the 3 rollouts that counted them") in report
    assert "| timeouts | invalid tool calls | errors |" in report
    assert "| cut | FAIL | - | 0.000 | 0/2 | 0 | 0 | 0 | 2 | - |" in report
    result = json.loads((root / "traces" / "cut" / "result.json").read_text())
    assert [r["invalid_tool_calls"] for r in result["rollouts"]] == [2, 0]
    trajectory = json.loads((root / "traces" / "cut" / "trajectory.json").read_text())
    assert trajectory["steps"][-1]["invalid_tool_calls"][0]["args"] == '{"content": "4'


def test_rollouts_that_did_not_count_invalid_tool_calls_claim_no_figure(tmp_path):
    # Surrogate and oracle rollouts (and older runs) never looked: no "0" is shown for them.
    h = load_seeds(["minimal"])[0]
    root = write_evidence_dir(tmp_path / "ev", h, [_rollout("t", 0, None)], [])
    report = (root / "report.md").read_text()
    assert "invalid tool calls" not in report
    assert "invalid_tool_calls" not in json.loads((root / "traces" / "t" / "result.json").read_text())["rollouts"][0]
