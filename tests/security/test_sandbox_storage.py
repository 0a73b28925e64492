"""``storage_mb`` bounds the total a sandbox writes across all its writable places (the
workspace, /tmp, HOME, /logs), not one file: they share one volume of that size
(milo_ray/boundary/sandbox/volume.py). Shown from real bwrap sandboxes, and from a hostile
harness run by the executor, whose rollout is recorded as a score."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from hostile import report_in_trace

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.bwrap import BwrapSandboxFactory
from milo_ray.boundary.sandbox.leftovers import SCRATCH_PREFIX, current_owner, reap_scratch
from milo_ray.boundary.sandbox.volume import Volume, unavailable

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.skipif(unavailable() is not None, reason=f"no volume here: {unavailable()}")]

MIB = 1024 * 1024
CAP_MB = 16
FACTORY = BwrapSandboxFactory(command_timeout_s=120)
SPEC = SandboxSpec(task_id="disk", storage_mb=CAP_MB)
# 20 MiB into each of four places: 80 MiB asked for, 16 allowed.
_FILL = "for d in /app /tmp \"$HOME\" /logs; do head -c 20971520 /dev/zero > \"$d/fill\"; echo \"$d $?\"; done"


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("disk")
    sb = FACTORY.open(SPEC, scratch / "agent")
    sb.execute("echo 42 > /app/answer.txt")
    run = sb.execute(_FILL)
    sizes = sb.execute("stat -c %s /app/fill /tmp/fill \"$HOME\"/fill /logs/fill").output.split()
    out = {"sandbox": sb, "scratch": scratch / "agent", "run": run, "sizes": [int(s) for s in sizes if s.isdigit()],
           "image": _allocated(scratch / "agent" / "volume.img")}
    yield out
    sb.close()


def test_writing_60_mib_across_workspace_tmp_home_and_logs_stops_at_the_cap(filled):
    assert sum(filled["sizes"]) <= CAP_MB * MIB, filled["sizes"]
    # Every place was written until the volume was full, then refused with ENOSPC.
    assert filled["run"].output.count("No space left on device") == 4, filled["run"].output
    assert sum(filled["sizes"]) > (CAP_MB - 2) * MIB  # the cap is ext4's: a little metadata off the top


def test_the_host_disk_holds_no_more_than_the_cap(filled):
    assert filled["image"] <= CAP_MB * MIB
    outside = sum(_allocated(p) for p in filled["scratch"].rglob("*")
                  if p.is_file() and not p.is_relative_to(filled["scratch"] / "volume") and p.name != "volume.img")
    assert outside < MIB


def test_the_limits_name_the_volume_and_its_size(filled):
    assert f"{CAP_MB} MiB" in filled["sandbox"].limits.storage and "all writable" in filled["sandbox"].limits.storage


def test_grading_on_a_full_volume_sees_the_workspace_and_nothing_else_the_agent_wrote(tmp_path):
    sb = FACTORY.open(SPEC, tmp_path)
    sb.execute("echo 42 > /app/answer.txt; " + _FILL)
    grader = sb.fresh_for_grading()
    try:
        out = grader.execute("cat /app/answer.txt; find /tmp \"$HOME\" /logs -mindepth 1; "
                             "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && echo graded")
        assert out.output.split() == ["42", "graded"], out.output
    finally:
        grader.close()
    assert not _mounted(tmp_path / "volume")


def test_the_volume_is_unmounted_when_the_sandbox_closes(tmp_path):
    sb = FACTORY.open(SPEC, tmp_path)
    assert _mounted(tmp_path / "volume")
    sb.close()
    assert not _mounted(tmp_path / "volume")


def test_a_volume_left_unclosed_is_unmounted_when_its_sandbox_is_collected(tmp_path):
    sb = FACTORY.open(SPEC, tmp_path)
    assert _mounted(tmp_path / "volume")
    del sb
    gc.collect()
    assert not _mounted(tmp_path / "volume")


def test_a_dead_workers_volume_is_unmounted_before_its_scratch_is_reaped(tmp_path):
    me = current_owner()
    if me is None:
        pytest.skip("no owner tag can be made here")
    dead = dataclasses.replace(me, start=me.start + 1)  # this pid, another start: a dead process
    scratch = tmp_path / f"{SCRATCH_PREFIX}{dead.tag}rollout"
    sb = FACTORY.open(SPEC, scratch / "agent")  # never closed, as by a worker killed outright
    try:
        assert _mounted(scratch / "agent" / "volume")
        assert reap_scratch(tmp_path) == 1
        assert not _mounted(scratch / "agent" / "volume") and not scratch.exists()
    finally:
        sb.close()


def test_a_storage_cap_below_one_mib_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="storage_mb must be >= 1"):
        Volume(tmp_path / "img", tmp_path / "mnt", 0)


def test_a_sandbox_without_a_cap_has_no_volume(tmp_path):
    with FACTORY.open(SandboxSpec(task_id="free"), tmp_path) as sb:
        assert sb.limits.storage is None and not hasattr(sb, "fresh_for_grading")
        assert not (tmp_path / "volume").exists()


# -- a hostile harness, run by the executor --------------------------------------------

KEY_ENV = "MILO_STORAGE_SOLVER_KEY"

FILL_HARNESS = '''
import json, os
from langchain_core.messages import AIMessage, HumanMessage


def _fill(path, mib=20):
    written = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"x" * (1 << 20))
                f.flush()
                written += 1 << 20
    except OSError as e:
        return written, os.strerror(e.errno)
    return written, None


class _Agent:
    def __init__(self, report):
        self.report = report

    async def astream(self, inputs, config=None, stream_mode=None):
        yield {"messages": [HumanMessage(content=inputs["messages"][0]["content"]),
                            AIMessage(content="DISKFILL" + json.dumps(self.report))]}


def build_agent(model, backend):
    r = {d: _fill(os.path.join(d, "fill")) for d in ("/app", "/tmp", os.path.expanduser("~"))}
    r["command"] = backend.execute("head -c 20971520 /dev/zero > /tmp/more; echo $?").output
    return _Agent(r)
'''


@pytest.mark.slow  # a cold harness process
def test_a_harness_filling_its_disk_is_stopped_at_the_cap_and_its_rollout_scored(tmp_path):
    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.harness.model import Harness
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

    from hostile import make_secret_task

    task_dir = make_secret_task(tmp_path / "tasks")
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", f"[environment]\nstorage_mb = {CAP_MB}\n"))
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    assert suite.task("secret").metadata["storage_mb"] == CAP_MB
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.environ[KEY_ENV] = "sk-" + uuid.uuid4().hex
    try:
        with ScriptedOpenAIServer(lambda body: reply("hi", prompt_tokens=3, completion_tokens=1)) as srv:
            model = {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": KEY_ENV,
                     "request_timeout_s": 30, "max_retries": 0}
            ex = AgentExecutor(model=model, sandbox={"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                               scratch_dir=str(scratch), keep_scratch=True)
            result = asyncio.run(ex.aexecute(Harness.from_source(FILL_HARNESS, name="disk-fill"),
                                             suite.task("secret"), 0, 0))
    finally:
        os.environ.pop(KEY_ENV, None)
    report = json.loads(report_in_trace(result.trace, "DISKFILL"))
    written = [report[d][0] for d in report if d != "command"]
    assert sum(written) <= CAP_MB * MIB, report
    assert all(report[d][1] == os.strerror(28) for d in report if d != "command"), report  # ENOSPC
    assert report["command"].strip().endswith("1"), report["command"]
    assert result.score == 0.0 and result.error_kind is None  # a score, not a crash
    images = list(scratch.rglob("volume.img"))
    assert images and all(_allocated(p) <= CAP_MB * MIB for p in images)
    assert not [line for line in Path("/proc/mounts").read_text().splitlines() if str(scratch) in line]

