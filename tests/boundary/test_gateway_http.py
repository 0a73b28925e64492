"""The chat model's own exchange over its rollout's gateway socket: it goes over the socket
and nowhere else, sends and reads what it does over HTTP, keeps one connection alive, and
fails with the endpoint errors httpx raises."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time

import httpx
import pytest

from milo_ray.boundary.inside.backend import _pipe
from milo_ray.boundary.inside.model import GatewayChatModel
from milo_ray.core.failures import is_endpoint_error
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, error, reply, tool_call

# Dialling this would be refused (the discard port): a model that reaches its server here
# did so over its socket.
DEAD = "http://127.0.0.1:9/v1"


class SocketToServer:
    """A Unix socket whose connections are piped to a scripted server (as the gateway's
    socket leads to the provider); counts the connections it took."""

    def __init__(self, srv: ScriptedOpenAIServer) -> None:
        self.srv, self.connections = srv, 0
        self.path = os.path.join(tempfile.mkdtemp(prefix="milo-gw-", dir="/tmp"), "gateway.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        host, port = self.srv._server.server_address[:2]
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=_pipe, args=(client, socket.create_connection((host, port))), daemon=True).start()

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def _model(sock: SocketToServer, **kw) -> GatewayChatModel:
    return GatewayChatModel(model="openai/solver", api_base=DEAD, api_key="rollout-token", temperature=0.2,
                            gateway_socket=sock.path, **kw)


def test_over_the_socket_calls_reach_the_gateway_and_nowhere_else():
    with ScriptedOpenAIServer([tool_call("bash", {"command": "ls"}, prompt_tokens=7, completion_tokens=3),
                               reply("done")]) as srv:
        sock = SocketToServer(srv)
        model = _model(sock)
        first = model.invoke("list the files")
        second = model.invoke("again")

        async def twice() -> list:
            return [await model.ainvoke("async"), await model.ainvoke("async again")]

        later = asyncio.run(twice())
        sock.close()
    assert first.tool_calls == [{"name": "bash", "args": {"command": "ls"}, "id": "call_1", "type": "tool_call"}]
    assert first.usage_metadata == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    assert second.content == "done" and [m.content for m in later] == ["done", "done"]
    assert sock.connections == 4  # the scripted server answers HTTP/1.0: one connection per call
    assert srv.authorizations == ["Bearer rollout-token"] * 4
    assert srv.requests[0] == {"model": "openai/solver", "messages": [{"role": "user", "content": "list the files"}],
                               "temperature": 0.2}


def test_over_the_socket_a_gateway_refusal_is_an_endpoint_error_with_its_message():
    with ScriptedOpenAIServer([error(429)]) as srv:
        sock = SocketToServer(srv)
        with pytest.raises(httpx.HTTPStatusError, match="429: scripted HTTP 429") as info:
            _model(sock).invoke("go")
        with pytest.raises(httpx.HTTPStatusError, match="429: scripted HTTP 429") as ainfo:
            asyncio.run(_model(sock).ainvoke("go"))
        sock.close()
    assert is_endpoint_error(info.value) and is_endpoint_error(ainfo.value)
    assert info.value.response.status_code == ainfo.value.response.status_code == 429


@pytest.mark.parametrize("fault", ["drop_mid_body", "truncated_json"])
def test_over_the_socket_a_broken_answer_is_an_endpoint_error(fault):
    with ScriptedOpenAIServer([Reply(content="x", fault=fault)]) as srv:
        sock = SocketToServer(srv)
        for call in (lambda: _model(sock).invoke("go"), lambda: asyncio.run(_model(sock).ainvoke("go"))):
            with pytest.raises(Exception) as info:
                call()
            assert is_endpoint_error(info.value) or isinstance(info.value, ValueError)
        sock.close()


def test_over_a_missing_socket_the_call_fails_to_connect():
    model = GatewayChatModel(model="m", api_base=DEAD, gateway_socket="/nonexistent/gateway.sock")
    with pytest.raises(httpx.ConnectError):
        model.invoke("go")
    with pytest.raises(httpx.ConnectError):
        asyncio.run(model.ainvoke("go"))


def _raw_server(answer: bytes, *, keep: int = 1) -> tuple[str, list[int]]:
    """A Unix socket answering every request with ``answer``, closing each connection
    after ``keep`` answers; the list counts the connections it took."""
    path = os.path.join(tempfile.mkdtemp(prefix="milo-gw-", dir="/tmp"), "gateway.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    connections = [0]

    def one(conn: socket.socket) -> None:
        data, answered = b"", 0
        while True:
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    conn.close()
                    return
                data += more
            head, _, data = data.partition(b"\r\n\r\n")
            length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
                b"content-length")][0])
            while len(data) < length:
                data += conn.recv(65536)
            data = data[length:]
            conn.sendall(answer)
            answered += 1
            if answered >= keep:
                conn.close()
                return

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            connections[0] += 1
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return path, connections


BODY = b'{"id":"x","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"chunked ok"},' \
       b'"finish_reason":"stop"}]}'


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_over_the_socket_a_chunked_or_close_delimited_answer_is_read_whole(framing):
    if framing == "chunked":
        half = len(BODY) // 2
        answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % half + BODY[:half]
                  + b"\r\n" + b"%x;ext=1\r\n" % (len(BODY) - half) + BODY[half:] + b"\r\n0\r\n\r\n")
    else:
        answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY
    path, connections = _raw_server(answer)
    model = GatewayChatModel(model="m", api_base=DEAD, gateway_socket=path)
    assert model.invoke("go").content == "chunked ok"
    assert asyncio.run(model.ainvoke("go")).content == "chunked ok"
    assert model.invoke("again").content == "chunked ok"  # the closed connection was not kept
    assert connections[0] == 3


def test_over_the_socket_one_connection_is_kept_per_event_loop_and_one_for_blocking_calls():
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    path, connections = _raw_server(answer, keep=1000)
    model = GatewayChatModel(model="m", api_base=DEAD, gateway_socket=path)

    async def calls() -> list[str]:
        return [(await model.ainvoke(str(i))).content for i in range(3)]

    assert [model.invoke(str(i)).content for i in range(3)] == ["chunked ok"] * 3
    assert asyncio.run(calls()) == ["chunked ok"] * 3
    assert connections[0] == 2


@pytest.mark.parametrize("pause", [0.0, 0.1])
def test_over_the_socket_a_kept_connection_the_gateway_closed_is_replaced(pause):
    # The gateway closes each connection after two answers without saying so: the next
    # call finds it closed (pause), or sends into it as it closes (no pause), and goes on
    # over a new one.
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    path, connections = _raw_server(answer, keep=2)
    model = GatewayChatModel(model="m", api_base=DEAD, gateway_socket=path)

    async def calls() -> list[str]:
        out = []
        for i in range(5):
            out.append((await model.ainvoke(str(i))).content)
            await asyncio.sleep(pause)
        return out

    def blocking() -> list[str]:
        out = []
        for i in range(5):
            out.append(model.invoke(str(i)).content)
            time.sleep(pause)
        return out

    assert blocking() == ["chunked ok"] * 5 and asyncio.run(calls()) == ["chunked ok"] * 5
    assert connections[0] == 6


def test_over_the_socket_a_streamed_call_goes_there_too():
    with ScriptedOpenAIServer([reply("streamed answer", prompt_tokens=4, completion_tokens=2)]) as srv:
        sock = SocketToServer(srv)
        model = _model(sock, streaming=True)
        text = "".join(c.content for c in model.stream("go"))

        async def astream() -> str:
            return "".join([c.content async for c in model.astream("go")])

        atext = asyncio.run(astream())
        sock.close()
    assert text == atext == "streamed answer" and sock.connections == 2
    assert all(r.get("stream") for r in srv.requests)
