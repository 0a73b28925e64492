"""The trust boundary's guarantees under ``sandbox=docker`` as under bwrap: ``storage_mb``
caps the total a container writes wherever it lands, every container runs as a uid of its
own (cleared when it ends), a daemon without seccomp is refused, and an OOM kill inside a
container is counted. Against a real dockerd where a container is involved (slow-marked)."""

from __future__ import annotations

import dataclasses
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.docker import DockerSandboxFactory
from milo_ray.boundary.sandbox.docker_control import DaemonFacts
from milo_ray.boundary.sandbox.identity import LEASE_DIR, parse_uid_range, pids_of
from milo_ray.boundary.sandbox.volume import unavailable

MIB = 1024 * 1024
CAP_MB = 16
PLACES = ("/app", "/tmp", "$HOME", "/logs", "/tests", "/solution")
# 20 MiB into each writable place (120 MiB asked for, 16 allowed); each its own file name,
# since HOME is /tmp.
_FILL = "; ".join(f'head -c {20 * MIB} /dev/zero > "{d}/fill{i}"; echo "{d} $?"' for i, d in enumerate(PLACES))
_SIZES = "stat -c %s " + " ".join(f'"{d}/fill{i}"' for i, d in enumerate(PLACES))

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="volumes and uid leases take a root worker")
needs_volume = pytest.mark.skipif(unavailable() is not None, reason=f"no volume here: {unavailable()}")


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _fake_docker(tmp_path: Path, security_options: str) -> tuple[str]:
    """A docker CLI whose ``docker info`` reports 2 CPUs and ``security_options``."""
    script = tmp_path / "docker"
    script.write_text(f"#!/bin/sh\necho '2 {security_options}'\n")
    script.chmod(0o755)
    return (str(script),)


# -- without a daemon ---------------------------------------------------------------------

def test_a_daemon_without_seccomp_is_refused_before_the_run_naming_the_opt_out(tmp_path) -> None:
    spec = SandboxSpec(task_id="t", docker_image="img")
    for options in ('[]', '["name=apparmor","name=seccomp,profile=unconfined"]'):
        reason = DockerSandboxFactory(docker=_fake_docker(tmp_path, options)).unsupported(spec)
        assert reason is not None and "no seccomp profile" in reason, reason
        assert "sandbox.require_daemon_seccomp=false" in reason and "sandbox=bwrap" in reason
    opted_out = DockerSandboxFactory(docker=_fake_docker(tmp_path, "[]"), require_daemon_seccomp=False)
    assert opted_out.unsupported(spec) is None
    default = DockerSandboxFactory(docker=_fake_docker(tmp_path, '["name=seccomp,profile=default"]'))
    assert default.unsupported(spec) is None


def test_daemon_facts_see_seccomp_only_when_a_profile_applies() -> None:
    assert DaemonFacts(2, ("name=seccomp,profile=default",)).seccomp
    assert DaemonFacts(2, ("name=seccomp,profile=/etc/docker/custom.json", "name=cgroupns")).seccomp
    assert not DaemonFacts(2, ("name=seccomp,profile=unconfined",)).seccomp
    assert not DaemonFacts(2, ("name=apparmor", "name=rootless")).seccomp


def test_bad_identity_options_name_the_field() -> None:
    with pytest.raises(ValueError, match="sandbox.uid_range"):
        DockerSandboxFactory(uid_range="100-")
    with pytest.raises(ValueError, match="sandbox.require_daemon_seccomp"):
        DockerSandboxFactory(require_daemon_seccomp="no")


# -- against dockerd ----------------------------------------------------------------------

@pytest.mark.slow
@needs_root
@needs_volume
def test_writing_past_storage_mb_in_every_writable_place_gets_enospc_and_the_host_holds_at_most_the_cap(
        docker_factory, docker_task, tmp_path) -> None:
    scratch = tmp_path / "s"
    with docker_factory.open(dataclasses.replace(docker_task, storage_mb=CAP_MB), scratch) as sandbox:
        run = sandbox.execute(_FILL, timeout=120)
        sizes = [int(s) for s in sandbox.execute(_SIZES).output.split() if s.isdigit()]
        image = _allocated(scratch / "volume.img")
        # The task's own file, copied out of the image, is on the volume too.
        assert sandbox.execute("cat /app/hello.txt").output.startswith("hello ")
    assert run.output.count("No space left on device") == len(PLACES), run.output
    assert len(sizes) == len(PLACES) and sum(sizes) <= CAP_MB * MIB, sizes
    assert sum(sizes) > (CAP_MB - 2) * MIB  # filled to ext4's cap, not refused early
    assert image <= CAP_MB * MIB
    outside = sum(_allocated(p) for p in scratch.rglob("*")
                  if p.is_file() and not p.is_relative_to(scratch / "volume") and p.name != "volume.img")
    assert outside < MIB
    assert not any(line.split()[1] == str(scratch / "volume") for line in Path("/proc/mounts").read_text().splitlines())


@pytest.mark.slow
@needs_root
@needs_volume
def test_grading_on_a_full_volume_gets_the_workspace_and_nothing_else(docker_factory, docker_task, tmp_path) -> None:
    agent = docker_factory.open(dataclasses.replace(docker_task, storage_mb=CAP_MB), tmp_path / "s")
    # The volume filled everywhere but the workspace.
    full = agent.execute("echo 42 > /app/answer.txt; " + _FILL.replace("/app/fill0", "/dev/null"), timeout=120)
    assert full.output.count("No space left on device") == len(PLACES) - 1, full.output
    grader = agent.fresh_for_grading()
    try:
        seen = grader.execute("cat /app/answer.txt; ls -A /tmp /logs /tests /solution")
        assert seen.output.split() == ["42", "/logs:", "/solution:", "/tests:", "/tmp:"], seen.output
        # The agent's other files were deleted: the verifier has the cap less the workspace.
        assert grader.execute("head -c 4194304 /dev/zero > /tmp/room && echo room").output.strip() == "room"
    finally:
        grader.close()


@pytest.mark.slow
@needs_root
def test_concurrent_containers_run_as_different_uids_which_are_cleared_when_they_end(
        make_docker_factory, docker_task, tmp_path) -> None:
    factory = make_docker_factory()
    uids = parse_uid_range(factory.uid_range)
    with ThreadPoolExecutor(2) as pool:
        pair = list(pool.map(lambda i: factory.open(docker_task, tmp_path / f"s{i}"), range(2)))
    try:
        status = []
        for sandbox in pair:
            # A process each runs on; a detached one, to be killed with its uid.
            sandbox.execute("nohup sleep 4343 >/dev/null 2>&1 &")
            line = next(ln for ln in sandbox.execute("cat /proc/self/status").output.splitlines()
                        if ln.startswith("Uid:"))
            status.append(line.split()[1:])
        owners = [s.owner[0] for s in pair]
        assert owners[0] != owners[1] and all(u in uids for u in owners), owners
        # Real, effective, saved and filesystem uid: the lease, in each.
        assert status == [[str(u)] * 4 for u in owners], status
        for sandbox, uid in zip(pair, owners):
            workspace = os.stat(sandbox.dirs.mounts["/app"])
            assert (workspace.st_uid, workspace.st_gid) == (uid, uid)
            assert stat.S_IMODE(workspace.st_mode) & 0o022 == 0  # nobody else's to write
            assert pids_of(uid)  # its container's processes are that uid's on the host
    finally:
        for sandbox in pair:
            sandbox.close()
    for uid in owners:
        assert pids_of(uid) == []
        # Given back cleared (processes killed, keyrings emptied) -- not merely dropped.
        assert Path(LEASE_DIR, f"{uid}.lock").read_bytes() == b"clean"


@pytest.mark.slow
def test_a_command_killed_for_memory_is_counted_as_an_oom_kill(docker_factory, docker_task, tmp_path) -> None:
    with docker_factory.open(dataclasses.replace(docker_task, memory_mb=64), tmp_path / "s") as sandbox:
        before = sandbox.oom_kills()
        run = sandbox.execute("python3 -c \"x = []\nwhile True: x.append(bytearray(10 ** 7))\"", timeout=60)
        after = sandbox.oom_kills()
        assert sandbox.execute("echo alive").output == "alive\n"  # the container itself lives on
    assert run.exit_code == 137, run.output  # SIGKILL
    assert before == 0 and after is not None and after >= 1, (before, after)


@pytest.mark.slow
def test_the_images_links_reach_the_workspace_as_links_and_the_host_never_follows_them(
        make_docker_factory, docker_base_image, tmp_path) -> None:
    # The task's image puts links in its workdir (COPY keeps them): absolute, relative,
    # and one a later file of the image lies "under". Copying them out of the image and
    # into the bound workspace writes nothing through any of them on the host.
    context = tmp_path / "task"
    (context / "w" / "sub").mkdir(parents=True)
    (context / "w" / "sub" / "data.txt").write_text("data\n")
    (context / "w" / "etc").symlink_to("/etc")
    (context / "w" / "rel").symlink_to("sub/data.txt")
    (context / "Dockerfile").write_text("FROM registry.example/unpullable:1.0\nWORKDIR /app\nCOPY w/ /app/\n")
    spec = SandboxSpec(task_id=f"docker-links-{os.getpid()}", build_context=str(context))
    canary = set(os.listdir("/etc"))
    try:
        with make_docker_factory().open(spec, tmp_path / "s") as sandbox:
            seen = sandbox.execute("readlink /app/etc; cat /app/rel; cat /app/sub/data.txt").output.split()
            workspace = sandbox.dirs.mounts["/app"]
            assert os.readlink(workspace / "etc") == "/etc" and (workspace / "etc").is_symlink()
    finally:
        import subprocess

        images = subprocess.run(["docker", "images", "-q", "--filter", f"label=milo-ray.task={spec.task_id}"],
                                capture_output=True, text=True).stdout.split()
        if images:
            subprocess.run(["docker", "rmi", "-f", *images], capture_output=True)
    assert seen == ["/etc", "data", "data"], seen
    assert set(os.listdir("/etc")) == canary
