"""The bubblewrap sandbox, against the real bwrap: what it isolates, what it limits, and
the deepagents backend contract (file tools, transfers, timeouts, interrupt)."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.boundary.sandbox.process import run_capped

FACTORY = BwrapSandboxFactory(command_timeout_s=20, output_cap_bytes=65536, pids_limit=64)
_why = FACTORY.unsupported(SandboxSpec(task_id="probe"))
pytestmark = pytest.mark.skipif(_why is not None, reason=f"bwrap unusable here: {_why}")


@pytest.fixture
def sandbox(tmp_path):
    with FACTORY.open(SandboxSpec(task_id="t", env={"TASK_VAR": "task-value"}), tmp_path) as sb:
        yield sb


def _sh(sb, command: str, **kw):
    return sb.execute(command, **kw)


def test_writes_outside_the_writable_dirs_fail(sandbox, tmp_path):
    for path in ("/usr/milo_probe", "/etc/milo_probe", "/milo_probe", "/var/milo_probe"):
        r = _sh(sandbox, f"echo x > {path}")
        assert r.exit_code != 0, path
    assert not Path("/usr/milo_probe").exists() and not Path("/etc/milo_probe").exists()
    r = _sh(sandbox, "echo inside > /app/made_here && pwd")
    assert r.exit_code == 0 and r.output.strip() == "/app"  # cwd is the workdir
    assert (tmp_path / "workspace" / "made_here").read_text() == "inside\n"
    for d in ("/logs", "/tests", "/solution", "/tmp", "$HOME"):
        assert _sh(sandbox, f"touch {d}/ok").exit_code == 0, d


def test_host_home_is_not_readable(sandbox):
    home = Path(os.path.expanduser("~"))
    secret = home / f".milo_sandbox_secret_{uuid.uuid4().hex[:8]}"
    secret.write_text("host secret")
    try:
        r = _sh(sandbox, f"cat {secret}")
        assert r.exit_code != 0 and "host secret" not in r.output
        assert secret.name not in _sh(sandbox, f"ls -a {home}").output
        assert _sh(sandbox, "cat /etc/shadow").exit_code != 0  # masked though /etc is visible
    finally:
        secret.unlink()


def test_host_environment_is_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("MY_SECRET_KEY", "sk-do-not-leak")
    r = _sh(sandbox, "env")
    assert "sk-do-not-leak" not in r.output and "MY_SECRET_KEY" not in r.output
    assert "TASK_VAR=task-value" in r.output  # the task's own env is passed
    assert _sh(sandbox, "echo $HOME").output.strip() == "/root"  # the sandbox's own home


@pytest.fixture
def host_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(10)

    def serve():
        try:
            while True:
                conn, _ = srv.accept()
                conn.sendall(b"hello-from-host")
                conn.close()
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


_CONNECT = (
    "python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', {port}), timeout=3); "
    "print(s.recv(100).decode())\""
)


@pytest.mark.parametrize("allow_internet", [False, True])
def test_the_hosts_loopback_is_unreachable_with_or_without_internet(tmp_path, host_server, allow_internet):
    # A task that allows the internet gets a private namespace with egress to public
    # addresses only (tests/security/test_sandbox_network.py), never the host's.
    spec = SandboxSpec(task_id="net", allow_internet=allow_internet)
    with FACTORY.open(spec, tmp_path) as sb:
        r = sb.execute(_CONNECT.format(port=host_server))
    assert r.exit_code != 0 and "hello-from-host" not in r.output


def test_process_count_is_capped(sandbox):
    # A bounded flood (safe even if the cap were missing): 200 sleepers against a cap of 64.
    # (python rather than bash: bash retries a failed fork with a growing back-off.)
    forker = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print('running=%d' % n)\n"
    )
    assert sandbox.upload_files([("/tmp/forker.py", forker.encode())])[0].error is None
    r = _sh(sandbox, "python3 /tmp/forker.py", timeout=15)
    running = int(r.output.rsplit("running=", 1)[1].split()[0])
    assert running < 64, r.output


def test_fork_bomb_is_killed_within_the_timeout_and_the_host_stays_usable(sandbox):
    if sandbox.limits.pids is None:
        pytest.skip("no process-count limit on this machine: a real fork bomb is not safe to run")
    start = time.monotonic()
    r = _sh(sandbox, "bomb() { bomb | bomb & }; bomb; sleep 60", timeout=3)
    assert r.exit_code == 124
    assert time.monotonic() - start < 15
    assert sandbox._cgroup.pids() == set()  # nothing of the bomb is left once execute returns
    assert run_capped(["true"], timeout_s=10, output_cap_bytes=100).exit_code == 0
    assert _sh(sandbox, "echo alive").output.strip() == "alive"


def _host_pids_with(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(entry))
            except OSError:
                pass
    return out


def test_backgrounded_process_ignoring_sigterm_does_not_survive_its_command(sandbox):
    marker = f"{time.time_ns() % 10**6 + 10**6}"  # a sleep length no one else uses
    r = _sh(sandbox, f"(trap '' TERM HUP; setsid sleep {marker} ) > /dev/null 2>&1 & echo started")
    assert r.output.strip() == "started"
    deadline = time.monotonic() + 5
    while _host_pids_with(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_pids_with(f"sleep\0{marker}") == []


def test_output_beyond_the_cap_is_truncated(sandbox):
    start = time.monotonic()
    r = _sh(sandbox, "yes | head -c 200M")
    assert r.truncated and r.exit_code == 0
    assert len(r.output.encode()) < 65536 + 200
    assert time.monotonic() - start < 15


def test_timeout_kills_the_command_and_zero_means_the_default(tmp_path):
    factory = BwrapSandboxFactory(command_timeout_s=0.5, output_cap_bytes=1000)
    with factory.open(SandboxSpec(task_id="to"), tmp_path) as sb:
        start = time.monotonic()
        r = sb.execute("echo before; sleep 30")
        assert r.exit_code == 124 and "before" in r.output and "timed out" in r.output
        assert time.monotonic() - start < 5
        assert sb.execute("sleep 1; echo done", timeout=3).output.strip() == "done"
        assert sb.execute("sleep 30", timeout=0).exit_code == 124  # 0 = the default, never unbounded
        with pytest.raises(ValueError, match="timeout"):
            sb.execute("true", timeout=-1)


@pytest.mark.parametrize("cgroups", [True, False])  # the cgroup, and the RLIMIT_AS fallback
def test_memory_limit_stops_a_large_allocation(tmp_path, cgroups):
    factory = BwrapSandboxFactory(command_timeout_s=20, output_cap_bytes=1000, cgroups=cgroups)
    with factory.open(SandboxSpec(task_id="mem", memory_mb=128), tmp_path) as sb:
        assert sb.limits.memory is not None and ("cgroup" in sb.limits.memory or not cgroups)
        r = sb.execute("python3 -c 'x = bytearray(512 * 2**20); print(len(x))'")
        assert r.exit_code != 0 and "536870912" not in r.output
        assert sb.execute("python3 -c 'x = bytearray(16 * 2**20); print(len(x))'").exit_code == 0


def test_upload_download_round_trip_and_refusals(sandbox, tmp_path):
    up = sandbox.upload_files([("/app/sub/data.bin", b"\x00\x01abc"), ("/logs/verifier/r.txt", b"1"),
                               ("/etc/evil", b"x"), ("relative.txt", b"x"), ("/app/sub", b"x")])
    assert [u.error for u in up] == [None, None, "permission_denied", "invalid_path", "is_directory"]
    assert _sh(sandbox, "cat /app/sub/data.bin | od -c | head -1").output.split()[1:6] == ["\\0", "001", "a", "b", "c"]
    _sh(sandbox, "echo from-inside > /tests/out.txt; ln -s /etc/passwd /app/link")
    down = sandbox.download_files(["/tests/out.txt", "/app/sub/data.bin", "/app/missing", "/app/sub",
                                   "/app/link", "/etc/passwd"])
    assert down[0].content == b"from-inside\n" and down[1].content == b"\x00\x01abc"
    assert [d.error for d in down[2:]] == ["file_not_found", "is_directory", "permission_denied", "permission_denied"]
    # Writing through the agent's symlink must not touch the host file it names.
    assert sandbox.upload_files([("/app/link", b"pwned")])[0].error == "permission_denied"


def test_deepagents_file_tools_work(sandbox):
    assert sandbox.write("/app/pkg/mod.py", "def f():\n    return 1\n").error is None
    assert "return 1" in sandbox.read("/app/pkg/mod.py").file_data["content"]
    assert sandbox.edit("/app/pkg/mod.py", "return 1", "return 2").error is None
    assert "return 2" in sandbox.read("/app/pkg/mod.py").file_data["content"]
    assert [e["path"] for e in sandbox.ls("/app/pkg").entries] == ["/app/pkg/mod.py"]
    assert [m["path"] for m in sandbox.grep("return 2", "/app").matches] == ["/app/pkg/mod.py"]
    assert [m["path"] for m in sandbox.glob("**/*.py", "/app").matches] == ["/app/pkg/mod.py"]


@pytest.mark.parametrize("cgroups", [True, False])
def test_interrupt_kills_running_commands_and_keeps_files(tmp_path, cgroups):
    factory = BwrapSandboxFactory(command_timeout_s=20, output_cap_bytes=1000, cgroups=cgroups)
    with factory.open(SandboxSpec(task_id="int"), tmp_path) as sandbox:
        _interrupt_and_check(sandbox)


def _interrupt_and_check(sandbox):
    result = {}
    t = threading.Thread(target=lambda: result.update(r=_sh(sandbox, "echo kept > /app/f; sleep 60")))
    t.start()
    deadline = time.monotonic() + 10
    while not sandbox.download_files(["/app/f"])[0].content and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    sandbox.interrupt()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - start < 5
    assert result["r"].exit_code != 0
    assert sandbox.download_files(["/app/f"])[0].content == b"kept\n"
    assert _sh(sandbox, "cat /app/f").output == "kept\n"  # still usable after an interrupt


def test_copy_in_and_ids_and_close(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.txt").write_text("A")
    (src / "b.txt").write_text("B")
    spec = SandboxSpec(task_id="cp", copy_in=((str(src / "d"), "/app/d"), (str(src / "b.txt"), "/app/")))
    a = FACTORY.open(spec, tmp_path / "s1")
    b = FACTORY.open(spec, tmp_path / "s2")
    assert a.id != b.id
    assert a.execute("cat /app/d/a.txt /app/b.txt").output == "AB"
    a.close()
    a.close()  # idempotent
    b.close()
    with pytest.raises(ValueError, match="copy_in"):
        FACTORY.open(SandboxSpec(task_id="cp", copy_in=((str(src / "b.txt"), "/etc/b.txt"),)), tmp_path / "s3")


@pytest.mark.parametrize("ahead", [False, True], ids=["at_open", "opened_ahead"])
def test_a_private_directory_copied_onto_the_workdir_leaves_it_enterable(tmp_path, ahead):
    """copytree onto an existing directory gives it the source's mode: a 0700 temp dir
    copied onto /app made the workdir unenterable for bwrap (root without capabilities),
    so every command of a sandbox opened ahead of its task failed to chdir there."""
    src = tmp_path / "private"
    src.mkdir(mode=0o700)
    (src / "task.txt").write_text("T")
    copy_in = ((str(src), "/app"),)
    if ahead:
        sb = FACTORY.open(SandboxSpec(task_id="ahead"), tmp_path / "s")
        sb.dirs.add_files(copy_in)
    else:
        sb = FACTORY.open(SandboxSpec(task_id="ahead", copy_in=copy_in), tmp_path / "s")
    with sb:
        res = sb.execute("cat task.txt && touch mine")
        assert (res.exit_code, res.output) == (0, "T"), res.output


def test_unsupported_names_the_task_and_the_fix(tmp_path):
    assert "sandbox=docker" in FACTORY.unsupported(SandboxSpec(task_id="t9", needs_docker="RUN apt-get"))
    msg = FACTORY.unsupported(SandboxSpec(task_id="t9", docker_image="img:1"))
    assert "t9" in msg and "sandbox=docker" in msg
    assert FACTORY.unsupported(SandboxSpec(task_id="t9", docker_image="img:1", build_context=str(tmp_path))) is None
    assert "/usr/src/app" in FACTORY.unsupported(SandboxSpec(task_id="t9", workdir="/usr/src/app"))
    missing = BwrapSandboxFactory(bwrap_path="/nonexistent/bwrap").unsupported(SandboxSpec(task_id="t9"))
    assert "t9" in missing and "not installed" in missing


def test_config_builds_the_factory_with_every_knob():
    import pickle

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).parents[3] / "conf" / "sandbox" / "bwrap.yaml")
    factory = instantiate(conf)
    assert isinstance(factory, BwrapSandboxFactory) and factory.name == "bwrap"
    knobs = {k: v for k, v in OmegaConf.to_container(conf).items() if k != "_target_"}
    for key, value in knobs.items():
        got = getattr(factory, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    assert pickle.loads(pickle.dumps(factory)).unsupported(SandboxSpec(task_id="p")) is None


def test_storage_limit_caps_the_size_of_a_file(tmp_path):
    with FACTORY.open(SandboxSpec(task_id="fs", storage_mb=1), tmp_path) as sb:
        assert sb.limits.file_size is not None
        assert sb.execute("head -c 2000000 /dev/zero > /app/big").exit_code != 0
        assert (sb.workspace_dir / "big").stat().st_size <= 1024 * 1024
        # The cap is on the total (tests/security/test_sandbox_storage.py): free it first.
        assert sb.execute("rm /app/big && head -c 500000 /dev/zero > /app/small").exit_code == 0


def test_cpu_quota_slows_a_busy_loop(tmp_path):
    with FACTORY.open(SandboxSpec(task_id="cpu", cpus=0.05), tmp_path) as sb:
        if sb.limits.cpu is None:
            pytest.skip("no cpu cgroup on this machine")
        busy = "import time\ns = time.time()\nwhile time.time() - s < 1: pass\nprint(time.process_time())\n"
        sb.upload_files([("/tmp/busy.py", busy.encode())])
        r = sb.execute("python3 /tmp/busy.py")
        # 5% of a CPU for ~1 s of wall time; unthrottled it gets most of a core.
        assert float(r.output.split()[-1]) < 0.3, r.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user applies when the worker runs as root")
def test_commands_run_as_the_unprivileged_sandbox_user_and_root_only_files_stay_unreadable(sandbox):
    r = _sh(sandbox, "id -u; grep Cap[EPB] /proc/self/status; cat /etc/shadow- /etc/gshadow- /etc/shadow 2>&1; "
                     "touch /app/mine && stat -c %u /app/mine")
    lines = r.output.splitlines()
    assert int(lines[0]) in FACTORY._uids and lines[0] == str(sandbox.owner[0])
    assert all(line.split()[1] == "0000000000000000" for line in lines[1:4])  # no capability, not even bounding
    assert r.output.count("Permission denied") + r.output.count("No such file") == 3
    assert lines[-1] == lines[0]


def test_python_is_there_next_to_python3(sandbox):
    assert _sh(sandbox, "python -c 'print(6 * 7)'").output.strip() == "42"


def test_a_long_lived_process_shows_no_host_path_in_its_pid_1(sandbox, tmp_path):
    import subprocess

    from milo_ray.boundary.sandbox.bwrap import LAUNCH_ENV

    prefix, options, command = sandbox.process_command(["/bin/sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"],
                                                       {str(tmp_path): "/run/milo/extra"})
    fd = os.memfd_create("args")
    os.write(fd, b"".join(a.encode() + b"\0" for a in options))
    os.lseek(fd, 0, os.SEEK_SET)
    done = subprocess.run([*prefix, "--args", str(fd), *command], pass_fds=(fd,), env=LAUNCH_ENV,
                          capture_output=True, text=True, timeout=60)
    os.close(fd)
    assert done.returncode == 0, done.stderr
    # bwrap's own words, then the command: descriptors (its filter's, its options'), no host path.
    assert re.match(rf"{re.escape(prefix[-1])} --seccomp \d+ --args \d+ ", done.stdout), done.stdout
    assert str(tmp_path) not in done.stdout
