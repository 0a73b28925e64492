"""A local OpenAI-compatible chat-completions server with scripted answers, for tests
of everything that talks to a model through litellm and langchain.

Nothing in the product is mocked: litellm's ``openai/`` provider sends real HTTP
requests to this server, which answers from a script (text or tool calls, with usage
fields) and can answer with an HTTP error first (429, 500) to exercise retries. Every
request body is recorded.

    with ScriptedOpenAIServer([reply("hello", prompt_tokens=12, completion_tokens=3)]) as srv:
        model = ChatLiteLLM(model="openai/scripted", api_base=srv.url, api_key="x")
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Reply:
    """One scripted answer: an HTTP ``status`` other than 200 answers with an error body
    (and is not counted as an answer); ``delay_s`` sleeps before answering."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    status: int = 200
    delay_s: float = 0.0


def reply(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> Reply:
    return Reply(content=content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def tool_call(name: str, arguments: dict[str, Any], *, prompt_tokens: int = 10, completion_tokens: int = 5,
              call_id: str = "call_1") -> Reply:
    return Reply(tool_calls=[{"id": call_id, "type": "function",
                              "function": {"name": name, "arguments": json.dumps(arguments)}}],
                 prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def error(status: int) -> Reply:
    return Reply(status=status)


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

    def _answer(self, r: Reply, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.answered.append(r)
            self.answered_models.append(body.get("model"))
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

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                r = server._take(body)
                if r.delay_s:
                    time.sleep(r.delay_s)
                if r.status != 200:
                    self._send(r.status, {"error": {"message": f"scripted HTTP {r.status}", "type": "server_error",
                                                    "code": r.status}})
                    return
                self._send(200, server._answer(r, body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
