"""What a sandbox's mount table tells a harness about the host: for every mount,
``/proc/self/mountinfo`` gives the path of its source relative to the filesystem it lives
on. Under a root worker every bind the sandbox sees comes from a filesystem of its own
(the sandbox's volume, the worker's neutral root), so that field names no path of the
rollout's scratch, the package's code copy, the checkout, the run or the gateway
directory -- for commands, for the harness process (cold and warm), with the workdir
under /root or at /app, with and without internet, and in the grading sandbox."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import milo_ray
from milo_ray.boundary.harness_process.host import gateway_dir_of, harness_binds, harness_dir_of
from milo_ray.boundary.sandbox import neutral
from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.bwrap import LAUNCH_ENV, BwrapSandboxFactory
from milo_ray.boundary.sandbox.egress import missing_tools
from milo_ray.boundary.sandbox.interpreter import interpreter_paths
from milo_ray.boundary.sandbox.runtime_code import runtime_code_dir

FACTORY = BwrapSandboxFactory(command_timeout_s=30, own_volume=True)
_why = FACTORY.unsupported(SandboxSpec(task_id="probe"))
pytestmark = [pytest.mark.skipif(_why is not None, reason=f"bwrap unusable here: {_why}"),
              # A worker that is not root mounts nothing: its binds show host paths
              # (docs/security.md, "Bind sources").
              pytest.mark.skipif(os.geteuid() != 0, reason="neutral bind sources take a root worker")]
CHECKOUT = str(Path(milo_ray.__file__).resolve().parents[1])
READ = "cat /proc/self/mountinfo /proc/self/mounts /proc/1/mountinfo"
CASES = [("/root", False), ("/root", True), ("/app", False), ("/app", True)]


def _case_id(case) -> str:
    return f"{case[0].strip('/')}-{'internet' if case[1] else 'offline'}"


def _forbidden(scratch: Path, run_dir: Path, gateway_dir: Path) -> dict[str, str]:
    return {"scratch": str(scratch), "runtime code": str(runtime_code_dir()), "checkout": CHECKOUT,
            "run dir": str(run_dir), "gateway dir": str(gateway_dir), "worker's neutral root": neutral.BASE}


def _on_its_filesystem(path: str) -> str:
    """``path`` as a mountinfo root field shows it: relative to the host mount it lies on
    (``path`` itself on the neutral root, whose relative paths are the neutral names)."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    mount = max((p for p in points if path == p or path.startswith(p.rstrip("/") + "/")), key=len)
    return path if mount.startswith(neutral.BASE) else "/" + path[len(mount):].lstrip("/")


def _assert_names_none(text: str, forbidden: dict[str, str]) -> None:
    assert " /tmp " in text and " /proc " in text  # the tables were read
    for what, path in forbidden.items():
        for shown in {path, _on_its_filesystem(path)} - {"/"}:
            assert shown not in text, f"the sandbox's mount table names the {what} ({shown})"


def _process_output(sandbox, argv: list[str], binds: dict[str, str]) -> str:
    prefix, args, command = sandbox.process_command(argv, binds)
    fd = os.memfd_create("bwrap-args")
    try:
        os.write(fd, b"".join(a.encode() + b"\0" for a in args))
        os.lseek(fd, 0, os.SEEK_SET)
        run = subprocess.run([*prefix, "--args", str(fd), *command], timeout=30, capture_output=True, text=True,
                             env=dict(LAUNCH_ENV), pass_fds=(fd,), start_new_session=True)
    finally:
        os.close(fd)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_no_bind_source_names_a_host_path_of_the_rollout(case, tmp_path):
    workdir, internet = case
    if internet and missing_tools():
        pytest.skip(f"no private network here: {missing_tools()}")
    run_dir = tmp_path / "run"
    scratch = run_dir / "scratch" / "rollout"
    scratch.mkdir(parents=True)
    # The interpreter under /root (pyenv) lies inside a /root workspace: its mount point
    # comes from a skeleton of the worker's (BwrapSandbox._late_binds).
    spec = SandboxSpec(task_id="binds", workdir=workdir, allow_internet=internet,
                       host_readonly=tuple(interpreter_paths()))
    harness_dir, gateway_dir = harness_dir_of(scratch), gateway_dir_of(scratch)
    for d in (harness_dir, gateway_dir):
        d.mkdir(parents=True, exist_ok=True)
    forbidden = _forbidden(scratch, run_dir, gateway_dir)
    carried = scratch / "carried" / "agent"
    carried.mkdir(parents=True)
    (carried / "note.txt").write_text("carried\n")
    sandbox = FACTORY.open(spec, scratch / "agent")
    try:
        command = sandbox.execute(READ)
        assert command.exit_code == 0, command.output
        process = _process_output(sandbox, ["/bin/sh", "-c", READ], harness_binds(harness_dir, gateway_dir))
        # The grading sandbox also sees the host's copies of what the agent phase carries.
        fresh = sandbox.fresh_for_grading(readonly_binds={str(carried): "/logs/agent"})
    except BaseException:
        sandbox.close()
        raise
    with fresh:
        graded = fresh.execute(READ + " /logs/agent/note.txt")
    _assert_names_none(command.output, forbidden)
    _assert_names_none(process, forbidden)
    assert all(f" /run/milo/{d} " in process for d in ("lib", "harness", "gateway"))
    _assert_names_none(graded.output, forbidden)
    assert graded.output.rstrip().endswith("carried")  # the copy it is shown holds the files


def test_what_a_sandbox_borrowed_from_the_neutral_root_goes_when_it_closes(tmp_path):
    carried = tmp_path / "carried"
    carried.mkdir()
    (carried / "f").write_text("x")
    root = neutral.worker_root()
    assert root is not None
    before = {p for kind in ("m", "c") for p in (root / kind).glob("*")}
    spec = SandboxSpec(task_id="gone", workdir="/root", host_readonly=tuple(interpreter_paths()))
    with FACTORY.open(spec, tmp_path / "agent", readonly_binds={str(carried): "/logs/agent"}) as sb:
        assert sb.execute("cat /logs/agent/f").output == "x"
        during = {p for kind in ("m", "c") for p in (root / kind).glob("*")}
    after = {p for kind in ("m", "c") for p in (root / kind).glob("*")}
    assert during - before and not (after - before)


# --- through the executor: a harness process reads the tables, cold and warm -------------------

_PROBE = '''
import json
from langchain_core.messages import AIMessage, HumanMessage

MARKER = "BIND-SOURCES:"


class _Agent:
    def __init__(self, report):
        self.report = report

    async def astream(self, inputs, config=None, stream_mode=None):
        # One message per table: a message's content is capped (trajectory.MAX_CONTENT_CHARS).
        yield {"messages": [HumanMessage(content="probe"),
                            *(AIMessage(content=f"{MARKER}{k}\\n{v}") for k, v in self.report.items())]}


def build_agent(model, backend):
    report = {}
    for path in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/1/mountinfo"):
        with open(path) as f:
            report[path] = f.read()
    for path in %r:
        report["command " + path] = backend.execute("cat " + path).output
    return _Agent(report)
''' % (READ.split()[1:],)


def _reports(trace, marker: str) -> list[str]:
    """Every string of a rollout's trace that starts with ``marker``."""
    found, stack = [], [trace]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and item.startswith(marker):
            found.append(item[len(marker):])
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _task(root: Path, name: str, workdir: str, internet: bool) -> None:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text("Do nothing.\n")
    (d / "task.toml").write_text(textwrap.dedent(f"""\
        version = "1.0"
        [agent]
        timeout_sec = 60
        [verifier]
        timeout_sec = 30
        [environment]
        allow_internet = {str(internet).lower()}
        """))
    (d / "environment" / "Dockerfile").write_text(f"FROM ubuntu:24.04\nWORKDIR {workdir}\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\nmkdir -p /logs/verifier\necho 0 > /logs/verifier/reward.txt\n")


@pytest.mark.slow  # cold and warm harness processes through the executor
@pytest.mark.skipif(shutil.which("slirp4netns") is None or missing_tools() is not None,
                    reason="no private network here")
@pytest.mark.parametrize("warm", [0, 1], ids=["cold", "warm"])
def test_a_harness_process_finds_no_host_path_in_its_mount_table(warm, tmp_path):
    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.core.tasks import format_of
    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.harness.model import Harness
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

    _task(tmp_path / "tasks", "under-root", "/root/project", True)
    _task(tmp_path / "tasks", "at-app", "/app", False)
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    run_dir = tmp_path / "run"
    (run_dir / "scratch").mkdir(parents=True)
    harness = Harness.from_source(_PROBE, name="bind-probe")
    os.environ.setdefault("MILO_BINDS_SOLVER_KEY", "local")
    with ScriptedOpenAIServer(lambda body: reply("unused")) as srv:
        ex = AgentExecutor(model={"solver": "openai/scripted", "api_base": srv.url,
                                  "api_key_env": "MILO_BINDS_SOLVER_KEY", "max_retries": 0},
                           sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory",
                                    "own_volume": True},
                           scratch_dir=str(run_dir / "scratch"), warm_processes=warm)

        async def go():
            tasks = [suite.task(t) for t in ("under-root", "at-app")]
            try:
                if warm:  # a spare of each task's shape, started before its rollout
                    for task in tasks:
                        ex.pool.refill(format_of(task).sandbox_spec(task))
                    while ex.pool.spares() < len(tasks):
                        await asyncio.sleep(0.2)
                return [await ex.aexecute(harness, task, 0, 0) for task in tasks]
            finally:
                await ex.pool.aclose()

        results = asyncio.run(go())
    assert [r.trace["trajectory"]["warm_process"] for r in results] == [bool(warm)] * 2
    forbidden = {"scratch": str(run_dir / "scratch"), "runtime code": str(runtime_code_dir()), "checkout": CHECKOUT,
                 "run dir": str(run_dir), "worker's neutral root (gateway and harness dirs)": neutral.BASE}
    for res in results:
        text = "\n".join(_reports(res.trace, "BIND-SOURCES:"))
        assert text.count("/proc/self/mountinfo\n") == 2 and text.count("/proc/self/mounts\n") == 2, text[:2000]
        assert all(f" /run/milo/{d} " in text for d in ("lib", "harness", "gateway"))
        _assert_names_none(text, forbidden)


def test_a_volume_that_is_no_cap_reports_none(tmp_path):
    """``own_volume`` moves the writable directories onto a volume without making a cap
    out of it: ``limits.storage`` still says nothing holds the total."""
    with FACTORY.open(SandboxSpec(task_id="uncapped"), tmp_path) as sb:
        assert sb.limits.storage is None and sb.limits.file_size is None
        assert " /app " in sb.execute("grep ' /app ' /proc/self/mountinfo").output
        assert "/sandbox/workspace /app " in sb.execute("cat /proc/self/mountinfo").output
        assert sb.execute("echo kept > /app/f").exit_code == 0
        assert (sb.workspace_dir / "f").read_text() == "kept\n" and str(tmp_path) in str(sb.workspace_dir)


def test_a_dead_workers_neutral_root_is_unmounted_by_the_next(tmp_path):
    child = subprocess.Popen([os.sys.executable, "-c",
                              "import sys, time\nfrom milo_ray.boundary.sandbox.neutral import worker_root\n"
                              "print(worker_root(), flush=True)\ntime.sleep(600)\n"],
                             stdout=subprocess.PIPE, text=True)
    try:
        where = child.stdout.readline().strip()
        assert where.startswith(neutral.BASE + "/") and os.path.ismount(where)
        assert neutral.reap_worker_roots() == 0 and os.path.ismount(where)  # its owner lives
    finally:
        child.kill()  # no exit handler runs: the mount stays behind
        child.wait()
    assert os.path.ismount(where)
    assert neutral.reap_worker_roots() >= 1
    assert not os.path.lexists(where)
