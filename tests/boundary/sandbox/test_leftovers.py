"""What a worker that died left on the host (its sandboxes' cgroups, its rollouts' scratch
directories) is removed by the next process that looks, and what a live process owns
never is: the owner tag in each name decides (boot id, PID namespace, pid, start time)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox.cgroups import CGROUP_PREFIX, reap_cgroups
from milo_ray.boundary.sandbox.leftovers import (
    SCRATCH_PREFIX,
    Owner,
    current_owner,
    make_scratch,
    owner_of,
    reap_scratch,
)

# A worker: one bwrap sandbox (with its cgroups) in one rollout scratch, a command run,
# then it waits to be killed -- without ever closing anything.
WORKER = textwrap.dedent('''
    import json, sys, time
    from milo_ray.boundary.sandbox.base import SandboxSpec
    from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
    from milo_ray.boundary.sandbox.leftovers import make_scratch
    scratch = make_scratch("rollout", sys.argv[1])
    sb = BwrapSandboxFactory(command_timeout_s=30).open(SandboxSpec(task_id="t", memory_mb=512), scratch / "agent")
    assert sb.execute("echo ok").exit_code == 0
    print(json.dumps({"scratch": str(scratch), "cgroups": [str(d) for d in sb._cgroup.dirs]}), flush=True)
    time.sleep(600)
''')


def _worker(scratch_dir: Path) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(scratch_dir)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the worker did not start (exit {proc.wait()})")
    return proc, json.loads(line)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_a_dead_workers_cgroups_and_scratch_are_reaped_and_a_live_workers_never(tmp_path):
    dead, dead_left = _worker(tmp_path)
    live, live_left = _worker(tmp_path)
    try:
        if not dead_left["cgroups"]:
            pytest.skip("no cgroup can be created here: only scratch directories to reap")
        _kill(dead)
        for d in dead_left["cgroups"] + [dead_left["scratch"]]:
            assert os.path.isdir(d)  # a killed worker closes nothing
        parents = {Path(d).parent for d in dead_left["cgroups"] + live_left["cgroups"]}
        assert sum(reap_cgroups(p) for p in parents) >= len(dead_left["cgroups"])
        assert reap_scratch(tmp_path) == 1
        for d in dead_left["cgroups"] + [dead_left["scratch"]]:
            assert not os.path.exists(d)
        # The live worker's sandbox is idle (its cgroups empty), and still untouched.
        for d in live_left["cgroups"] + [live_left["scratch"]]:
            assert os.path.isdir(d)
        assert live.poll() is None
    finally:
        _kill(live)
        if dead.poll() is None:
            _kill(dead)
    parents = {Path(d).parent for d in live_left["cgroups"]}
    for p in parents:
        reap_cgroups(p)
    reap_scratch(tmp_path)
    assert not any(os.path.exists(d) for d in live_left["cgroups"] + [live_left["scratch"]])


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_a_closed_sandbox_leaves_no_cgroup(tmp_path):
    from milo_ray.boundary.sandbox.base import SandboxSpec
    from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory

    sb = BwrapSandboxFactory(command_timeout_s=30).open(SandboxSpec(task_id="t", memory_mb=512), tmp_path / "s")
    dirs = list(sb._cgroup.dirs)
    if not dirs:
        pytest.skip("no cgroup can be created here")
    assert sb.execute("echo ok").exit_code == 0 and all(d.is_dir() for d in dirs)
    sb.close()
    assert not any(d.exists() for d in dirs)


def test_only_a_certainly_dead_owner_is_dead():
    me = current_owner()
    assert me is not None and not me.is_dead()
    assert Owner(me.boot, me.pidns, me.pid, me.start + 1).is_dead()  # the pid was reused
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert Owner(me.boot, me.pidns, gone.pid, 1).is_dead()
    # Another boot (or another machine sharing the directory), another PID namespace:
    # nothing can be known from here, so nothing is reaped.
    assert not Owner("0" * 12 if me.boot != "0" * 12 else "1" * 12, me.pidns, gone.pid, 1).is_dead()
    assert not Owner(me.boot, me.pidns + 1, gone.pid, 1).is_dead()


def test_untagged_foreign_and_linked_entries_are_never_reaped(tmp_path):
    me = current_owner()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_tag = Owner(me.boot, me.pidns, gone.pid, 1).tag
    other_boot = Owner("f" * 12 if me.boot != "f" * 12 else "e" * 12, me.pidns, gone.pid, 1).tag
    keep = [f"{SCRATCH_PREFIX}rollout-abc", f"{SCRATCH_PREFIX}{other_boot}x", f"milo-rollout-{dead_tag}x",
            f"{SCRATCH_PREFIX}{me.tag}x"]
    for name in keep:
        (tmp_path / name).mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("keep")
    os.symlink(target, tmp_path / f"{SCRATCH_PREFIX}{dead_tag}link")
    (tmp_path / f"{SCRATCH_PREFIX}{dead_tag}x").mkdir()
    (tmp_path / f"{SCRATCH_PREFIX}{dead_tag}x" / "f").write_text("left behind")
    assert reap_scratch(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + ["elsewhere", f"{SCRATCH_PREFIX}{dead_tag}link"])
    assert (target / "precious").read_text() == "keep"


def test_a_scratch_directory_names_its_owner(tmp_path):
    d = make_scratch("opt-first autocorrelation/../x", tmp_path)
    assert d.parent == tmp_path and d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    assert owner_of(d.name, SCRATCH_PREFIX) == current_owner()
    assert "/" not in d.name[len(SCRATCH_PREFIX):] and " " not in d.name
    assert owner_of(f"{CGROUP_PREFIX}{current_owner().tag}bwrap-1", CGROUP_PREFIX) == current_owner()
