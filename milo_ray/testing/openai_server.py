"""A local OpenAI-compatible chat-completions server with scripted answers, for tests
of everything that talks to a model through litellm and langchain.

Nothing in the product is mocked: litellm's ``openai/`` provider sends real HTTP
requests to this server, which answers from a script (text or tool calls, with usage
fields) and can answer with an HTTP error first (429, 500) to exercise retries. A
request with ``"stream": true`` is answered as server-sent events (the reply's text in
chunks, its usage in the last chunk). A reply can also break the transport the way a
real provider does (``fault``: a connection dropped mid-body, a stream cut mid-message,
an empty or truncated JSON body; :mod:`milo_ray.testing.fault_server` names them all).
Every request body is recorded.

    with ScriptedOpenAIServer([reply("hello", prompt_tokens=12, completion_tokens=3)]) as srv:
        model = ChatLiteLLM(model="openai/scripted", api_base=srv.url, api_key="x")
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # Hydra is not installed where the Harbor integration's tests run this server
    from milo_ray.config.schemas import ModelConfig


@dataclass
class Reply:
    """One scripted answer: an HTTP ``status`` other than 200 answers with an error body
    (and is not counted as an answer); ``delay_s`` sleeps before answering; ``headers``
    are sent with it (e.g. ``Retry-After`` on a 429).

    ``fault`` breaks the answer on the wire (the reply is then not counted as answered,
    except ``stream_cut``, whose usage a provider bills although the client never saw it):
    ``drop_mid_body`` sends the headers and half the body, then closes the connection;
    ``empty_body`` a 200 with no body; ``truncated_json`` a 200 whose JSON stops halfway;
    ``stream_cut`` (streamed requests) sends half the chunks, then closes without the
    final chunk or ``[DONE]``."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    fault: str | None = None


FAULTS = ("drop_mid_body", "empty_body", "truncated_json", "stream_cut")


def reply(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> Reply:
    return Reply(content=content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def tool_call(name: str, arguments: dict[str, Any], *, prompt_tokens: int = 10, completion_tokens: int = 5,
              call_id: str = "call_1") -> Reply:
    return Reply(tool_calls=[{"id": call_id, "type": "function",
                              "function": {"name": name, "arguments": json.dumps(arguments)}}],
                 prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


# The environment variable the tests' scripted model reads its (fake) key from.
SCRIPTED_KEY_ENV = "OPENAI_API_KEY_FOR_TESTS"


def scripted_model(url: str, **settings: Any) -> ModelConfig:
    """A checked solver config for ``openai/scripted`` at ``url`` (a ScriptedOpenAIServer's),
    keyed by SCRIPTED_KEY_ENV; ``settings`` are further ModelConfig fields."""
    from milo_ray.config.schemas import ModelConfig

    return ModelConfig(solver="openai/scripted", api_base=url, api_key_env=SCRIPTED_KEY_ENV, **settings).check()


def run_cli_against(url: str, cwd: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess,
                                                                                      Path]:
    """``python -m milo_ray.run ARGS`` from ``cwd`` in bwrap, its solver ``openai/solver`` at
    ``url`` (a ScriptedOpenAIServer's), the run in ``cwd/run``: (the finished process, the
    run directory). The run starts outside the checkout, so the package is put on its path
    wherever it is installed; a caller's private ``RAY_TMPDIR`` is kept."""
    import os
    import sys

    repo = Path(__file__).resolve().parents[2]
    run_dir = cwd / "run"
    env = {**os.environ, "SCRIPTED_KEY": "local", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1",
           "RAY_TMPDIR": os.environ.get("RAY_TMPDIR", str(cwd / "ray")),
           "PYTHONPATH": os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])}
    argv = [sys.executable, "-m", "milo_ray.run", *args, "model=litellm", "model.solver=openai/solver",
            f"model.api_base={url}", "model.api_key_env=SCRIPTED_KEY", "sandbox=bwrap", f"run.dir={run_dir}",
            "run.progress=false", "run.report=false", "execution.num_cpus=2"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env), run_dir


def error(status: int, *, retry_after: float | None = None) -> Reply:
    """An HTTP error answer; ``retry_after`` (seconds) is sent as the ``Retry-After`` header."""
    return Reply(status=status, headers={} if retry_after is None else {"Retry-After": f"{retry_after:g}"})


class ScriptedOpenAIServer:
    """Serves ``script`` in order on ``POST /v1/chat/completions``; the last reply is
    repeated once the script is used up. ``requests`` holds every request body and
    ``request_times`` the ``time.monotonic()`` at which each arrived.

    ``script`` may instead be a function from the request body to a :class:`Reply`: the
    answer then depends on the conversation, not on arrival order, which is what many
    concurrent agent runs against one server need."""

    def __init__(self, script: list[Reply] | Callable[[dict[str, Any]], Reply], *, model: str = "scripted") -> None:
        if not callable(script) and not script:
            raise ValueError("ScriptedOpenAIServer: the script needs at least one reply")
        self.responder = script if callable(script) else None
        self.script, self.model = ([] if callable(script) else list(script)), model
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header (the key it carried)
        self.request_times: list[float] = []
        self._next = 0
        self.answered: list[Reply] = []  # replies served with HTTP 200 (their usage is what a client was billed)
        self.answered_models: list[str | None] = []  # the requested model of each answered reply
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> "ScriptedOpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.request_times.append(time.monotonic())
            self._next += 1
            if self.responder is not None:
                return self.responder(body)
            return self.script[min(self._next - 1, len(self.script) - 1)]

    def billed_by_model(self) -> dict[str | None, tuple[int, int]]:
        """(prompt, completion) tokens answered per requested model name (the model string
        without its provider prefix, as litellm sends it)."""
        out: dict[str | None, tuple[int, int]] = {}
        with self._lock:
            for m, r in zip(self.answered_models, self.answered):
                p, c = out.get(m, (0, 0))
                out[m] = (p + r.prompt_tokens, c + r.completion_tokens)
        return out

    def _bill(self, r: Reply, body: dict[str, Any]) -> None:
        with self._lock:
            self.answered.append(r)
            self.answered_models.append(body.get("model"))

    def _answer(self, r: Reply, body: dict[str, Any]) -> dict[str, Any]:
        self._bill(r, body)
        return self._completion(r)

    def _completion(self, r: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": r.content}
        if r.tool_calls:
            message["tool_calls"] = r.tool_calls
        return {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if r.tool_calls else "stop"}],
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                      "total_tokens": r.prompt_tokens + r.completion_tokens},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout): expected
                    self.close_connection = True

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                server.authorizations.append(self.headers.get("Authorization"))
                r = server._take(body)
                if r.fault is not None and r.fault not in FAULTS:
                    raise ValueError(f"Reply.fault={r.fault!r}: expected one of {FAULTS}")
                if r.delay_s:
                    time.sleep(r.delay_s)
                if r.status != 200:
                    self._send(r.status, {"error": {"message": f"scripted HTTP {r.status}", "type": "server_error",
                                                    "code": r.status}}, r.headers)
                    return
                if body.get("stream"):
                    self._stream(r, body)
                    return
                if r.fault == "empty_body":
                    self._send_bytes(200, b"", r.headers)
                    return
                data = json.dumps(server._completion(r)).encode()
                if r.fault == "truncated_json":
                    self._send_bytes(200, data[: len(data) // 2], r.headers)
                    return
                if r.fault == "drop_mid_body":
                    self._send_bytes(200, data[: len(data) // 2], r.headers, length=len(data))
                    self.close_connection = True
                    return
                server._bill(r, body)
                self._send_bytes(200, data, r.headers)

            def _stream(self, r: Reply, body: dict[str, Any]) -> None:
                """Server-sent chunks: the text a few characters at a time, then a chunk
                with the usage (the provider's ``include_usage``), then ``[DONE]``."""
                text = r.content or ""
                pieces = [text[i:i + 8] for i in range(0, len(text), 8)] or [""]
                base = {"id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion.chunk",
                        "created": int(time.time()), "model": server.model}
                events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": p}
                                                if i == 0 else {"content": p}, "finish_reason": None}]}
                          for i, p in enumerate(pieces)]
                if r.tool_calls:
                    events.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                        {"index": k, **tc} for k, tc in enumerate(r.tool_calls)]}, "finish_reason": None}]})
                events.append({**base, "choices": [{"index": 0, "delta": {},
                                                    "finish_reason": "tool_calls" if r.tool_calls else "stop"}]})
                events.append({**base, "choices": [], "usage": {
                    "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                    "total_tokens": r.prompt_tokens + r.completion_tokens}})
                # A cut stream was still generated, and billed, by the provider.
                server._bill(r, body)
                if r.fault == "stream_cut":
                    events = events[: max(1, len(events) // 2)]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                for k, v in r.headers.items():
                    self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                for e in events:
                    self.wfile.write(b"data: " + json.dumps(e).encode() + b"\n\n")
                    self.wfile.flush()
                if r.fault != "stream_cut":
                    self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                self._send_bytes(status, json.dumps(payload).encode(), headers or {})

            def _send_bytes(self, status: int, data: bytes, headers: dict[str, str], *,
                            length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()
                self.wfile.write(data)

        return Handler
