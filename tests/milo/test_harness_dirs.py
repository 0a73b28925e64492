"""Agent-facing harness directories: one per harness, a diff per distinct parent edit."""

from __future__ import annotations

from milo_ray.harness.model import Harness
from milo_ray.milo.evaluate import write_harness_dir


def test_same_harness_from_two_parents_keeps_both_diffs(tmp_path):
    h = Harness({"harness.py": "def build_agent(model, backend):\n    return None\n"})
    d1, p1 = write_harness_dir(tmp_path, h, "--- a\n+++ b\n@@ first parent @@\n", parent_id="aaaaaaaaaaaaaaaa")
    d2, p2 = write_harness_dir(tmp_path, h, "--- a\n+++ b\n@@ second parent @@\n", parent_id="bbbbbbbbbbbbbbbb")
    again, p3 = write_harness_dir(tmp_path, h, "--- a\n+++ b\n@@ first parent @@\n", parent_id="aaaaaaaaaaaaaaaa")
    assert d1 == d2 == again and (d1 / "harness.py").read_text() == h.source
    assert p1.name == "diff.patch" and "first parent" in p1.read_text()
    assert p2.name == "diff-from-bbbbbbbbbbbb.patch" and "second parent" in p2.read_text()
    assert p3 == p1  # the same edit again reuses its file
    assert write_harness_dir(tmp_path, h, None) == (d1, None)  # a seed has no diff


def test_a_recorded_node_is_rebased_under_the_current_run_directory(tmp_path):
    from milo_ray.milo.lineage import LineageNode
    from milo_ray.milo.records import rebased

    old = "/elsewhere/old-run/workspace/harnesses/abc"
    n = LineageNode(node_id="0-1", harness_id="abc", island=0, round=1, origin="mutation", parent="0-0",
                    harness_path=f"{old}/harness.py", diff_path=f"{old}/diff-from-aaaa.patch",
                    evidence_path=f"{old}/evidence")
    moved = rebased(tmp_path, n)
    d = tmp_path / "workspace" / "harnesses" / "abc"
    assert (moved.harness_path, moved.diff_path, moved.evidence_path) == (
        str(d / "harness.py"), str(d / "diff-from-aaaa.patch"), str(d / "evidence"))
    assert n.harness_path == f"{old}/harness.py"  # the recorded node is left as it was
    assert rebased(tmp_path, LineageNode(node_id="0-2", harness_id="", island=0, round=2,
                                         origin="mutation")).harness_path is None


def test_a_nodes_missing_files_are_rewritten_from_its_source_blob_and_stored_rollouts(tmp_path):
    from types import SimpleNamespace

    from milo_ray.core.rollouts import RolloutResult, cache_key
    from milo_ray.milo.lineage import LineageNode
    from milo_ray.milo.records import node_files
    from milo_ray.store.parquet import ParquetRunStore

    store = ParquetRunStore(tmp_path / "store", run_id="r", flush_rows=1)
    h = Harness({"harness.py": "def build_agent(model, backend):\n    return 1\n", "notes.md": "x\n"})
    ref = store.put_harness_source(dict(h.files))
    tasks = ["t-a", "t-b"]
    store.append_rollouts([RolloutResult(h.harness_id, t, i, 0.0 if t == "t-a" else 1.0, output_tokens=7,
                                         error_kind="harness" if t == "t-a" else None, error="boom",
                                         cache_key=cache_key(h.harness_id, t, i, "m", 5))
                           for t in tasks for i in range(2)])
    store.flush()
    run = SimpleNamespace(run_dir=tmp_path / "moved", cfg=SimpleNamespace(k_search=2),
                          ctx=SimpleNamespace(model_id="m", seed=5, store=store,
                                              benchmark=SimpleNamespace(task=lambda t: SimpleNamespace(task_id=t))),
                          harness=lambda n: Harness(dict(store.get_blob(n.source_ref))))
    n = LineageNode(node_id="0-1", harness_id=h.harness_id, island=0, round=1, origin="mutation",
                    source_ref=ref, harness_path="/gone/harness.py", evidence_path="/gone/evidence",
                    behavior={t: 0.0 for t in tasks})
    d, ev = node_files(run, n)
    assert d == run.run_dir / "workspace" / "harnesses" / h.harness_id and ev == d / "evidence"
    assert {p.name: p.read_text() for p in d.iterdir() if p.is_file()} == dict(h.files)
    report = (ev / "report.md").read_text()
    # The failing task's two stored rollouts are its evidence (its result.json names both).
    result = (ev / "traces" / "t-a" / "result.json").read_text()
    assert '"rollout_idx": 1' in result and "boom" in result and "t-b" in report
    # A node evaluated on nothing gets no evidence directory.
    assert node_files(run, LineageNode(node_id="s", harness_id=h.harness_id, island=0, round=0, origin="seed",
                                       source_ref=ref))[1] is None
