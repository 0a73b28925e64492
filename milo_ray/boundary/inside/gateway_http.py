"""The chat model's own HTTP/1.1 exchange with the model gateway over the rollout's Unix
socket: one request shape (POST a JSON body, read the whole answer) on one kept-alive
connection per event loop (and one for blocking calls).

Why not httpx here: its general-purpose stack (client, httpcore, anyio, h11) costs about
0.7 ms of CPU per call, most of what the sandbox side adds to a model call; this exchange
costs under 0.1 ms (``scripts/bench_sandbox.py --only call_overhead``). Streaming calls
still go through httpx (their answer arrives in pieces). Failures are httpx's exceptions,
so a caller (and :func:`milo_ray.core.failures.is_endpoint_error`) sees the same errors
either way: :class:`httpx.ConnectError`, :class:`httpx.ReadTimeout`,
:class:`httpx.RemoteProtocolError`, ...

Runs inside the sandbox: the standard library and httpx's exception types only.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import weakref
from typing import Any

import httpx

# An answer's head larger than this is not the gateway's.
_MAX_HEAD = 64 * 1024


class Answer:
    """One answer: status, headers (lower-cased names) and the whole body."""

    __slots__ = ("status", "headers", "content")

    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status, self.headers, self.content = status, headers, content

    def response(self, url: str) -> httpx.Response:
        """The answer as an httpx response (what a failed call's exception carries)."""
        return httpx.Response(self.status, headers=self.headers, content=self.content,
                              request=httpx.Request("POST", url))


def request_bytes(path: str, host: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items()),
             f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """Status, headers and whether the connection stays open after this answer."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"the model gateway answered with a malformed status line {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep = "keep-alive" in connection if parts[0] == "HTTP/1.0" else "close" not in connection
    return int(parts[1]), headers, keep


class AsyncGatewayHTTP:
    """Keeps one connection per event loop (a connection belongs to the loop that made it)."""

    def __init__(self, socket_path: str, timeout_s: float) -> None:
        self.socket_path, self.timeout_s = socket_path, timeout_s
        self._conns: Any = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    async def post(self, path: str, host: str, headers: dict[str, str], body: bytes) -> Answer:
        loop = asyncio.get_running_loop()
        with self._lock:
            conn = self._conns.pop(loop, None)
        if conn is not None and (conn[0].at_eof() or conn[1].is_closing()):
            conn[1].close()  # the gateway closed it while idle
            conn = None
        if conn is not None:
            try:
                return await self._post(loop, conn, path, host, headers, body)
            except _Unanswered:
                pass  # a kept connection the gateway closed as this request went out: it was not read
        try:
            return await self._post(loop, None, path, host, headers, body)
        except _Unanswered:
            raise httpx.RemoteProtocolError("the model gateway closed the connection without answering") from None

    async def _post(self, loop: Any, conn: Any, path: str, host: str, headers: dict[str, str],
                    body: bytes) -> Answer:
        try:
            if conn is None:
                conn = await self._op(asyncio.open_unix_connection(self.socket_path), httpx.ConnectTimeout)
            reader, writer = conn
            writer.write(request_bytes(path, host, headers, body))
            await self._op(writer.drain(), httpx.WriteTimeout, unanswered=True)
            head = await self._op(reader.readuntil(b"\r\n\r\n"), httpx.ReadTimeout, unanswered=True)
            status, answer_headers, keep = parse_head(head[:-4])
            content = await self._body(reader, answer_headers)
        except BaseException:
            if conn is not None:
                conn[1].close()
            raise
        if keep and not reader.at_eof():
            with self._lock:
                self._conns.setdefault(loop, conn)  # another call on this loop may have put one back
                if self._conns[loop] is not conn:
                    writer.close()
        else:
            writer.close()
        return Answer(status, answer_headers, content)

    async def _op(self, awaitable: Any, timeout_error: type[httpx.TimeoutException], unanswered: bool = False) -> Any:
        try:
            # asyncio.timeout, not wait_for: no task per operation.
            async with asyncio.timeout(self.timeout_s):
                return await awaitable
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as exc:
            if unanswered and not getattr(exc, "partial", b""):
                raise _Unanswered() from None
            raise httpx.RemoteProtocolError("the model gateway closed the connection mid-answer") from None
        except TimeoutError:
            raise timeout_error(f"the model gateway did not answer within {self.timeout_s:g} s") from None
        except (FileNotFoundError, ConnectionRefusedError, PermissionError) as exc:
            raise httpx.ConnectError(f"cannot reach the model gateway at {self.socket_path}: {exc}") from None
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError("the model gateway's answer head is too long") from None
        except OSError as exc:
            raise httpx.ReadError(f"the connection to the model gateway failed: {exc}") from None

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while True:
                size_line = await self._op(reader.readuntil(b"\r\n"), httpx.ReadTimeout)
                size = _chunk_size(size_line)
                if size == 0:
                    while await self._op(reader.readuntil(b"\r\n"), httpx.ReadTimeout) != b"\r\n":
                        pass  # trailers
                    return b"".join(parts)
                parts.append(await self._op(reader.readexactly(size + 2), httpx.ReadTimeout))
                parts[-1] = parts[-1][:-2]
        if "content-length" in headers:
            return await self._op(reader.readexactly(_length(headers)), httpx.ReadTimeout)
        return await self._op(reader.read(), httpx.ReadTimeout)  # delimited by the close


class _Unanswered(Exception):
    """The connection ended before a byte of the answer came back."""


class GatewayHTTP:
    """The blocking twin of :class:`AsyncGatewayHTTP`: one connection, one call at a time."""

    def __init__(self, socket_path: str, timeout_s: float) -> None:
        self.socket_path, self.timeout_s = socket_path, timeout_s
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def post(self, path: str, host: str, headers: dict[str, str], body: bytes) -> Answer:
        with self._lock:
            sock, self._sock = self._sock, None
            if sock is not None and _closed_by_peer(sock):
                sock.close()  # the gateway closed it while idle
                sock = None
            if sock is not None:
                try:
                    return self._post(sock, path, host, headers, body)
                except _Unanswered:
                    pass  # a kept connection the gateway closed as this request went out: it was not read
            try:
                return self._post(None, path, host, headers, body)
            except _Unanswered:
                raise httpx.RemoteProtocolError("the model gateway closed the connection without answering") from None

    def _post(self, sock: socket.socket | None, path: str, host: str, headers: dict[str, str],
              body: bytes) -> Answer:
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(self.socket_path)
            except socket.timeout:
                sock.close()
                raise httpx.ConnectTimeout(f"the model gateway did not answer within {self.timeout_s:g} s") from None
            except OSError as exc:
                sock.close()
                raise httpx.ConnectError(f"cannot reach the model gateway at {self.socket_path}: {exc}") from None
        try:
            stream = sock.makefile("rb")
            try:
                try:
                    sock.sendall(request_bytes(path, host, headers, body))
                except (BrokenPipeError, ConnectionResetError):
                    raise _Unanswered() from None
                status, answer_headers, keep = parse_head(_read_head(stream))
                content = _read_body(stream, answer_headers)
            finally:
                stream.close()
        except socket.timeout:
            sock.close()
            raise httpx.ReadTimeout(f"the model gateway did not answer within {self.timeout_s:g} s") from None
        except OSError as exc:
            sock.close()
            raise httpx.ReadError(f"the connection to the model gateway failed: {exc}") from None
        except BaseException:
            sock.close()
            raise
        delimited = "content-length" in answer_headers or "chunked" in answer_headers.get("transfer-encoding", "")
        if keep and delimited:
            self._sock = sock
        else:
            sock.close()
        return Answer(status, answer_headers, content)


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle kept connection that is readable was closed (or sent what no request asked
    for): either way it is not reused. (select, not a non-blocking recv: a socket with a
    timeout waits for it even then.)"""
    import select

    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _read_head(stream: Any) -> bytes:
    lines = []
    size = 0
    while True:
        try:
            line = stream.readline(_MAX_HEAD)
        except ConnectionResetError:
            line = b""
        if not line:
            if not lines:
                raise _Unanswered()
            raise httpx.RemoteProtocolError("the model gateway closed the connection mid-answer")
        if line in (b"\r\n", b"\n"):
            return b"".join(lines).rstrip(b"\r\n")
        lines.append(line)
        size += len(line)
        if size > _MAX_HEAD:
            raise httpx.RemoteProtocolError("the model gateway's answer head is too long")


def _read_exactly(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) < n:
        raise httpx.RemoteProtocolError("the model gateway closed the connection mid-answer")
    return data


def _read_body(stream: Any, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = _chunk_size(stream.readline(_MAX_HEAD))
            if size == 0:
                while stream.readline(_MAX_HEAD) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(_read_exactly(stream, size + 2)[:-2])
    if "content-length" in headers:
        return _read_exactly(stream, _length(headers))
    return stream.read()


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise httpx.RemoteProtocolError(f"the model gateway sent a malformed chunk size {line[:40]!r}") from None


def _length(headers: dict[str, str]) -> int:
    try:
        n = int(headers["content-length"])
    except ValueError:
        n = -1
    if n < 0:
        raise httpx.RemoteProtocolError(f"the model gateway sent a malformed Content-Length "
                                        f"{headers['content-length'][:40]!r}")
    return n
