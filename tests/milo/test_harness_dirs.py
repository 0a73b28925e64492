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
