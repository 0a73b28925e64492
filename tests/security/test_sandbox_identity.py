"""Kernel state a uid owns is never shared between sandboxes: every open bwrap sandbox has
a uid of its own (leased per sandbox, cleared when it closes), its own IPC namespace, and a
seccomp filter refusing what reaches kernel state beyond its process tree (keyrings,
tracing, mounts, new namespaces, BPF, perf). Attacks run as real code in real bwrap
sandboxes; each finds nothing or is refused, and the honest rollout next to it scores."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from milo_ray.boundary.sandbox import bwrap as bwrap_module
from milo_ray.boundary.sandbox import identity
from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the probes call x86_64 system call numbers"),
]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a uid per sandbox is leased when the worker runs as root")

# A range of its own, outside the default one other sandboxes on this machine lease from,
# so which uid a sandbox here gets depends on these tests alone.
FACTORY = BwrapSandboxFactory(command_timeout_s=60, uid_range="101100-101163")

# Run inside a sandbox (or as a host process of a leased uid): the kernel-object attacks,
# each printing one JSON line. x86_64 numbers: add_key 248, request_key 249, keyctl 250.
KERNEL = r'''
import ctypes, errno, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    return r if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
L = ctypes.c_long
what, arg = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
out = {}
if what == "plant":  # a message and a token on every keyring a uid can reach
    for name, ring in (("user", -4), ("user_session", -5), ("session", -3), ("process", -2)):
        out[name] = call(248, b"user", arg.encode(), b"message-and-token:" + arg.encode(), L(5), L(ring))
elif what == "find":  # look for a key by its description on every keyring reachable, and in /proc/keys
    for name, ring in (("user", -4), ("user_session", -5), ("session", -3)):
        out[name] = call(250, L(10), L(ring), b"user", arg.encode(), L(0))  # KEYCTL_SEARCH
    out["request_key"] = call(249, b"user", arg.encode(), None, L(0))
    out["proc_keys"] = arg in open("/proc/keys").read()
elif what == "refused":  # each must be refused by the filter: EPERM
    out["keyctl_get_user_keyring"] = call(250, L(0), L(-4), L(1))
    out["ptrace_attach_pid_1"] = call(101, L(16), L(1), L(0), L(0))
    out["ptrace_traceme"] = call(101, L(0), L(0), L(0), L(0))
    out["mount_tmpfs"] = call(165, b"none", b"/tmp", b"tmpfs", L(0), None)
    out["umount2"] = call(166, b"/tmp", L(2))
    out["unshare_newuser"] = call(272, L(0x10000000))
    out["unshare_newns"] = call(272, L(0x00020000))
    out["clone_newuser"] = call(56, L(0x10000000 | 17), L(0), L(0), L(0), L(0))
    out["setns"] = call(308, L(0), L(0))
    out["bpf_map_create"] = call(321, L(0), None, L(0))
    out["perf_event_open"] = call(298, None, L(0), L(-1), L(-1), L(0))
    out["userfaultfd"] = call(323, L(0))
    out["io_uring_setup"] = call(425, L(1), None)
    out["personality_read_implies_exec"] = call(135, L(0x0400000))
out["uid"] = __import__("os").getuid()
print(json.dumps(out))
'''


def _kernel(sb, what: str, arg: str = "") -> dict:
    sb.upload_files([("/tmp/kernel.py", KERNEL.encode())])
    r = sb.execute(f"python3 /tmp/kernel.py {what} {arg}")
    assert r.exit_code == 0, r.output
    return json.loads(r.output.strip().splitlines()[-1])


def _as_uid(uid: int, what: str, arg: str = "") -> dict:
    """The same probe as a host process of ``uid``, with no filter: what the uid itself
    could reach, whatever a sandbox's filter refuses."""
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                        sys.executable, "-I", "-c", KERNEL, what, arg], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@as_root
def test_concurrently_open_sandboxes_never_share_a_uid(tmp_path):
    sandboxes = [FACTORY.open(SandboxSpec(task_id=f"t{i}"), tmp_path / str(i)) for i in range(4)]
    try:
        uids = [int(sb.execute("id -u").output.strip()) for sb in sandboxes]
        assert len(set(uids)) == 4 and all(u in FACTORY._uids for u in uids)
        assert uids == [sb.owner[0] for sb in sandboxes]
        # Its files are its own: the host's directories were handed to that uid.
        assert sandboxes[0].execute("touch /app/f && stat -c %u /app/f").output.strip() == str(uids[0])
    finally:
        for sb in sandboxes:
            sb.close()


@as_root
def test_a_uid_leased_by_another_process_is_never_leased_here(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from milo_ray.boundary.sandbox.identity import lease, parse_uid_range\n"
                               f"held = lease(parse_uid_range({FACTORY.uid_range!r}))\nprint(held.uid, flush=True)\n"
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = int(holder.stdout.readline())
        with FACTORY.open(SandboxSpec(task_id="t"), tmp_path) as sb:
            assert sb.owner[0] != theirs
    finally:
        holder.communicate("", timeout=30)


def test_keyring_calls_are_refused_and_nothing_is_planted(tmp_path):
    desc = f"milo-{uuid.uuid4().hex[:12]}"
    with FACTORY.open(SandboxSpec(task_id="a"), tmp_path / "a") as a:
        planted = _kernel(a, "plant", desc)
        assert {planted[k] for k in ("user", "user_session", "session", "process")} == {"EPERM"}
        found = _kernel(a, "find", desc)
        assert {found[k] for k in ("user", "user_session", "session", "request_key")} == {"EPERM"}
        assert found["proc_keys"] is False
    assert desc not in Path("/proc/keys").read_text()


@as_root
def test_a_key_on_one_sandbox_uid_is_invisible_to_a_concurrent_sandbox_and_gone_after(tmp_path, monkeypatch):
    """The uid alone separates keyrings: with the filter taken away (as if a call went
    around it), a key sandbox A plants on its user keyring is not found by sandbox B,
    running at the same time, and is gone once A closes -- for the next lease of A's uid."""
    monkeypatch.setattr(bwrap_module, "seccomp_launcher", lambda: [])
    desc = f"milo-{uuid.uuid4().hex[:12]}"
    a = FACTORY.open(SandboxSpec(task_id="a"), tmp_path / "a")
    try:
        with FACTORY.open(SandboxSpec(task_id="b"), tmp_path / "b") as b:
            planted = _kernel(a, "plant", desc)
            assert isinstance(planted["user"], int) and isinstance(planted["user_session"], int)
            assert isinstance(_kernel(a, "find", desc)["user"], int)  # A's own uid still has it
            found = _kernel(b, "find", desc)
            assert found["user"] == found["user_session"] == "ENOKEY" and found["proc_keys"] is False
        uid = a.owner[0]
    finally:
        a.close()
    after = _as_uid(uid, "find", desc)
    assert after["user"] == after["user_session"] == "ENOKEY" and after["proc_keys"] is False
    with FACTORY.open(SandboxSpec(task_id="later"), tmp_path / "later") as later:
        assert later.owner[0] == uid  # the lowest free uid: A's, given back
        found = _kernel(later, "find", desc)
        assert found["user"] == "ENOKEY" and found["proc_keys"] is False


@as_root
def test_keyrings_a_uid_was_left_with_are_emptied_when_its_lease_ends(tmp_path):
    """Planted from outside any sandbox (no filter, no PID namespace): the clearing alone."""
    with FACTORY.open(SandboxSpec(task_id="a"), tmp_path) as sb:
        uid, desc = sb.owner[0], f"milo-{uuid.uuid4().hex[:12]}"
        assert isinstance(_as_uid(uid, "plant", desc)["user"], int)
        assert isinstance(_as_uid(uid, "find", desc)["user"], int)
    found = _as_uid(uid, "find", desc)
    assert found["user"] == found["user_session"] == "ENOKEY" and found["proc_keys"] is False


@as_root
def test_a_uid_whose_holder_died_is_cleared_before_it_is_leased_again(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from milo_ray.boundary.sandbox.identity import lease, parse_uid_range\n"
                               f"held = lease(parse_uid_range({FACTORY.uid_range!r}))\nprint(held.uid, flush=True)\n"
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    uid, desc = int(holder.stdout.readline()), f"milo-{uuid.uuid4().hex[:12]}"
    assert isinstance(_as_uid(uid, "plant", desc)["user"], int)
    holder.kill()  # dies holding the uid: nothing given back, nothing cleared
    holder.wait(timeout=30)
    factory = BwrapSandboxFactory(command_timeout_s=60, uid_range=f"{uid}-{uid}")
    with factory.open(SandboxSpec(task_id="t"), tmp_path) as sb:
        found = _kernel(sb, "find", desc)
        assert found["proc_keys"] is False
        assert _as_uid(uid, "find", desc)["user"] == "ENOKEY"


def test_sysv_ipc_made_in_one_sandbox_is_invisible_in_another(tmp_path):
    key = 0x4D000000 + uuid.uuid4().int % 0xFFFF
    # A makes a shared memory segment and a message queue, says so (with what its own
    # namespace shows) in /app/made, and keeps them alive while B looks.
    make = (f"import ctypes, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"assert libc.shmget({key}, 4096, 0o1666) >= 0 and libc.msgget({key}, 0o1666) >= 0\n"
            "seen = open('/proc/sysvipc/shm').read() + open('/proc/sysvipc/msg').read()\n"
            f"open('/app/made', 'w').write(str([l.split()[0] for l in seen.splitlines()].count('{key}')))\n"
            "time.sleep(60)\n")
    look = (f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"print(libc.shmget({key}, 0, 0), libc.msgget({key}, 0), ctypes.get_errno(), "
            f"[l.split()[0] for l in (open('/proc/sysvipc/shm').read() + open('/proc/sysvipc/msg').read())"
            f".splitlines()].count('{key}'))\n")
    with FACTORY.open(SandboxSpec(task_id="a"), tmp_path / "a") as a, \
            FACTORY.open(SandboxSpec(task_id="b"), tmp_path / "b") as b:
        a.upload_files([("/tmp/make.py", make.encode())])
        b.upload_files([("/tmp/look.py", look.encode())])
        maker = threading.Thread(target=a.execute, args=("python3 /tmp/make.py",), daemon=True)
        maker.start()
        try:
            made = None
            for _ in range(600):  # until A has made them (bounded by the attempts, not a clock)
                made = a.download_files(["/app/made"])[0].content
                if made:
                    break
                threading.Event().wait(0.05)
            assert made == b"2", "the attack did not make its objects"
            assert b.execute("python3 /tmp/look.py").output.split() == ["-1", "-1", "2", "0"]  # ENOENT
            host = Path("/proc/sysvipc/shm").read_text() + Path("/proc/sysvipc/msg").read_text()
            assert str(key) not in [line.split()[0] for line in host.splitlines()]
        finally:
            a.interrupt()
            maker.join(30)


def test_tracing_mounting_namespaces_bpf_and_perf_are_refused(tmp_path):
    with FACTORY.open(SandboxSpec(task_id="a"), tmp_path) as sb:
        refused = _kernel(sb, "refused")
        uid = refused.pop("uid")
        assert refused == {name: "EPERM" for name in refused}, refused
        # The tools a harness would reach for fail the same way.
        r = sb.execute("unshare -U true; echo rc=$?; unshare -m true; echo rc=$?")
        assert r.output.count("rc=1") == 2 and "Operation not permitted" in r.output
        # Ordinary work is untouched: threads, fork, a subprocess, the allowed personas.
        ok = sb.execute("python3 -c \"import ctypes, subprocess, threading; libc = ctypes.CDLL(None); "
                        "t = threading.Thread(target=print); t.start(); t.join(); "
                        "print(subprocess.run(['true']).returncode, libc.personality(8), libc.personality(0))\"")
        assert ok.exit_code == 0 and ok.output.split()[-3:] == ["0", "0", "8"], ok.output
    if os.geteuid() == 0:
        assert uid in FACTORY._uids


# add_key through the 32-bit ABI (int 0x80, i386 number 286) from a 64-bit process: a
# filter written for x86_64 numbers alone would not see it. Prints the call's return value.
I386_ADD_KEY = """
import ctypes, mmap
code = bytes([0xB8, 0x1E, 0x01, 0x00, 0x00, 0x31, 0xDB, 0xCD, 0x80, 0xC3])  # mov eax,286; xor ebx,ebx; int 0x80; ret
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))())
"""


def test_the_32_bit_system_call_abi_is_filtered_too(tmp_path):
    host = subprocess.run([sys.executable, "-c", I386_ADD_KEY], capture_output=True, text=True, timeout=60)
    if host.returncode != 0:
        pytest.skip(f"this kernel runs no 32-bit system calls: {host.stderr[-200:]}")
    assert host.stdout.strip() != "-1"  # unfiltered, the call runs (and fails on its NULL type)
    with FACTORY.open(SandboxSpec(task_id="a"), tmp_path) as sb:
        sb.upload_files([("/tmp/i386.py", I386_ADD_KEY.encode())])
        r = sb.execute("python3 /tmp/i386.py")
        assert r.exit_code == 0 and r.output.strip() == "-1", r.output  # -EPERM


@as_root
def test_processes_of_a_closed_sandbox_uid_are_gone(tmp_path):
    with FACTORY.open(SandboxSpec(task_id="a"), tmp_path) as sb:
        uid = sb.owner[0]
        # A process of the uid outside the sandbox's PID namespaces (as if one had got
        # out), in its own session: closing the sandbox must still end it.
        stray = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                                  "/bin/sh", "-c", "echo up; exec sleep 600"], start_new_session=True,
                                 stdout=subprocess.PIPE, text=True)
        assert stray.stdout.readline() == "up\n" and stray.pid in identity.pids_of(uid)
    assert stray.wait(timeout=30) == -9
    assert identity.pids_of(uid) == []


def test_a_uid_range_must_be_valid_and_nobody_elses(tmp_path):
    with pytest.raises(ValueError, match="sandbox.uid_range"):
        BwrapSandboxFactory(uid_range="65534:65534")
    with pytest.raises(ValueError, match="sandbox.uid_range"):
        BwrapSandboxFactory(uid_range="0-10")
    (tmp_path / "passwd").write_text("root:x:0:0::/root:/bin/sh\nsvc:x:100005:100005::/:/bin/false\n")
    (tmp_path / "subuid").write_text("alice:100500:65536\n")
    taken = identity.accounts_in(identity.parse_uid_range("100000-101023"), etc=str(tmp_path))
    assert taken == ["passwd:svc=100005", "subuid:alice=100500+65536"]
    assert identity.accounts_in(identity.parse_uid_range("200000-200010"), etc=str(tmp_path)) == []


@as_root
def test_every_uid_taken_is_an_error_naming_the_knob(tmp_path):
    factory = BwrapSandboxFactory(command_timeout_s=60, uid_range="101200-101201")
    with factory.open(SandboxSpec(task_id="a"), tmp_path / "a"), factory.open(SandboxSpec(task_id="b"), tmp_path / "b"):
        with pytest.raises(RuntimeError, match="widen sandbox.uid_range"):
            factory.open(SandboxSpec(task_id="c"), tmp_path / "c")


# --- through the executor: a planting rollout next to an honest one ----------------------

# Both harnesses run their probes from build_agent, in the harness process, and write what
# they saw to /app/report-<role>.json. The planter puts a message with its live gateway
# token everywhere a uid or an IPC namespace could share it and holds it there; the honest
# rollout, running at the same time, looks for it everywhere while it solves its task.
_ROLLOUT = r'''
import ctypes, errno, json, os, time
from langchain_core.messages import AIMessage, HumanMessage
ROLE, DESC, IPC_KEY = {role!r}, {desc!r}, {ipc_key}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    return r if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def probe(model, backend):
    r = {{"role": ROLE, "uid": os.getuid(), "start": time.time(), "found": []}}
    token = str(getattr(model, "api_key", "")).encode()
    if ROLE == "planter":
        payload = b"meet at the usual place; token=" + token
        r["add_key"] = {{n: call(248, b"user", DESC.encode(), payload, L(len(payload)), L(ring))
                        for n, ring in (("user", -4), ("user_session", -5), ("session", -3))}}
        r["shmget"] = libc.shmget(IPC_KEY, 4096, 0o1666)
        r["msgget"] = libc.msgget(IPC_KEY, 0o1666)
        r["ptrace_pid_1"] = call(101, L(16), L(1), L(0), L(0))
        r["unshare_user"] = call(272, L(0x10000000))
        time.sleep(8)  # hold what was made while the other rollout looks
    else:
        backend.execute("echo 42 > /app/answer.txt")  # the honest part: the task's answer
        for _ in range(80):
            for n, ring in (("user", -4), ("user_session", -5), ("session", -3)):
                if isinstance(call(250, L(10), L(ring), b"user", DESC.encode(), L(0)), int):
                    r["found"].append("keyring " + n)
            if DESC in open("/proc/keys").read():
                r["found"].append("/proc/keys")
            if libc.shmget(IPC_KEY, 0, 0) >= 0 or libc.msgget(IPC_KEY, 0) >= 0:
                r["found"].append("sysv ipc")
            time.sleep(0.1)
    r["end"] = time.time()
    with open("/app/report-" + ROLE + ".json", "w") as f:
        json.dump(r, f)
    return r

class _Agent:
    def __init__(self, report):
        self.report = report
    async def astream(self, inputs, config=None, stream_mode=None):
        yield {{"messages": [HumanMessage(content=inputs["messages"][0]["content"]),
                            AIMessage(content=json.dumps(self.report))]}}

def build_agent(model, backend):
    return _Agent(probe(model, backend))
'''


@pytest.mark.slow
def test_a_token_planted_in_the_kernel_by_one_rollout_never_reaches_a_concurrent_rollout(tmp_path):
    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.harness.model import Harness
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "execution"))
    from real_tasks import make_task

    make_task(tmp_path / "tasks", "answer", answer="42", agent_timeout_s=90)
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    desc, ipc_key = f"milo-{uuid.uuid4().hex[:12]}", 0x4E000000 + uuid.uuid4().int % 0xFFFF
    harness = {role: Harness.from_source(_ROLLOUT.format(role=role, desc=desc, ipc_key=ipc_key), name=role)
               for role in ("planter", "honest")}
    key_env = "MILO_IDENTITY_TEST_KEY"
    os.environ[key_env] = "sk-identity-" + uuid.uuid4().hex
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    try:
        with ScriptedOpenAIServer([reply("ok")]) as srv:
            ex = AgentExecutor(model={"solver": "openai/scripted", "api_base": srv.url, "api_key_env": key_env,
                                      "request_timeout_s": 30, "max_retries": 0},
                               sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                               scratch_dir=str(scratch), keep_scratch=True, startup_timeout_s=90)

            async def both():
                return await asyncio.gather(*(ex.aexecute(harness[r], suite.task("answer"), 0, 0)
                                              for r in ("planter", "honest")))

            planter, honest = asyncio.run(both())
    finally:
        os.environ.pop(key_env)
    reports = {}
    for path in scratch.rglob("report-*.json"):
        report = json.loads(path.read_text())
        reports[report["role"]] = report
    assert set(reports) == {"planter", "honest"}, "a probe did not run"
    plant, look = reports["planter"], reports["honest"]
    # The attack ran while the honest rollout looked, and each was refused or found nothing.
    assert plant["start"] < look["end"] and look["start"] < plant["end"]
    assert set(plant["add_key"].values()) == {"EPERM"}
    assert plant["shmget"] >= 0 and plant["msgget"] >= 0  # made, in its own IPC namespace
    assert plant["ptrace_pid_1"] == plant["unshare_user"] == "EPERM"
    assert look["found"] == []
    if os.geteuid() == 0:
        assert plant["uid"] != look["uid"]
    # Recorded as ordinary rollouts: the planter scores 0, the honest one scores.
    assert planter.score == 0.0 and planter.error_kind is None
    assert honest.score == 1.0 and honest.error_kind is None
