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
