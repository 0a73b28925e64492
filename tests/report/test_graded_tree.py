"""The report's rubric section: a graded tree's texts (the rubric's requirements, the
grader's reasons, a judge failure's message) reach the page escaped, every leaf with its
verdict, and a run of another benchmark gets no section."""

from __future__ import annotations

from types import SimpleNamespace

from milo_ray.report import graded_tree

HOSTILE = '<script>alert(1)</script><img src=x onerror="x()">'


def _tree():
    return {"id": "root", "weight": 1, "score": 0.5, "requirements": "the paper", "sub_tasks": [
        {"id": "a", "weight": 1, "category": "Code Development", "requirements": HOSTILE, "status": "graded",
         "score": 1.0, "reason": "defined in " + HOSTILE},
        {"id": "b", "weight": 1, "category": "Code Development", "requirements": "b", "status": "judge_failed",
         "score": 0.0, "error": "not a verdict: " + HOSTILE},
        {"id": "c", "weight": 1, "category": "Result Analysis", "requirements": "c", "status": "not_sampled"}]}


def test_leaf_texts_are_escaped_and_every_leaf_shows_its_verdict():
    block = graded_tree._tree_block({"task_id": "p<1>", "rollout_idx": 0, "score": 0.5, "error": None},
                                    {"tree": _tree()})
    assert "<script>" not in block and "<img" not in block and "&lt;script&gt;" in block
    assert 'data-leaf="a" data-verdict="PASS"' in block and "reason: defined in &lt;script&gt;" in block
    assert 'data-leaf="b" data-verdict="JUDGE FAILED"' in block and "why: not a verdict" in block
    assert 'data-leaf="c" data-verdict="NOT GRADED"' in block
    assert block.startswith('<details class="graded"')  # collapsed until opened
    assert "p&lt;1&gt;" in block and "leaves: 1 pass · 1 judge failed · 1 not graded" in block


def test_a_run_of_another_benchmark_gets_no_rubric_section():
    assert graded_tree.sections(SimpleNamespace(benchmark="harbor")) == []
