"""Untrusted text is made storable: whatever a harness, a task or a model wrote, the
sanitiser's output encodes as UTF-8, holds no NUL, is bounded, and round-trips through a
Parquet write; it never raises."""

from __future__ import annotations

import io
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from milo_ray.core.storable import MAX_DEPTH, storable, storable_text

# Any code point a Python string can hold: surrogates (lone or paired), NUL, the rest.
_ANY_CHAR = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr), st.just("\x00"),
                      st.integers(0, 0x10FFFF).map(chr))
_ANY_TEXT = st.lists(_ANY_CHAR, max_size=60).map("".join)


def _parquet_round_trip(values: list[str]) -> list[str]:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": pa.array(values, type=pa.string())}), buf)
    return pq.read_table(io.BytesIO(buf.getvalue()))["text"].to_pylist()


@settings(max_examples=300, deadline=None)
@given(_ANY_TEXT, st.integers(1, 80))
def test_sanitised_text_always_encodes_and_round_trips_through_parquet(text, limit):
    out = storable_text(text, limit=limit)
    out.encode("utf-8")
    assert "\x00" not in out
    assert _parquet_round_trip([out]) == [out]
    assert storable_text(out, limit=len(out)) == out  # nothing left to fix


@settings(max_examples=100, deadline=None)
@given(st.recursive(_ANY_TEXT, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_ANY_TEXT, kids, max_size=4),
                    max_leaves=20))
def test_sanitised_values_encode_as_json_and_utf8(value):
    json.dumps(storable(value), ensure_ascii=False).encode("utf-8")


def test_undecodable_bytes_of_a_file_name_show_as_escapes():
    name = os.fsdecode(b"caf\xe9 \xff.txt")  # a non-UTF-8 file name, as Python decodes it
    assert storable_text(name) == "caf\\xe9 \\xff.txt"
    assert storable_text("a\ud800b") == "a\ufffdb"  # a lone high surrogate
    assert storable_text("\ud83d\ude00") == "\U0001F600"  # a pair split in two code points is joined
    assert storable_text("nul\x00here") == "nul\\x00here"


def test_oversized_text_is_cut_with_a_marker_saying_how_much():
    out = storable_text("x" * 1000, limit=100)
    assert out == "x" * 100 + "[... 900 characters cut]"
    assert storable_text("short", limit=100) == "short"


def test_keys_are_sanitised_and_deep_nesting_is_bounded():
    deep: list = []
    cur = deep
    for _ in range(10 * MAX_DEPTH):
        cur.append([])
        cur = cur[0]
    out = storable({"k\udcff": deep, 3: "v\x00"})
    assert set(out) == {"k\\xff", 3} and out[3] == "v\\x00"
    json.dumps(out)  # no RecursionError: the depth past MAX_DEPTH became a string
    assert "nested deeper" in json.dumps(out)


def test_anything_is_turned_into_text_without_raising():
    class Hostile:
        def __str__(self):
            raise RuntimeError("no")

    assert storable_text(Hostile()) == "[unprintable Hostile: RuntimeError]"
    assert storable_text(b"\xff") == "b'\\xff'"


def test_the_harness_processs_messages_and_stderr_enter_the_host_storable(tmp_path):
    """What the host reads from a harness process (its protocol lines, its stderr) is made
    storable where it is parsed, before any of the worker's code holds it."""
    import asyncio

    from milo_ray.boundary.harness_process.host import HarnessProcess

    lines = [{"t": "steps", "start": 0, "steps": [{"role": "assistant", "content": "r\udce9sum\udce9 \u0000 \ud800"}]},
             {"t": "final", "status": "harness_error", "error": "caf\udce9\u0000"}]

    class _Proc:
        returncode = 0

    async def read():
        proc = HarnessProcess(sandbox=None, harness=None, scratch=tmp_path)
        proc.proc = _Proc()
        proc.proc.stdout = asyncio.StreamReader()
        proc.proc.stdout.feed_data(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
        proc.proc.stdout.feed_eof()
        proc._stderr += b"oops \xff\x00"
        await proc._read_stdout()
        return proc

    proc = asyncio.run(read())
    assert proc.protocol_error is None
    assert proc.log.steps()[0]["content"] == "r\\xe9sum\\xe9 \\x00 \ufffd"
    assert proc.final["error"] == "caf\\xe9\\x00"
    assert proc.stderr_tail() == "oops \ufffd\\x00"


# --------------------------------------------------------------------------- real harnesses

_STEPS_AGENT = '''
import os
from langchain_core.messages import AIMessage, HumanMessage


class _Agent:
    async def astream(self, inputs, config=None, stream_mode=None):
        text = "wrote " + os.fsdecode(b"r\\xe9sum\\xe9.txt") + " \\x00 and \\ud800 " + "q" * 5_000_000
        yield {"messages": [HumanMessage(content=inputs["messages"][0]["content"]), AIMessage(content=text)]}


def build_agent(model, backend):
    return _Agent()
'''

_RAISES = '''
import os, sys


def build_agent(model, backend):
    sys.stderr.buffer.write(b"z" * 50_000_000 + b"\\n" + b"tail \\xff\\xfe \\x00 raw\\n")
    sys.stderr.flush()
    raise RuntimeError("cannot open " + os.fsdecode(b"caf\\xe9.txt") + "\\x00 \\ud800")
'''

# Writes one 50 MB line to every pipe it holds past stdio: the protocol channel among them.
_FLOODS = '''
import os, stat


def build_agent(model, backend):
    line = b'{"t": "steps", "start": 0, "steps": [{"role": "ai", "content": "' + b"w" * 50_000_000 + b'"}]}\\n'
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, line)
        except OSError:
            pass
    raise SystemExit(0)
'''

_CALLS = '''
from langchain.agents import create_agent


def build_agent(model, backend):
    return create_agent(model, tools=[])
'''


@pytest.mark.slow  # four sandboxed harness processes through a real scheduler: ~40 s
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_harnesses_writing_unstorable_text_end_as_recorded_rollouts(tmp_path, ray_local, monkeypatch):
    """Lone surrogates, NULs and 50 MB lines in a harness's error, stderr, trajectory and
    protocol channel: the batch is stored (Parquet), each rollout recorded, the honest one
    beside them untouched."""
    import sys

    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.core.rollouts import RolloutRequest
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.harness.model import Harness
    from milo_ray.store import ParquetRunStore
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hostile import make_secret_task

    key_env, key = "MILO_STORABLE_TEST_KEY", "sk-storable-0123456789"
    monkeypatch.setenv(key_env, key)
    make_secret_task(tmp_path / "tasks")
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    tasks = {t.task_id: t for t in suite.tasks("test")}
    harnesses = {name: Harness.from_source(src, name=name) for name, src in
                 (("steps", _STEPS_AGENT), ("raises", _RAISES), ("floods", _FLOODS), ("calls", _CALLS))}
    store = ParquetRunStore(tmp_path / "run")
    with ScriptedOpenAIServer(lambda body: reply("done", prompt_tokens=7, completion_tokens=2)) as srv:
        executor = {"_target_": "milo_ray.execution.agent_executor.AgentExecutor",
                    "model": {"solver": "openai/scripted", "api_base": srv.url, "api_key_env": key_env,
                              "max_retries": 0},
                    "sandbox": {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}}
        sched = RolloutScheduler(executor, tasks, store, "openai/scripted", "storable", progress=False,
                                 worker_env={key_env: key})
        try:
            for h in harnesses.values():
                sched.add_harness(h)
            results = sched.run([RolloutRequest(h.harness_id, "secret", 0, seed=1) for h in harnesses.values()])
        finally:
            sched.close()
    got = dict(zip(harnesses, results))
    store.close()
    store = ParquetRunStore(tmp_path / "run")
    try:
        rows = {r["harness_id"]: r for r in store.read("rollouts").to_pylist()}
        assert set(rows) == {h.harness_id for h in harnesses.values()}
        raised = rows[harnesses["raises"].harness_id]
        assert raised["error_kind"] == "harness" and "cannot open caf\\xe9.txt\\x00 \ufffd" in raised["error"]
        stderr = store.get_blob(raised["trace_ref"])["trajectory"]["harness_stderr"]
        assert "tail \ufffd\ufffd \\x00 raw" in stderr and len(stderr) < 10_000
        flooded = rows[harnesses["floods"].harness_id]
        assert flooded["error_kind"] == "harness" and "trajectory protocol" in flooded["error"]
        steps = rows[harnesses["steps"].harness_id]
        assert steps["error_kind"] is None, steps["error"]
        text = json.dumps(store.get_blob(steps["trace_ref"])["trajectory"]["steps"], ensure_ascii=False)
        assert "wrote r\\\\xe9sum\\\\xe9.txt \\\\x00 and \ufffd" in text and "characters cut" in text
        called = rows[harnesses["calls"].harness_id]
        assert called["error_kind"] is None and called["input_tokens"] == 7
        assert got["calls"].error_kind is None
    finally:
        store.close()
