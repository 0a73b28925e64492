"""The safe-walk primitives: nothing below the caller's base is followed, special files and
hard links are refused with their reason, caps hold before anything is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from milo_ray.boundary.nofollow import (UnsafePath, chown_tree_nofollow, copy_tree_nofollow, open_dir_nofollow,
                                    read_file_nofollow, read_tree_nofollow, safe_relpath, write_file_nofollow)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    return root


def test_a_walk_takes_regular_files_and_refuses_every_other_kind(tree: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host")
    os.symlink(secret, tree / "link")
    os.symlink(tmp_path, tree / "dirlink")
    os.mkfifo(tree / "fifo")
    os.link(secret, tree / "hard")
    got = read_tree_nofollow(tree)
    assert got.files == {"a.txt": b"a", "sub/b.txt": b"b"}
    assert {r.path: r.reason for r in got.refused} == {
        "dirlink": "a symlink", "fifo": "a fifo", "hard": "a hard link (2 names for one file)", "link": "a symlink"}


def test_a_walk_refuses_a_root_that_is_a_link(tree: Path, tmp_path: Path) -> None:
    os.symlink(tree, tmp_path / "alias")
    with pytest.raises(UnsafePath, match="symlink"):
        read_tree_nofollow(tmp_path / "alias")


def test_caps_refuse_a_sparse_giant_and_stop_a_wide_tree_before_reading(tree: Path) -> None:
    with open(tree / "sparse", "wb") as f:
        f.truncate(10 << 30)
    got = read_tree_nofollow(tree, max_bytes=1 << 20)
    assert "sparse" not in got.files and any(r.path == "sparse" and "too large" in r.reason for r in got.refused)
    for i in range(50):
        (tree / f"f{i:02d}").write_text("x")
    got = read_tree_nofollow(tree, max_files=10)
    assert len(got.files) <= 10 and "more than 10 entries" in got.why()


def test_writes_never_go_through_a_link_on_the_way_or_at_the_end(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("host")
    os.symlink(outside, tree / "d")
    os.symlink(outside / "f", tree / "f")
    for rel in ("d/new", "f", "../escape", "/abs"):
        with pytest.raises(UnsafePath):
            write_file_nofollow(tree, rel, b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["f"] and (outside / "f").read_text() == "host"
    assert not (tmp_path / "escape").exists()
    write_file_nofollow(tree, "made/deep/f", b"ok")
    assert read_file_nofollow(tree, "made/deep/f") == b"ok"


def test_a_read_or_open_through_a_link_is_refused(tree: Path, tmp_path: Path) -> None:
    os.symlink("/proc/self/environ", tree / "env")
    os.symlink(tmp_path, tree / "up")
    with pytest.raises(UnsafePath):
        read_file_nofollow(tree, "env")
    with pytest.raises(UnsafePath):
        open_dir_nofollow(tree, "up")
    with pytest.raises(UnsafePath):
        safe_relpath("a/../b")


def test_copy_and_chown_never_touch_what_a_link_points_to(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, tree / "out_link")
    copied = copy_tree_nofollow(tree, tmp_path / "copy")
    assert not (tmp_path / "copy" / "out_link").exists() and [r.path for r in copied.refused] == ["out_link"]
    if os.geteuid() == 0:
        before = os.stat(outside)
        chown_tree_nofollow(tree, 65534, 65534)
        assert os.stat(tree / "sub" / "b.txt").st_uid == 65534
        assert (os.stat(outside).st_uid, os.stat(outside).st_gid) == (before.st_uid, before.st_gid)
