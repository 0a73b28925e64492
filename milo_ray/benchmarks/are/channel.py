"""The host side of a rollout's tool channel: a Unix socket, made for one rollout in the
directory bound into its sandbox, through which the harness calls the scenario's app
tools and waits for notifications. The scenario's environment (its apps' state, its event
loop, its judge) stays in the host process that serves this socket; the harness sees only
the answers.

One JSON object per line each way, at most :data:`LINE_CAP` bytes a line:

* ``{"op": "tools"}`` -> ``{"ok": true, "tools": [{"name", "description", "parameters"}]}``
* ``{"op": "call", "name": N, "args": {...}}`` -> ``{"ok": true, "result": "..."}`` or
  ``{"ok": false, "error": "..."}`` (a tool's own exception is an answer, not a crash)
* ``{"op": "wait", "timeout_s": S}`` -> ``{"ok": true, "notifications": ["...", ...]}``

What is served is exactly the provider's tool list: a name not in it, an argument not
among its parameters, a non-object ``args`` or an oversized line is refused with its
reason, so the channel is no way to reach any other attribute of the environment.
Standard library only: it runs under ARE's interpreter.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
from typing import Any, Protocol

LINE_CAP = 1 << 20
RESULT_CAP = 64_000
MAX_WAIT_S = 3600.0


class ToolProvider(Protocol):
    """What the channel serves: the scenario's tools and its notifications."""

    def tools(self) -> list[dict[str, Any]]:
        """Each ``{"name", "description", "parameters"}`` (a JSON Schema object)."""
        ...

    def call(self, name: str, args: dict[str, Any]) -> str:
        """Run tool ``name``; its result as text. May raise: the caller answers the error."""
        ...

    def wait(self, timeout_s: float) -> list[str]:
        """The notifications (user messages, environment events) that arrive within
        ``timeout_s`` seconds (simulated time may jump ahead while waiting)."""
        ...


def answer(provider: ToolProvider, line: bytes) -> dict[str, Any]:
    """The answer to one request line (module docstring); never raises."""
    if len(line) > LINE_CAP:
        return {"ok": False, "error": f"request longer than {LINE_CAP} bytes"}
    try:
        req = json.loads(line)
    except ValueError:
        return {"ok": False, "error": "request is not JSON"}
    if not isinstance(req, dict):
        return {"ok": False, "error": "request is not a JSON object"}
    op = req.get("op")
    try:
        if op == "tools":
            return {"ok": True, "tools": provider.tools()}
        if op == "call":
            name, args = req.get("name"), req.get("args", {})
            spec = next((t for t in provider.tools() if t["name"] == name), None)
            if spec is None:
                return {"ok": False, "error": f"no tool named {str(name)[:200]!r}"}
            if not isinstance(args, dict):
                return {"ok": False, "error": "args: a JSON object of the tool's parameters"}
            allowed = set(spec["parameters"].get("properties", {}))
            extra = sorted(str(k)[:100] for k in args if k not in allowed)
            if extra:
                return {"ok": False, "error": f"{name}: no parameter(s) {extra}; it takes {sorted(allowed)}"}
            missing = sorted(k for k in spec["parameters"].get("required", []) if k not in args)
            if missing:
                return {"ok": False, "error": f"{name}: missing parameter(s) {missing}"}
            try:
                result = provider.call(name, args)
            except Exception as exc:  # the tool's own failure is the agent's to see
                return {"ok": False, "error": f"{name} raised {type(exc).__name__}: {str(exc)[:2000]}"}
            return {"ok": True, "result": str(result)[:RESULT_CAP]}
        if op == "wait":
            timeout = req.get("timeout_s", 60)
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= MAX_WAIT_S:
                return {"ok": False, "error": f"timeout_s: a number of seconds in [0, {MAX_WAIT_S:g}]"}
            return {"ok": True, "notifications": [str(n)[:RESULT_CAP] for n in provider.wait(float(timeout))]}
    except Exception as exc:  # the environment failed: the agent sees a refusal, the host keeps serving
        return {"ok": False, "error": f"the environment failed on {op}: {type(exc).__name__}"}
    return {"ok": False, "error": f"op: one of tools, call, wait (got {str(op)[:50]!r})"}


class ToolChannel:
    """Serves ``provider`` on the Unix socket ``path`` (made 0600 unless ``mode`` says
    otherwise) from a thread until :meth:`close`. Calls are answered one at a time, in
    arrival order: the environment is not thread-safe."""

    def __init__(self, provider: ToolProvider, path: str, mode: int = 0o600) -> None:
        lock = threading.Lock()

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while True:
                    line = self.rfile.readline(LINE_CAP + 1)
                    if not line:
                        return
                    if len(line) > LINE_CAP and not line.endswith(b"\n"):
                        self.wfile.write(json.dumps({"ok": False, "error": f"request longer than {LINE_CAP} "
                                                     "bytes"}).encode() + b"\n")
                        return
                    with lock:
                        reply = answer(provider, line)
                    self.wfile.write(json.dumps(reply).encode() + b"\n")

        # Bound through the directory's descriptor: a socket address holds 107 bytes, and
        # the rollout's directory may be deeper than that leaves room for.
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        old = os.umask(0o177)
        try:
            self._server = socketserver.ThreadingUnixStreamServer(
                f"/proc/self/fd/{fd}/{os.path.basename(path)}", Handler)
        finally:
            os.umask(old)
            os.close(fd)
        os.chmod(path, mode)
        self._server.daemon_threads = True
        self.path = path
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
