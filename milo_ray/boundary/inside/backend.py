"""What the harness process is given inside its sandbox, besides its chat model.

* :class:`SandboxShell`: the ``backend`` passed to ``build_agent(model, backend)``, a
  deepagents sandbox backend whose commands run right here, in the sandbox the harness
  process itself runs in (same filesystem, same namespaces, same user), each with the
  sandbox's per-command timeout and output cap and its own process group. It replaces
  the host-side sandbox object the harness used to get: nothing it holds reaches outside.
* :class:`GatewayRelay`: a loopback TCP listener that pipes every connection to the
  model gateway's Unix socket bound into the sandbox, so an ordinary HTTP client the
  harness builds from its chat model's ``api_base`` reaches the gateway at
  ``http://127.0.0.1:PORT/v1`` in a network namespace that has nothing else. The chat
  model itself does not use it: it speaks to the socket directly.

Runs inside the sandbox: imports only the standard library, deepagents' protocol types
and the sandbox's process runner.
"""

from __future__ import annotations

import os
import posixpath
import socket
import threading
import uuid
from typing import Any

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from milo_ray.boundary.sandbox.base import resolve_timeout
from milo_ray.boundary.sandbox.process import run_capped


class SandboxShell(BaseSandbox):
    """See the module docstring. ``timeout_s``: default per-command timeout; ``env``:
    the commands' environment (the sandbox's, without anything of the harness process).
    ``task_tools``: the task's own tools, for a task whose world lives on the host (an
    ARE scenario's app tools, :mod:`milo_ray.boundary.inside.task_tools`); empty for a
    task the shell and files are enough for. A harness adds them to its agent's tools."""

    def __init__(self, *, workdir: str, env: dict[str, str], timeout_s: float | None, output_cap_bytes: int,
                 task_tools: list[Any] | None = None) -> None:
        self.task_tools: list[Any] = list(task_tools or [])
        self._id = f"sandbox-{uuid.uuid4().hex[:12]}"
        self.workdir, self._env = workdir, dict(env)
        self._timeout_s, self._cap = timeout_s, int(output_cap_bytes)
        self._shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"

    @property
    def id(self) -> str:
        return self._id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        timeout_s = resolve_timeout(timeout, self._timeout_s)
        run = run_capped([self._shell, "-c", command], timeout_s=timeout_s, output_cap_bytes=self._cap,
                         env=self._env, cwd=self.workdir)
        if run.timed_out:
            note = f"\nError: command timed out after {timeout_s:g} seconds and was killed.\n"
            return ExecuteResponse(output=run.output + note, exit_code=124, truncated=run.truncated)
        return ExecuteResponse(output=run.output, exit_code=run.exit_code, truncated=run.truncated)

    def _path(self, path: str) -> str | None:
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            return None
        return posixpath.normpath(path)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, content in files:
            p = self._path(path)
            if p is None:
                out.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            try:
                if os.path.isdir(p):
                    out.append(FileUploadResponse(path=path, error="is_directory"))
                    continue
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(content)
                out.append(FileUploadResponse(path=path, error=None))
            except PermissionError:
                out.append(FileUploadResponse(path=path, error="permission_denied"))
            except OSError:
                out.append(FileUploadResponse(path=path, error="invalid_path"))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            p = self._path(path)
            if p is None:
                out.append(FileDownloadResponse(path=path, content=None, error="invalid_path"))
            elif os.path.isdir(p):
                out.append(FileDownloadResponse(path=path, content=None, error="is_directory"))
            elif not os.path.isfile(p):
                out.append(FileDownloadResponse(path=path, content=None, error="file_not_found"))
            else:
                try:
                    with open(p, "rb") as f:
                        out.append(FileDownloadResponse(path=path, content=f.read(), error=None))
                except PermissionError:
                    out.append(FileDownloadResponse(path=path, content=None, error="permission_denied"))
        return out


class GatewayRelay:
    """Loopback TCP -> the gateway's Unix socket, one pair of pump threads per connection."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="gateway-relay", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                upstream.connect(self.socket_path)
            except OSError:
                client.close()
                continue
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()


def _pipe(a: Any, b: Any) -> None:
    """Copy bytes both ways until both sides closed; then close both."""
    import selectors

    sel = selectors.DefaultSelector()
    peer = {a: b, b: a}
    open_reads = {a, b}
    for s in open_reads:
        sel.register(s, selectors.EVENT_READ)
    try:
        while open_reads:
            for key, _ in sel.select():
                src = key.fileobj
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if data:
                    try:
                        peer[src].sendall(data)
                        continue
                    except OSError:
                        return
                sel.unregister(src)
                open_reads.discard(src)
                try:
                    peer[src].shutdown(socket.SHUT_WR)
                except OSError:
                    pass
    finally:
        sel.close()
        a.close()
        b.close()
