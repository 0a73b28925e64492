"""The harness process: one rollout's harness, run inside that rollout's sandbox.

Started by the rollout executor (:mod:`milo_ray.boundary.harness_process.host`) as an
unprivileged process in the sandbox, with this package's code, the harness files and the
interpreter read-only and the task's workspace writable. It

1. imports what every harness needs (langchain, deepagents, this process's own modules)
   and says ``ready``;
2. reads its job -- one JSON line on stdin: the harness directory, the task instruction,
   the graph-step cap, the chat-model settings and the gateway token of this rollout;
3. builds the chat model (:class:`~milo_ray.boundary.inside.model.GatewayChatModel`,
   a LangChain chat model with ChatLiteLLM's interface that needs no litellm: the gateway
   does litellm's work) speaking straight to the rollout's gateway socket, with the
   rollout's token as its key and, as its ``api_base``, the loopback relay's URL (for any
   other HTTP client the harness builds), and the ``backend`` (:class:`SandboxShell`) whose commands
   run in this same sandbox -- with the task's own tools when the job names a tool
   channel (``task_tools``: at ``backend.task_tools``, and added to every agent the
   harness builds, :func:`offer_task_tools`); imports the harness, calls
   ``build_agent(model, backend)`` and says ``started``;
4. runs the agent on the instruction, streaming the trajectory out as it grows;
5. says ``final`` with how it ended: ``completed``, ``step_cap`` (the graph-step cap),
   ``harness_error`` (import, ``build_agent`` or the agent raised; ``endpoint_error`` says
   whether what the agent raised came from the model client).

Everything it writes to the host is one JSON object per line on its original stdout
(see :mod:`milo_ray.boundary.trajectory` for the schema the host enforces); the harness's
own prints go to stderr. No framework object crosses: the host reads lines, and the
tokens, costs and caps of the rollout are the gateway's, not this process's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from typing import Any, TextIO

from milo_ray.core.failures import is_endpoint_error

# One "steps" line carries at most this many characters of steps (the host refuses
# longer lines); a longer update is split over several lines.
LINE_BUDGET_CHARS = 1_000_000


class _Out:
    """The protocol channel (the process's original stdout)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def send(self, **msg: Any) -> None:
        self.stream.write(json.dumps(msg, default=str) + "\n")
        self.stream.flush()


def _protocol_channel() -> _Out:
    # The harness may print: stdout (fd 1) becomes stderr from here on, and the protocol
    # keeps a private duplicate of the original.
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return _Out(os.fdopen(fd, "w", buffering=1))


def preimport() -> None:
    """What every harness imports, before the job arrives (so a warm process starts fast):
    langchain's agent factory, deepagents, and everything this process itself uses after
    the job -- not litellm (the chat model needs none) and not the framework's store,
    search or methods (nothing here uses them)."""
    import deepagents  # noqa: F401
    import langchain.agents  # noqa: F401
    import langchain_core.tools  # noqa: F401
    import langgraph.errors  # noqa: F401

    import milo_ray.boundary.inside.backend  # noqa: F401
    import milo_ray.boundary.inside.model  # noqa: F401
    import milo_ray.boundary.trajectory  # noqa: F401
    import milo_ray.boundary.inside.loader  # noqa: F401
    import milo_ray.boundary.inside.task_tools  # noqa: F401


def warm_up() -> None:
    """Build and run a throwaway deep agent (one ``write_todos`` call, then an answer)
    against a scripted model on this sandbox's loopback, before the job: what langchain,
    langgraph, deepagents and the HTTP client do once per process (lazy imports, schema
    and graph caches) is then done before the rollout's agent is built. It is the
    framework's own code on fixed data; nothing of it survives but those caches (the
    agent, its model and its server are discarded, and it touches no file)."""
    import http.server
    import threading

    from deepagents import create_deep_agent

    from milo_ray.boundary.inside.backend import SandboxShell

    answers = [{"tool_calls": [{"id": "warm-1", "type": "function", "function": {
        "name": "write_todos", "arguments": json.dumps({"todos": [{"content": "warm up", "status": "completed"}]})}}]},
        {"content": "done"}]

    class Scripted(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            message = {"role": "assistant", "content": None, **(answers.pop(0) if answers else {"content": "done"})}
            body = json.dumps({"id": "warm", "model": "warm", "choices": [{"index": 0, "message": message,
                               "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        model = build_model({"model": {"solver": "warm-up"}, "token": "warm-up"},
                            f"http://127.0.0.1:{server.server_address[1]}/v1")
        agent = create_deep_agent(model=model, tools=[], backend=SandboxShell(
            workdir="/", env={}, timeout_s=10, output_cap_bytes=1000))

        async def run(streamer: StepStreamer) -> None:
            async for state in agent.astream({"messages": [{"role": "user", "content": "warm up"}]},
                                             config={"recursion_limit": 10}, stream_mode="values"):
                streamer.observe(state)

        with open(os.devnull, "w") as sink:
            asyncio.run(run(StepStreamer(_Out(sink))))
    finally:
        server.shutdown()
        server.server_close()


def build_model(job: dict[str, Any], api_base: str, gateway_socket: str | None = None) -> Any:
    """The harness's chat model: requests go over ``gateway_socket`` when given (the
    rollout's own), else to ``api_base``."""
    from milo_ray.boundary.inside.model import GatewayChatModel

    m = job["model"]
    # No retries here: the gateway retries the provider, and a retry here would multiply them.
    kwargs: dict[str, Any] = {"model": m["solver"], "api_base": api_base, "api_key": job["token"],
                              "temperature": m.get("temperature"), "gateway_socket": gateway_socket}
    if m.get("max_tokens") is not None:
        kwargs["max_tokens"] = int(m["max_tokens"])
    if m.get("request_timeout") is not None:
        kwargs["request_timeout"] = float(m["request_timeout"])
    return GatewayChatModel(**kwargs)


def task_tools(job: dict[str, Any]) -> list[Any]:
    """The task's own tools when the job names a tool channel (a task whose world lives on
    the host), else none. A channel that does not answer is the task's environment failing,
    not the harness: the host sees that from the episode and records it."""
    path = job.get("task_tools")
    if not path:
        return []
    from milo_ray.boundary.inside.task_tools import channel_tools

    return channel_tools(str(path))


def offer_task_tools(tools: list[Any]) -> None:
    """Give every agent the harness builds with ``langchain.agents.create_agent`` or
    ``deepagents.create_deep_agent`` the task's own tools too (after its own, none twice
    by name): a harness written for shell tasks then acts in a task world unchanged, and a
    harness that builds its agent otherwise finds them at ``backend.task_tools``. Done
    before the harness is imported, so its ``from ... import`` takes these."""
    import functools

    import deepagents
    import langchain.agents

    def widened(factory: Any) -> Any:
        @functools.wraps(factory)
        def build(*args: Any, **kwargs: Any) -> Any:
            args = list(args)
            given = list((args[1] if len(args) > 1 else kwargs.get("tools")) or [])
            names = {getattr(t, "name", None) for t in given}
            both = given + [t for t in tools if t.name not in names]
            if len(args) > 1:
                args[1] = both
            else:
                kwargs["tools"] = both
            return factory(*args, **kwargs)
        return build

    langchain.agents.create_agent = widened(langchain.agents.create_agent)
    deepagents.create_deep_agent = widened(deepagents.create_deep_agent)


def load_module(harness_dir: str, harness_id: str, multi_file: bool) -> Any:
    from milo_ray.boundary.inside.loader import HarnessLoadError, import_entry

    try:
        return import_entry(harness_dir, f"milo_harness_{harness_id}", multi_file=multi_file)
    except HarnessLoadError as exc:
        raise _Fail(str(exc)) from None


class _Fail(Exception):
    pass


class StepStreamer:
    """Sends the trajectory as it grows: each update names the first step index that
    changed and carries the steps from there on."""

    def __init__(self, out: _Out) -> None:
        from milo_ray.boundary.trajectory import TrajectoryRecorder

        self.out, self.recorder = out, TrajectoryRecorder()
        self._sent: list[str] = []

    def observe(self, state: Any) -> None:
        self.recorder.observe(state)
        keys = [self.recorder._key(i, m) for i, m in enumerate(self.recorder.messages)]
        start = 0
        while start < min(len(keys), len(self._sent)) and keys[start] == self._sent[start]:
            start += 1
        if start == len(keys) == len(self._sent):
            return
        steps = self.recorder.steps()[start:]
        self._sent = keys
        batch: list[dict[str, Any]] = []
        size, at = 0, start
        for s in steps:
            n = len(json.dumps(s, default=str))
            if batch and size + n > LINE_BUDGET_CHARS:
                self.out.send(t="steps", start=at, steps=batch)
                at += len(batch)
                batch, size = [], 0
            batch.append(s)
            size += n
        self.out.send(t="steps", start=at, steps=batch)


async def run_agent(agent: Any, job: dict[str, Any], streamer: StepStreamer) -> tuple[str, str | None, bool]:
    from langgraph.errors import GraphRecursionError

    config = {"recursion_limit": int(job["recursion_limit"])}
    inputs = {"messages": [{"role": "user", "content": job["instruction"]}]}
    try:
        async for state in agent.astream(inputs, config=config, stream_mode="values"):
            streamer.observe(state)
    except GraphRecursionError:
        return "step_cap", None, False
    except Exception as exc:
        return "harness_error", f"the agent raised {type(exc).__name__}: {exc}", is_endpoint_error(exc)
    return "completed", None, False


def main() -> None:
    # Nothing the launcher held open is the harness's to read (bwrap's argument file
    # names host paths).
    os.closerange(3, 1 << 16)
    out = _protocol_channel()
    try:
        preimport()
    except BaseException as exc:
        out.send(t="final", status="harness_error", error=f"the harness runtime failed to import: {exc!r}")
        os._exit(3)
    try:
        warm_up()
    except Exception:  # only slower: the rollout's agent does the first-time work instead
        traceback.print_exc()
    out.send(t="ready")
    line = sys.stdin.readline()
    if not line:
        os._exit(0)  # a warm process that was never used
    job = json.loads(line)
    from milo_ray.boundary.inside.backend import GatewayRelay, SandboxShell

    relay = GatewayRelay(job["gateway_socket"])
    try:
        backend = SandboxShell(workdir=job["workdir"], env=job["env"], timeout_s=job.get("command_timeout_s"),
                               output_cap_bytes=int(job["output_cap_bytes"]), task_tools=task_tools(job))
        model = build_model(job, relay.url, job["gateway_socket"])
        if backend.task_tools:
            offer_task_tools(backend.task_tools)
        module = load_module(job["harness_dir"], job["harness_id"], bool(job.get("multi_file")))
        try:
            agent = module.build_agent(model, backend)
        except BaseException as exc:
            raise _Fail(f"build_agent raised {type(exc).__name__}: {exc}") from None
    except _Fail as exc:
        out.send(t="final", status="harness_error", error=str(exc))
        os._exit(0)
    except BaseException as exc:
        out.send(t="final", status="harness_error", error=f"setting up the harness failed: {exc!r}")
        os._exit(0)
    out.send(t="started")
    streamer = StepStreamer(out)
    try:
        status, error, endpoint = asyncio.run(run_agent(agent, job, streamer))
    except BaseException as exc:  # SystemExit, KeyboardInterrupt raised by the harness
        status, error, endpoint = "harness_error", f"the agent raised {type(exc).__name__}: {exc}", False
        traceback.print_exc()
    out.send(t="final", status=status, error=error, endpoint_error=endpoint)
    # Whatever threads the harness left behind must not keep the process alive.
    os._exit(0)


if __name__ == "__main__":
    main()
