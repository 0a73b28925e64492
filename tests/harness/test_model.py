"""Invariants of the harness model: identity is content, sources round-trip through disk."""

from __future__ import annotations

import pytest

from milo_ray.harness.model import ENTRY_FILE, Harness, content_hash

SRC = "def build_agent(model, backend):\n    return model\n"


def test_identity_is_the_content_not_the_name():
    a = Harness.from_source(SRC, name="a")
    b = Harness.from_source(SRC, name="b")
    assert a.harness_id == b.harness_id
    assert a.harness_id != Harness.from_source(SRC + "\n").harness_id


def test_identity_covers_every_file_and_its_path():
    base = Harness({ENTRY_FILE: SRC, "tools.py": "X = 1\n"})
    assert base.harness_id != Harness({ENTRY_FILE: SRC, "tools.py": "X = 2\n"}).harness_id
    assert base.harness_id != Harness({ENTRY_FILE: SRC, "tool.py": "X = 1\n"}).harness_id
    assert base.harness_id != Harness({ENTRY_FILE: SRC}).harness_id


def test_identity_does_not_depend_on_file_insertion_order():
    a = Harness({ENTRY_FILE: SRC, "a.py": "1", "b.py": "2"})
    b = Harness({"b.py": "2", "a.py": "1", ENTRY_FILE: SRC})
    assert a.harness_id == b.harness_id == content_hash(b.files)


def test_path_content_boundaries_are_part_of_the_hash():
    # ("ab", "c") and ("a", "bc") must not collide through naive concatenation.
    assert content_hash({"ab": "c"}) != content_hash({"a": "bc"})


def test_missing_entry_file_is_rejected_with_the_file_name():
    with pytest.raises(ValueError, match="harness.py"):
        Harness({"tools.py": SRC})


def test_disk_round_trip_preserves_files_and_identity(tmp_path):
    h = Harness({ENTRY_FILE: SRC, "prompts/system.md": "Be careful.\n", "tools/__init__.py": ""}, name="x")
    root = h.write_to(tmp_path / "x")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "harness.cpython-311.pyc").write_bytes(b"\x00\x01")
    back = Harness.from_dir(root)
    assert back.files == h.files
    assert back.harness_id == h.harness_id
    assert back.name == "x"


def test_from_dir_skips_binary_files(tmp_path):
    root = Harness.from_source(SRC).write_to(tmp_path / "h")
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00\x80")
    assert set(Harness.from_dir(root).files) == {ENTRY_FILE}


def test_with_source_replaces_only_the_entry_file():
    h = Harness({ENTRY_FILE: SRC, "tools.py": "X = 1\n"}, name="p")
    child = h.with_source(SRC.replace("model\n", "backend\n"))
    assert child.files["tools.py"] == "X = 1\n"
    assert child.source != h.source
    assert child.name == "p"
    assert h.source == SRC  # the parent is untouched
