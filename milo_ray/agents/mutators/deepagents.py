"""The LLM coding-agent mutator: a deepagents agent that reads a parent harness and its
evidence in a sandbox and writes one child harness. It serves MILO's mutations, MILO's
graft (the orchestrator builds one with ``instructions="graft"``) and SSR's candidate
optimizer; which instructions it follows is chosen per request
(:func:`~milo_ray.agents.mutators.workspace.template_for`) unless fixed.

One call, step by step:

1. the workspace (:mod:`~milo_ray.agents.mutators.workspace`) is prepared on the host in
   a fresh temporary directory (``<tmp>/milo-mutator-*/workspace``; removed afterwards
   unless ``keep_workspace``), never under the request's workdir, which the runner reads
   back as the child's files;
2. a bwrap sandbox (no network) mounts it at ``/workspace`` as its working directory,
   with the host's system read-only and the lineage nodes the snapshot names
   (:meth:`Workspace.external_dirs`) read-only at their own paths;
3. the agent's chat model reaches the role's model only through this process's model
   gateway (:class:`~milo_ray.boundary.gateway.mutation.MutationGateway`, built by
   :func:`~milo_ray.llm.role_llm.metered_chat_model`): a loopback ``http://`` base URL
   and a token issued for this call, revoked when it ends; the key stays in the gateway;
4. the agent gets the instructions as its task and a backend whose file tools
   (``write_file``, ``edit_file``, ``delete``, uploads) refuse every path outside
   ``/workspace/out``; shell commands can still change the workspace's copies, which
   :meth:`Workspace.child` then names in its rejection reason;
5. it runs streamed under ``time_cap_s`` (past it: cancelled, every process in the
   sandbox killed, ``timed out after Xs``) and ``recursion_limit`` graph steps;
6. the child is read from ``out/`` and copied to ``request.workdir``; the transcript
   (every message with its time, and every model call as the gateway metered it) goes
   next to the workdir as ``<workdir>.transcript.json``.

Nothing here raises for a bad child or a failing model: the :class:`MutationResult`
says why, with the usage of every call made so far -- the gateway's account of the
token's calls (tokens, USD, retries), not what the agent or langchain reports; USD is
unknown (None) when a call was still in flight as the call ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    WriteResult,
)
from deepagents.backends.sandbox import BaseSandbox

from milo_ray.llm.client import check_credentials
from milo_ray.agents.mutators.workspace import OUT, collect, prepare, template_for
from milo_ray.agents.prompts import render_from
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.llm.role_llm import MeteredCall, RoleLLM, metered_chat_model
from milo_ray.llm.usage import AgentUsage
from milo_ray.core.failures import is_endpoint_error
from milo_ray.boundary.gateway.mutation import MutationGateway
from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.bwrap import DEFAULT_HOST_READONLY, BwrapSandboxFactory
from milo_ray.boundary.trajectory import TrajectoryRecorder

log = logging.getLogger(__name__)

AGENT_ROOT = "/workspace"
TEMPLATES = ("mutate", "mutate_optimizer", "graft", "ssr_optimize", "ssr_optimize_optimizer")
TRANSCRIPT_SUFFIX = ".transcript.json"
# The search role each set of instructions serves (the label of the call's gateway grant).
_ROLES = {"graft": "orchestrator", "ssr_optimize": "optimizer", "ssr_optimize_optimizer": "optimizer"}
# Per-command limit of the agent's shell: a mutation's commands are reads, greps and an
# import check, never long jobs; the mutator's own cap bounds the whole run anyway.
DEFAULT_SANDBOX = {"command_timeout_s": 300.0}


class DeepAgentsMutator:
    """Mutator protocol implementation driving a deepagents coding agent.

    llm: the role's model (a :class:`RoleLLM` mapping; checked here). The gateway holds
        it and its key; each call's chat model holds only that call's token.
    name: display name (default ``deepagents:<model>``).
    instructions: one of :data:`TEMPLATES`; None picks per request.
    time_cap_s: wall-clock cap of one agent run. recursion_limit: its graph-step cap.
    sandbox: keyword arguments of :class:`BwrapSandboxFactory` (e.g. ``command_timeout_s``,
        ``pids_limit``). keep_workspace: keep the host workspace after the call (its path
        is logged), for debugging an agent.
    Instances are shared by threads: :meth:`mutate` keeps all per-call state local.
    """

    def __init__(self, llm: Mapping[str, Any] | RoleLLM, *, name: str | None = None, instructions: str | None = None,
                 time_cap_s: float = 2700.0, recursion_limit: int = 300, sandbox: Mapping[str, Any] | None = None,
                 keep_workspace: bool = False) -> None:
        self.llm = RoleLLM.of(llm, where="backend.agents.mutator.llm")
        if instructions is not None and instructions not in TEMPLATES:
            raise ValueError(f"mutator.instructions={instructions!r}: choose one of {TEMPLATES} (or null: chosen per "
                             "request)")
        if not float(time_cap_s) > 0:
            raise ValueError(f"mutator.time_cap_s={time_cap_s}: must be > 0 seconds")
        if int(recursion_limit) < 1:
            raise ValueError(f"mutator.recursion_limit={recursion_limit}: must be >= 1 graph steps")
        self.sandbox_kwargs = {**DEFAULT_SANDBOX, **dict(sandbox or {})}
        if "host_readonly" in self.sandbox_kwargs:
            raise ValueError("mutator.sandbox.host_readonly: not settable here; the mutator mounts the host system "
                             "and the lineage directories the snapshot names itself")
        try:
            _factory((), self.sandbox_kwargs)  # a bad key or value fails now, not per call
        except TypeError as e:
            raise ValueError(f"mutator.sandbox: {e} (keys of BwrapSandboxFactory)") from e
        self.name = name or f"deepagents:{self.llm.model}"
        self.instructions = instructions
        self.time_cap_s = float(time_cap_s)
        self.recursion_limit = int(recursion_limit)
        self.keep_workspace = bool(keep_workspace)

    # --- the protocol -----------------------------------------------------------------
    def mutate(self, request: MutationRequest) -> MutationResult:
        return self._run(request, self.instructions or template_for(request))

    def graft(self, request: MutationRequest) -> MutationResult:
        """The recombined child of a Graft move (same agent, the graft instructions)."""
        return self._run(request, self.instructions or "graft")

    # --- one call ---------------------------------------------------------------------
    def gateway(self) -> Any:
        """The model gateway this agent's calls go through: this process's gateway for
        the role's model (started on first use; it holds the key, the agent never does)."""

        return MutationGateway.shared(self.llm)

    def _run(self, request: MutationRequest, template: str) -> MutationResult:
        t0 = time.monotonic()
        transcript = TrajectoryRecorder()
        scratch = Path(tempfile.mkdtemp(prefix="milo-mutator-"))
        sandbox: Any = None
        call: MeteredCall | None = None
        error: str | None = None
        try:
            try:
                ws = prepare(request, scratch / "workspace", agent_root=AGENT_ROOT)
                prompt = render_from(template, ws.values())
                factory = _factory(ws.external_dirs(), self.sandbox_kwargs)
                spec = SandboxSpec(task_id=f"mutation-{request.seed}", workdir=AGENT_ROOT, allow_internet=False)
                sandbox = factory.open(spec, scratch)
                # A missing key is named here, not as an opaque refusal of the provider's.
                check_credentials(self.llm.model_config())
                # The token is revoked when this block ends: nothing the agent left behind
                # can call the model with it. The usage read below counts every call the
                # gateway finished (one still in flight past the cap leaves USD unknown).
                with metered_chat_model(self.llm, self.gateway(), role=_ROLES.get(template, "mutator"),
                                        caller=f"{self.name}:{template}") as call:
                    agent = self._agent(call.model, sandbox)
                    error = _run_coroutine(lambda: self._drive(agent, prompt, transcript, sandbox))
            except Exception as e:  # the workspace, sandbox or gateway could not be set up: no child, no crash
                error = f"mutator setup failed: {type(e).__name__}: {e}"[:2000]
            seconds = time.monotonic() - t0
            report = _final_text(transcript.messages)
            calls = call.calls() if call is not None else []
            _save_transcript(request, template, transcript, calls, error, seconds)

            def usage(why: str | None) -> AgentUsage:
                # The gateway's ledger, never what the agent or langchain says it spent.
                if call is None:
                    return AgentUsage(cost_usd=0.0, seconds=seconds, error=why)
                return call.usage(seconds=seconds, error=why)

            if error is not None:
                return MutationResult(None, error=error, report=report, usage=usage(error))
            child, why = ws.child()
            if child is None:
                return MutationResult(None, error=why, report=report, usage=usage(why))
            collect(ws, request.workdir)
            return MutationResult(child, report=report, usage=usage(None))
        finally:
            if sandbox is not None:
                sandbox.close()
            if self.keep_workspace:
                log.info("mutator %s: workspace kept at %s", self.name, scratch / "workspace")
            else:
                shutil.rmtree(scratch, ignore_errors=True)

    def _agent(self, model: Any, sandbox: Any) -> Any:
        from deepagents import create_deep_agent

        return create_deep_agent(model, [], backend=OutOnlyBackend(sandbox, f"{AGENT_ROOT}/{OUT}"))

    async def _drive(self, agent: Any, prompt: str, transcript: Any, sandbox: Any) -> str | None:
        """Run the agent to its end under the caps; None, or why it stopped short."""
        from langgraph.errors import GraphRecursionError

        config = {"recursion_limit": self.recursion_limit}

        async def consume() -> None:
            inputs = {"messages": [{"role": "user", "content": prompt}]}
            async for state in agent.astream(inputs, config=config, stream_mode="values"):
                transcript.observe(state)

        error: str | None = None
        try:
            await asyncio.wait_for(consume(), timeout=self.time_cap_s)
        except asyncio.TimeoutError:
            error = f"timed out after {self.time_cap_s:g}s"
        except GraphRecursionError:
            error = f"stopped at the step limit (recursion_limit={self.recursion_limit} graph steps)"
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            kind = "model call failed" if is_endpoint_error(e) else "mutator agent failed"
            error = f"{kind}: {type(e).__name__}: {first}"[:2000]
        if error is not None:
            # A cancelled tool call's command goes on in its thread: kill it, so the
            # event loop's shutdown does not wait for it.
            await asyncio.to_thread(sandbox.interrupt)
        return error


# --------------------------------------------------------------------------- the backend

class OutOnlyBackend(BaseSandbox):
    """The agent's view of the sandbox: reads and commands pass through; every file-tool
    write (``write_file``, ``edit_file``, ``delete``, uploads) outside ``writable`` is
    refused with an error the model reads. The middleware's own offloads of large tool
    results (to ``/large_tool_results``) are refused too; the result then stays inline."""

    def __init__(self, inner: BaseSandbox, writable: str) -> None:
        self.inner = inner
        self.writable = posixpath.normpath(writable)

    @property
    def id(self) -> str:
        return self.inner.id

    def refusal(self, path: str) -> str | None:
        """Why a write to ``path`` is refused, or None when it is allowed."""
        p = posixpath.normpath(path if path.startswith("/") else posixpath.join(AGENT_ROOT, path))
        if p.startswith(self.writable + "/"):
            return None
        return f"read-only: write only under {self.writable}/ (refused {path}); everything else is reference"

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return self.inner.execute(command, timeout=timeout)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self.inner.download_files(paths)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        refused = {path: why for path, _ in files if (why := self.refusal(path)) is not None}
        allowed = self.inner.upload_files([(p, c) for p, c in files if p not in refused]) if len(refused) < len(files) else []
        done = iter(allowed)
        return [FileUploadResponse(path=p, error=refused[p]) if p in refused else next(done) for p, _ in files]

    def write(self, file_path: str, content: str) -> WriteResult:
        why = self.refusal(file_path)
        return WriteResult(error=why) if why else self.inner.write(file_path, content)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        why = self.refusal(file_path)
        return WriteResult(error=why) if why else await self.inner.awrite(file_path, content)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        why = self.refusal(file_path)
        return EditResult(error=why) if why else self.inner.edit(file_path, old_string, new_string, replace_all)

    async def aedit(self, file_path: str, old_string: str, new_string: str,
                    replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        why = self.refusal(file_path)
        return EditResult(error=why) if why else await self.inner.aedit(file_path, old_string, new_string, replace_all)

    def delete(self, file_path: str) -> DeleteResult:
        why = self.refusal(file_path)
        return DeleteResult(error=why) if why else self.inner.delete(file_path)

    async def adelete(self, file_path: str) -> DeleteResult:
        why = self.refusal(file_path)
        return DeleteResult(error=why) if why else await self.inner.adelete(file_path)


# --------------------------------------------------------------------------- the sandbox

def _factory(readable: Sequence[str], kwargs: Mapping[str, Any]) -> BwrapSandboxFactory:
    """A bwrap factory whose sandboxes also see ``readable`` host directories (the
    lineage nodes), read-only at their own paths; bwrap binds those under the sandbox's
    private ``/tmp`` or home after that mount, so they stay visible."""
    return BwrapSandboxFactory(host_readonly=(*DEFAULT_HOST_READONLY, *readable), **kwargs)


# --------------------------------------------------------------------------- helpers

def _run_coroutine(make: Any) -> Any:
    """Run ``make()`` to completion on a fresh event loop; from a thread that already
    runs one (an async caller), on a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mutator-loop") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def _final_text(messages: list[Any]) -> str:
    """The agent's last words: the text of its last message without tool calls."""
    for m in reversed(messages):
        if getattr(m, "type", "") == "ai" and not getattr(m, "tool_calls", None):
            content = getattr(m, "content", "")
            if isinstance(content, list):  # content blocks
                content = "".join(str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in content)
            return str(content or "").strip()
    return ""


def transcript_path(request: MutationRequest) -> Path:
    """Where a call's transcript goes: beside the workdir, never in it (every file in the
    workdir is read back as part of the child)."""
    wd = Path(request.workdir)
    return wd.parent / f"{wd.name}{TRANSCRIPT_SUFFIX}"


def _save_transcript(request: MutationRequest, template: str, transcript: Any, calls: list[dict[str, Any]],
                     error: str | None, seconds: float) -> None:
    path = transcript_path(request)
    doc = {"instructions": template, "started_at": transcript.started, "seconds": round(seconds, 3),
           "error": error, "messages": transcript.steps(), "calls": calls}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
        tmp.replace(path)
    except OSError as e:  # a transcript is for reading later; losing one never loses the child
        log.warning("mutator: could not save the transcript to %s: %s", path, e)
