"""The harness process's chat model and start-up: the gateway client speaks OpenAI chat
completions with ChatLiteLLM's interface (tools, structured output, streaming, errors),
the process imports neither litellm nor the framework's store before its job, and the
runtime code copy carries current bytecode."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from langchain_core.tools import tool
from pydantic import BaseModel

from milo_ray.core.failures import is_endpoint_error
from milo_ray.boundary.inside.model import GatewayChatModel
from milo_ray.boundary.sandbox.runtime_code import cleanup_runtime_code, runtime_code_dir
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, error, reply, tool_call


@tool
def bash(command: str) -> str:
    """Run a shell command."""
    return command


def _model(srv) -> GatewayChatModel:
    return GatewayChatModel(model="openai/solver", api_base=srv.url, api_key="rollout-token", temperature=0.2)


def test_tool_calls_usage_and_the_request_as_chatlitellm_sends_it():
    with ScriptedOpenAIServer([tool_call("bash", {"command": "ls"}, prompt_tokens=7, completion_tokens=3)]) as srv:
        message = asyncio.run(_model(srv).bind_tools([bash], tool_choice="any").ainvoke("list the files"))
    assert message.tool_calls == [{"name": "bash", "args": {"command": "ls"}, "id": "call_1", "type": "tool_call"}]
    assert message.usage_metadata == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    body = srv.requests[0]
    assert body["tool_choice"] == "required" and body["tools"][0]["function"]["name"] == "bash"
    assert body["model"] == "openai/solver" and body["temperature"] == 0.2
    assert body["messages"] == [{"role": "user", "content": "list the files"}]


def test_a_tool_call_whose_arguments_do_not_parse_is_invalid_not_empty():
    bad = Reply(tool_calls=[{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{oops"}}])
    with ScriptedOpenAIServer([bad]) as srv:
        message = _model(srv).bind_tools([bash]).invoke("go")
    assert message.tool_calls == [] and message.invalid_tool_calls[0]["args"] == "{oops"
    assert message.invalid_tool_calls[0]["error"].startswith("the arguments are not valid JSON: Expecting")


def test_the_next_turn_carries_the_tool_call_and_its_result():
    with ScriptedOpenAIServer([reply("done")]) as srv:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        history = [HumanMessage("go"), AIMessage("", tool_calls=[{"name": "bash", "args": {"command": "ls"},
                                                                   "id": "c1"}],
                                                 additional_kwargs={"reasoning_content": "think"}),
                   ToolMessage("a b", tool_call_id="c1")]
        _model(srv).invoke(history)
    sent = srv.requests[0]["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "bash", "arguments": json.dumps({"command": "ls"})}
    assert sent[1]["reasoning_content"] == "think"
    assert sent[2] == {"role": "tool", "content": "a b", "tool_call_id": "c1"}


def test_the_next_turn_carries_an_unparseable_tool_call_as_it_was_sent():
    # langchain's agent answers such a call with an error tool message; a provider refuses
    # a tool message whose call is missing from the assistant message before it.
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    cut = {"name": "bash", "args": '{"command": "l', "id": "c2", "error": None, "type": "invalid_tool_call"}
    history = [HumanMessage("go"), AIMessage("", tool_calls=[{"name": "bash", "args": {"command": "ls"}, "id": "c1"}],
                                             invalid_tool_calls=[cut]),
               ToolMessage("a b", tool_call_id="c1"), ToolMessage("malformed", tool_call_id="c2", status="error")]
    with ScriptedOpenAIServer([reply("done")]) as srv:
        _model(srv).invoke(history)
    sent = srv.requests[0]["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["c1", "c2"]
    assert sent[1]["tool_calls"][1]["function"] == {"name": "bash", "arguments": '{"command": "l'}


def test_a_gateway_refusal_is_an_endpoint_error_with_its_message():
    with ScriptedOpenAIServer([error(429)]) as srv:
        with pytest.raises(httpx.HTTPStatusError, match="429: scripted HTTP 429") as info:
            _model(srv).invoke("go")
    assert is_endpoint_error(info.value)


class Verdict(BaseModel):
    passed: bool
    reason: str


def test_structured_output_by_json_schema_and_by_function_calling():
    with ScriptedOpenAIServer([reply(json.dumps({"passed": True, "reason": "ok"})),
                               tool_call("Verdict", {"passed": False, "reason": "no"})]) as srv:
        m = _model(srv)
        assert m.with_structured_output(Verdict).invoke("grade") == Verdict(passed=True, reason="ok")
        assert m.with_structured_output(Verdict, method="function_calling").invoke("grade") == \
            Verdict(passed=False, reason="no")
    assert srv.requests[0]["response_format"]["json_schema"]["name"] == "Verdict"
    assert srv.requests[1]["tools"][0]["function"]["name"] == "Verdict"


def _sse_server(events: list[dict]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for e in events:
                self.wfile.write(b"data: " + json.dumps(e).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_streaming_assembles_text_tool_calls_and_usage():
    def chunk(delta, finish=None, usage=None):
        return {"id": "s1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **({"usage": usage} if usage else {})}

    events = [chunk({"content": "Hel"}), chunk({"content": "lo"}),
              chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "bash", "arguments": "{\"comm"}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": "and\": \"ls\"}"}}]}, finish="tool_calls"),
              {"id": "s1", "model": "m", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}]
    srv = _sse_server(events)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
        m = GatewayChatModel(model="x", api_base=url, api_key="t", streaming=True)
        message = asyncio.run(m.ainvoke("hi"))
        chunks = list(GatewayChatModel(model="x", api_base=url, api_key="t").stream("hi"))
    finally:
        srv.shutdown()
        srv.server_close()
    assert message.content == "Hello"
    assert message.tool_calls == [{"name": "bash", "args": {"command": "ls"}, "id": "c1", "type": "tool_call"}]
    assert message.usage_metadata["input_tokens"] == 4 and message.usage_metadata["output_tokens"] == 2
    assert "".join(c.content for c in chunks) == "Hello"


def test_the_harness_process_imports_neither_litellm_nor_the_store_before_its_job():
    """What a warm process has loaded when it says ready (litellm alone is seconds of CPU)."""
    code = ("import sys; from milo_ray.boundary.inside.harness_process import preimport, warm_up; preimport(); "
            "warm_up(); print(sorted(m for m in sys.modules if m.split('.')[0] in ('litellm', 'langchain_litellm', "
            "'pyarrow', 'openai') or m.startswith('milo_ray.store') or m.startswith('milo_ray.agents')))")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(_root())!r}); {code}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_runtime_code_copy_carries_current_bytecode():
    cleanup_runtime_code()
    try:
        root = runtime_code_dir()
        sources = [p for p in (root / "milo_ray").rglob("*.py")]
        assert sources
        for src in sources:
            pyc = Path(importlib.util.cache_from_source(str(src)))
            data, st = pyc.read_bytes(), src.stat()
            assert data[:4] == importlib.util.MAGIC_NUMBER, src
            # What the interpreter checks before it uses a .pyc instead of compiling.
            assert int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF, src
            assert int.from_bytes(data[12:16], "little") == st.st_size & 0xFFFFFFFF, src
    finally:
        cleanup_runtime_code()


def _root() -> Path:
    import milo_ray

    return Path(milo_ray.__file__).resolve().parent.parent
