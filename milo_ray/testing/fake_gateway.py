"""A stand-in for the host-side model gateway in tests: it issues per-call tokens, refuses
any other (or a revoked) token with HTTP 401, and forwards accepted OpenAI-style requests to
a :class:`~milo_ray.testing.openai_server.ScriptedOpenAIServer`. It implements
:class:`milo_ray.agents.mutators.cli_sandbox.ModelGateway`."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeGateway:
    """``upstream``: the scripted server's base URL (``.../v1``). ``calls`` holds
    (token, path) of every accepted request, ``refused`` those refused."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.issued: dict[str, tuple[str, str]] = {}  # token -> (role, caller)
        self.revoked: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.refused: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    # --- ModelGateway ---------------------------------------------------------------
    def base_url(self, api: str) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/{api}/v1"

    def issue_token(self, *, role: str, caller: str) -> str:
        token = f"gw-{uuid.uuid4().hex}"
        with self._lock:
            self.issued[token] = (role, caller)
        return token

    def revoke_token(self, token: str) -> None:
        with self._lock:
            self.revoked.add(token)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeGateway":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- HTTP ------------------------------------------------------------------------
    def _accepts(self, token: str) -> bool:
        with self._lock:
            return token in self.issued and token not in self.revoked

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                auth = self.headers.get("Authorization", "")
                token = auth[7:] if auth.startswith("Bearer ") else self.headers.get("x-api-key", "")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not gw._accepts(token):
                    with gw._lock:
                        gw.refused.append((token, self.path))
                    self._send(401, json.dumps({"error": {"message": "unknown or revoked token"}}).encode())
                    return
                with gw._lock:
                    gw.calls.append((token, self.path))
                tail = self.path.split("/v1", 1)[-1]
                req = urllib.request.Request(gw.upstream + tail, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        self._send(resp.status, resp.read())
                except urllib.error.HTTPError as e:
                    self._send(e.code, e.read())

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
