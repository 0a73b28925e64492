"""The agent phase's directories carried to the grading sandbox (boundary/sandbox/carried.py):
regular files and directories only, never through a link, capped, every drop recorded --
from a host tree (bwrap) and from a tar stream (Docker's ``docker cp``). No sandbox runs:
a stand-in names the host directory behind /logs, or the command that streams the tar."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from milo_ray.boundary.sandbox.carried import carry_dirs

DIRS = ("/logs/agent", "/logs/artifacts")


def host_sandbox(logs: Path):
    """A sandbox whose /logs is the host directory ``logs`` (as a bwrap sandbox's)."""
    return SimpleNamespace(dirs=SimpleNamespace(mounts={"/app": logs.parent / "ws", "/logs": logs}))


def carried_files(dest: Path) -> dict[str, bytes]:
    out = {}
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            p = Path(root, name)
            assert not p.is_symlink(), f"{p} is a link"
        for name in files:
            p = Path(root, name)
            out[str(p.relative_to(dest))] = p.read_bytes()
    return out


def test_a_planted_symlink_fifo_or_hard_link_carries_no_host_file(tmp_path):
    canary = tmp_path / "host-secret.txt"
    canary.write_text("HOST-SECRET")
    logs = tmp_path / "logs"
    (logs / "artifacts" / "sub").mkdir(parents=True)
    (logs / "artifacts" / "x.txt").write_text("blocked\n")
    (logs / "artifacts" / "sub" / "deep.txt").write_text("ok")
    (logs / "artifacts" / "y").symlink_to("/etc/shadow")
    (logs / "artifacts" / "z").symlink_to(canary)
    (logs / "artifacts" / "d").symlink_to(tmp_path)  # a directory link: never descended
    os.mkfifo(logs / "artifacts" / "fifo")  # a reader would block on it
    os.link(canary, logs / "artifacts" / "hard")  # a second name for a host file
    (logs / "agent").symlink_to(tmp_path)  # the whole directory swapped for a link

    out = carry_dirs(host_sandbox(logs), DIRS, tmp_path / "carried")

    files = carried_files(tmp_path / "carried")
    assert files == {"1-artifacts/x.txt": b"blocked\n", "1-artifacts/sub/deep.txt": b"ok"}
    assert b"HOST-SECRET" not in b"".join(files.values())
    assert out.binds == {str(tmp_path / "carried" / "0-agent"): "/logs/agent",
                         str(tmp_path / "carried" / "1-artifacts"): "/logs/artifacts"}
    dropped = "\n".join(out.dropped)
    for name, why in (("/logs/artifacts/y", "a symlink"), ("/logs/artifacts/z", "a symlink"),
                      ("/logs/artifacts/d", "a symlink"), ("/logs/artifacts/fifo", "a fifo"),
                      ("/logs/artifacts/hard", "a hard link"), ("/logs/agent", "symlink")):
        assert any(d.startswith(f"{name}:") and why in d for d in out.dropped), (name, dropped)
    assert out.record() == {"dirs": list(DIRS), "files": 2, "bytes": 10, "dropped": out.dropped, "dropped_count": 6}


def test_a_directory_the_agent_never_made_is_carried_empty(tmp_path):
    (tmp_path / "logs").mkdir()
    out = carry_dirs(host_sandbox(tmp_path / "logs"), DIRS, tmp_path / "carried")
    assert sorted(p.name for p in (tmp_path / "carried").iterdir()) == ["0-agent", "1-artifacts"]
    assert out.files == 0 and out.dropped == []
    assert oct((tmp_path / "carried" / "1-artifacts").stat().st_mode & 0o777) == "0o755"


def test_the_file_count_and_byte_caps_hold_across_the_carried_dirs(tmp_path):
    logs = tmp_path / "logs"
    (logs / "agent").mkdir(parents=True)
    (logs / "artifacts").mkdir()
    for i in range(5):
        (logs / "agent" / f"f{i}").write_bytes(b"a" * 10)
    (logs / "artifacts" / "big").write_bytes(b"b" * 100)
    (logs / "artifacts" / "small").write_bytes(b"c" * 5)

    out = carry_dirs(host_sandbox(logs), DIRS, tmp_path / "bytes", max_files=100, max_bytes=60)
    files = carried_files(tmp_path / "bytes")
    assert sorted(files) == [*(f"0-agent/f{i}" for i in range(5)), "1-artifacts/small"]  # 55 bytes of 60
    assert out.files == 6 and out.bytes == 55
    assert out.dropped == ["/logs/artifacts/big: too large (100 bytes > 10)"]  # 10 bytes were left

    out = carry_dirs(host_sandbox(logs), DIRS, tmp_path / "count", max_files=3)
    files = carried_files(tmp_path / "count")
    assert len(files) == out.files == 3
    # The cap spans both directories: none is left for the second.
    assert out.dropped == ["/logs/agent: more than 3 entries: the walk stopped here",
                           "/logs/artifacts: more than 0 entries: the walk stopped here"]


def _tar(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, arg in entries:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "file":
                info.size = len(arg)
                tar.addfile(info, io.BytesIO(arg))
            else:
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = arg
                tar.addfile(info)
    return buf.getvalue()


def tar_sandbox(tmp_path: Path, streams: dict[str, bytes]):
    """A sandbox whose ``export_tar(path)`` streams ``streams[path]`` (as ``docker cp``
    does), or fails as docker cp does for a missing path."""
    for i, (inside, data) in enumerate(streams.items()):
        (tmp_path / f"stream{i}.tar").write_bytes(data)
    names = {inside: tmp_path / f"stream{i}.tar" for i, inside in enumerate(streams)}

    def export_tar(inside):
        if inside in names:
            return ["cat", str(names[inside])]
        return ["sh", "-c", f"echo 'Error response from daemon: Could not find the file {inside}' >&2; exit 1"]

    return SimpleNamespace(export_tar=export_tar)


def test_a_tar_stream_carries_files_and_drops_links_and_names_that_leave(tmp_path):
    stream = _tar([("artifacts", "dir", None), ("artifacts/x.txt", "file", b"blocked\n"),
                   ("artifacts/y", "sym", "/etc/shadow"), ("artifacts/h", "hard", "artifacts/x.txt"),
                   ("artifacts/../../escape", "file", b"out"), ("/abs", "file", b"out"),
                   ("artifacts/nodir/f", "file", b"orphan"), ("artifacts/x.txt", "file", b"again")])
    sandbox = tar_sandbox(tmp_path, {"/logs/artifacts": stream})

    out = carry_dirs(sandbox, DIRS, tmp_path / "carried")

    assert carried_files(tmp_path / "carried") == {"1-artifacts/x.txt": b"blocked\n"}
    assert not (tmp_path / "escape").exists() and not Path("/abs").exists()
    reasons = {d.split(": ", 1)[0]: d.split(": ", 1)[1] for d in out.dropped}
    assert reasons["/logs/artifacts/y"] == "a symlink" and reasons["/logs/artifacts/h"] == "a hard link"
    assert "leaves the directory" in reasons["/logs/artifacts/../../escape"]
    assert "its directory was not carried" in reasons["/logs/artifacts/nodir/f"]
    assert any("second entry" in d for d in out.dropped)
    assert not any(d.startswith("/logs/agent") for d in out.dropped)  # missing: carried empty, nothing to say


def test_a_tar_stream_whose_top_entry_is_a_link_carries_nothing(tmp_path):
    sandbox = tar_sandbox(tmp_path, {"/logs/artifacts": _tar([("artifacts", "sym", "/etc")])})
    out = carry_dirs(sandbox, DIRS, tmp_path / "carried")
    assert carried_files(tmp_path / "carried") == {}
    assert out.dropped == ["/logs/artifacts: a symlink or not a directory, not carried"]


def test_a_tar_stream_past_the_caps_is_cut_and_recorded(tmp_path):
    entries = [("agent", "dir", None)] + [(f"agent/f{i}", "file", b"x" * 1000) for i in range(50)]
    sandbox = tar_sandbox(tmp_path, {"/logs/agent": _tar(entries)})
    out = carry_dirs(sandbox, DIRS, tmp_path / "carried", max_files=100, max_bytes=5000)
    assert out.bytes <= 5000 and 0 < out.files <= 5
    assert out.dropped_count >= 1 and any("cap" in d for d in out.dropped), out.dropped


def test_the_copy_never_writes_into_an_existing_tree(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "carried").mkdir()  # the destination must be new: the host makes it
    with pytest.raises(FileExistsError):
        carry_dirs(host_sandbox(tmp_path / "logs"), DIRS, tmp_path / "carried")
