"""Invariants of the harness diff: line counts, file sets, determinism, applicability."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from milo_ray.harness.diff import HarnessDiff, diff
from milo_ray.harness.model import Harness

BASE = "def build_agent(model, backend):\n    prompt = 'solve it'\n    return {'model': model}\n"


def test_identical_harnesses_have_an_empty_diff():
    h = Harness.from_source(BASE)
    d = diff(h, Harness.from_source(BASE, name="other label"))
    assert d == HarnessDiff(patch="", added=0, deleted=0, files_changed=())
    assert d.is_empty and d.changed_lines == 0


def test_modified_line_counts_one_added_and_one_deleted():
    parent = Harness.from_source(BASE)
    child = parent.with_source(BASE.replace("'solve it'", "'solve it carefully'"))
    d = diff(parent, child)
    assert (d.added, d.deleted, d.files_changed) == (1, 1, ("harness.py",))
    assert "-    prompt = 'solve it'\n" in d.patch
    assert "+    prompt = 'solve it carefully'\n" in d.patch


def test_inserted_and_removed_lines_are_counted_separately():
    parent = Harness.from_source(BASE)
    child = parent.with_source("import os\n" + BASE.replace("    prompt = 'solve it'\n", "") + "\n# end\n")
    d = diff(parent, child)
    assert (d.added, d.deleted) == (3, 1)  # import, blank line, "# end"; prompt line removed


def test_added_file_counts_all_its_lines_as_added():
    parent = Harness.from_source(BASE)
    child = Harness({**parent.files, "tools/search.py": "def search(q):\n    return q\n"})
    d = diff(parent, child)
    assert (d.added, d.deleted, d.files_changed) == (2, 0, ("tools/search.py",))
    assert "--- /dev/null\n+++ b/tools/search.py\n" in d.patch


def test_deleted_file_counts_all_its_lines_as_deleted():
    parent = Harness({"harness.py": BASE, "prompts.md": "be brief\nbe right\nbe kind\n"})
    child = Harness({"harness.py": BASE})
    d = diff(parent, child)
    assert (d.added, d.deleted, d.files_changed) == (0, 3, ("prompts.md",))
    assert "--- a/prompts.md\n+++ /dev/null\n" in d.patch


def test_counts_are_sums_over_files_and_files_are_sorted():
    parent = Harness({"harness.py": BASE, "z.py": "x = 1\n", "a.py": "y = 2\n"})
    child = Harness({"harness.py": BASE + "# more\n", "z.py": "x = 3\n", "m.py": "new = 1\n"})
    d = diff(parent, child)
    assert d.files_changed == ("a.py", "harness.py", "m.py", "z.py")
    assert (d.added, d.deleted) == (3, 2)


def test_content_lines_that_look_like_headers_are_counted():
    parent = Harness.from_source(BASE)
    child = parent.with_source(BASE + "++ not a header\n-- neither\n")
    d = diff(parent, child)
    assert (d.added, d.deleted) == (2, 0)


def test_diff_is_deterministic_and_direction_swaps_counts():
    parent = Harness({"harness.py": BASE, "b.py": "1\n2\n3\n"})
    child = Harness({"harness.py": BASE.replace("model}", "model, 'k': 1}"), "c.py": "4\n"})
    d1, d2 = diff(parent, child), diff(parent, child)
    assert d1 == d2
    back = diff(child, parent)
    assert (back.added, back.deleted) == (d1.deleted, d1.added)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_patch_applies_to_the_parent_and_reproduces_the_child(tmp_path):
    parent = Harness({"harness.py": BASE, "old.txt": "gone\n", "keep.py": "a\nb\nc\nd\ne\nf\ng\n", "nonl.py": "x"})
    child = Harness({
        "harness.py": BASE.replace("'solve it'", "'plan, then solve'") + "\nEXTRA = 1\n",
        "keep.py": "a\nb\nC\nd\ne\nf\ng\nh\n",
        "nonl.py": "y",
        "pkg/new.py": "VALUE = 42\n",
    })
    root = parent.write_to(tmp_path / "h")
    d = diff(parent, child)
    subprocess.run(["git", "apply", "--unsafe-paths", "-"], input=d.patch.encode(), cwd=root, check=True)
    assert Harness.from_dir(root).files == child.files
