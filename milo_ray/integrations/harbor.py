"""Run any milo_ray harness as a Harbor agent, inside Harbor's own runner and
environments:

    harbor run -p TASKS -a milo_ray.integrations.harbor:HarnessAgent \\
        --ak harness=PATH --ak api_key_env=OPENAI_API_KEY -m openai/MODEL

``harness`` is a harness directory (its ``harness.py`` exposes
``build_agent(model, backend)``) or a single ``.py`` file. Per trial the agent loads
the harness under a fresh module name, builds the solver with
:func:`milo_ray.llm.client.build_chat_model`, hands ``build_agent`` a deepagents
sandbox backend over Harbor's environment (:class:`HarborSandbox`), runs the agent on
the instruction, and reports tokens and USD in Harbor's ``AgentContext``. The
conversation goes to ``<agent logs>/messages.json``.

Harbor needs Python >= 3.12 (extra ``milo_ray[harbor]``); milo_ray itself runs on
3.11. Nothing in milo_ray imports this module, so ``import milo_ray`` never needs
Harbor; importing this module without it is an ImportError that says what to install.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import itertools
import json
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

try:
    from harbor.agents.base import BaseAgent
    from harbor.environments.base import BaseEnvironment
    from harbor.models.agent.context import AgentContext
except ImportError as e:  # pragma: no cover - depends on the interpreter
    raise ImportError("milo_ray.integrations.harbor needs the `harbor` package, which needs Python >= 3.12: "
                      "pip install 'milo_ray[harbor]' in a Python 3.12 environment (scripts/harbor_env.sh)") from e

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox
from langchain_core.callbacks import BaseCallbackHandler

import milo_ray
from milo_ray.llm.client import api_key, build_chat_model, price
from milo_ray.harness.model import ENTRY_FILE, Harness

ENTRY_FUNCTION = "build_agent"
MESSAGES_FILE = "messages.json"
# Tool output handed back to the model; longer output is cut (and flagged truncated)
# so one noisy command cannot fill the context window.
MAX_OUTPUT_CHARS = 30_000
_module_ids = itertools.count()


# --------------------------------------------------------------------------- harness


def harness_entry(path: str | Path) -> Path:
    """The ``harness.py`` of a harness directory, or the given ``.py`` file; a
    ValueError names ``harness`` when neither exists."""
    p = Path(path).expanduser()
    entry = p / ENTRY_FILE if p.is_dir() else p
    if not entry.is_file() or entry.suffix != ".py":
        raise ValueError(f"harness={path}: not a harness directory with {ENTRY_FILE} nor a .py file")
    return entry.resolve()


def harness_id(path: str | Path) -> str:
    """Content hash of the harness (every file of its directory, or the one file):
    the same identity milo_ray gives it, so Harbor's results name the exact harness."""
    p = Path(path).expanduser()
    return Harness.from_dir(p).harness_id if p.is_dir() else Harness.from_source(p.read_text()).harness_id


def load_harness(path: str | Path) -> ModuleType:
    """Execute the harness under a fresh module name (two trials, or two harnesses,
    never share module state) and check it exposes ``build_agent``. The harness's
    directory goes on ``sys.path`` so it can import its sibling files, as it does in
    milo_ray's validator."""
    entry = harness_entry(path)
    name = f"_milo_ray_harbor_harness_{hashlib.sha1(str(entry).encode()).hexdigest()[:8]}_{next(_module_ids)}"
    if str(entry.parent) not in sys.path:
        sys.path.insert(0, str(entry.parent))
    spec = importlib.util.spec_from_file_location(name, entry)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if not callable(getattr(module, ENTRY_FUNCTION, None)):
        raise ValueError(f"harness={path}: {entry.name} has no {ENTRY_FUNCTION}(model, backend)")
    return module


# --------------------------------------------------------------------------- sandbox


class HarborSandbox(BaseSandbox):
    """A deepagents sandbox backend over a Harbor environment.

    Harbor's environment API is async and bound to the event loop the trial runs on.
    deepagents' own tools call the async methods (``aexecute``, ``aupload_files``,
    ``adownload_files``) from that loop: they await the environment directly. Sync
    tools (plain ``@tool`` functions a harness writes, run by LangChain in worker
    threads) call the sync methods, which schedule the same coroutine on the trial's
    loop and wait for it; called on the loop thread itself they would deadlock, so
    they refuse with a RuntimeError instead.
    """

    def __init__(self, environment: BaseEnvironment, loop: asyncio.AbstractEventLoop, *,
                 timeout_sec: int | None = None) -> None:
        self.environment, self._loop, self._timeout_sec = environment, loop, timeout_sec

    @property
    def id(self) -> str:
        return f"harbor:{self.environment.session_id}"

    # ---- async: deepagents' tools, on the trial's loop

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        limit = timeout if timeout is not None else self._timeout_sec
        try:
            r = await self.environment.exec(command, timeout_sec=limit)
        except TimeoutError:
            return ExecuteResponse(output=f"command timed out after {limit} s", exit_code=124)
        except RuntimeError as e:  # Harbor's Docker environment reports a timeout this way
            if "timed out" not in str(e):
                raise
            return ExecuteResponse(output=f"command timed out after {limit} s", exit_code=124)
        out, err = r.stdout or "", r.stderr or ""
        output = out + ("\n" if out and err and not out.endswith("\n") else "") + err
        truncated = len(output) > MAX_OUTPUT_CHARS
        if truncated:
            output = output[:MAX_OUTPUT_CHARS] + f"\n[output truncated at {MAX_OUTPUT_CHARS} characters]"
        return ExecuteResponse(output=output, exit_code=r.return_code, truncated=truncated)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out: list[FileUploadResponse] = []
        for path, content in files:
            if not path.startswith("/"):
                out.append(FileUploadResponse(path, error="invalid_path"))
                continue
            parent = str(Path(path).parent)
            made = await self.environment.exec(f"mkdir -p '{_quote(parent)}'", timeout_sec=60)
            if made.return_code != 0:
                out.append(FileUploadResponse(path, error="permission_denied"))
                continue
            with tempfile.TemporaryDirectory(prefix="milo-ray-upload-") as tmp:
                src = Path(tmp) / "file"
                src.write_bytes(content)
                try:
                    await self.environment.upload_file(src, path)
                except Exception as e:  # the environment refused the copy: report it to the tool
                    out.append(FileUploadResponse(path, error=f"upload failed: {e}"))
                    continue
            out.append(FileUploadResponse(path))
        return out

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out: list[FileDownloadResponse] = []
        for path in paths:
            if not await self.environment.is_file(path):
                error = "is_directory" if await self.environment.is_dir(path) else "file_not_found"
                out.append(FileDownloadResponse(path, error=error))
                continue
            with tempfile.TemporaryDirectory(prefix="milo-ray-download-") as tmp:
                dst = Path(tmp) / "file"
                try:
                    await self.environment.download_file(path, dst)
                    out.append(FileDownloadResponse(path, content=dst.read_bytes()))
                except Exception as e:  # unreadable for the environment's copy: report it to the tool
                    out.append(FileDownloadResponse(path, error=f"download failed: {e}"))
        return out

    # ---- sync: harness tools running in worker threads

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return self._on_loop(self.aexecute(command, timeout=timeout))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self._on_loop(self.aupload_files(files))

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self._on_loop(self.adownload_files(paths))

    def _on_loop(self, coro: Any) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError("HarborSandbox: a sync backend method was called on the event loop's thread, where "
                               "waiting for the environment would deadlock; call the async method (aexecute, "
                               "aread, awrite, ...) or run the sync tool in a worker thread")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


def _quote(path: str) -> str:
    """Escape for use inside single quotes in a POSIX shell."""
    return path.replace("'", "'\\''")


# --------------------------------------------------------------------------- usage


@dataclass
class UsageTally:
    """Tokens of every model call of one run, sub-agents included."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_tokens: int = 0


class _UsageCallback(BaseCallbackHandler):
    """Adds each finished LLM call's ``usage_metadata`` to a :class:`UsageTally`.
    Callbacks reach nested runs (deepagents' sub-agents) through the run config,
    which the top-level message list does not."""

    def __init__(self) -> None:
        self.tally, self._lock = UsageTally(), threading.Lock()

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        for generations in response.generations:
            for g in generations:
                meta = getattr(getattr(g, "message", None), "usage_metadata", None) or {}
                with self._lock:
                    self.tally.calls += 1
                    self.tally.input_tokens += int(meta.get("input_tokens") or 0)
                    self.tally.output_tokens += int(meta.get("output_tokens") or 0)
                    self.tally.cache_tokens += int((meta.get("input_token_details") or {}).get("cache_read") or 0)


# --------------------------------------------------------------------------- agent


class HarnessAgent(BaseAgent):
    """A Harbor agent that runs a milo_ray harness.

    Agent kwargs (``--ak key=value``): ``harness`` (required: harness directory or
    ``.py`` file), ``api_base`` (an OpenAI-compatible server's URL), ``api_key_env``
    (the environment variable holding the key; ``openai/`` models need one, any value
    for a local server), ``recursion_limit`` (LangGraph super-steps before the run
    stops and the workspace is graded as it is), ``temperature``, ``command_timeout_sec``
    (per command run in the environment; None = the environment's own). The model is
    Harbor's ``-m``, a litellm model string.
    """

    def __init__(self, logs_dir: Path, model_name: str | None = None, *, harness: str | None = None,
                 api_base: str | None = None, api_key_env: str | None = None, recursion_limit: int = 150,
                 temperature: float | None = None, command_timeout_sec: int | None = None, **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self.harness = str(_check_harness(harness))
        if not model_name:
            raise ValueError("HarnessAgent: no model; pass -m MODEL (a litellm model string such as openai/NAME)")
        if int(recursion_limit) < 1:
            raise ValueError(f"HarnessAgent recursion_limit={recursion_limit}: must be >= 1")
        if command_timeout_sec is not None and int(command_timeout_sec) < 1:
            raise ValueError(f"HarnessAgent command_timeout_sec={command_timeout_sec}: must be >= 1 or unset")
        self.model_config = {"solver": model_name, "api_base": api_base, "api_key_env": api_key_env,
                             "temperature": None if temperature is None else float(temperature)}
        _check_key(self.model_config)
        self.recursion_limit = int(recursion_limit)
        self.command_timeout_sec = None if command_timeout_sec is None else int(command_timeout_sec)
        self._harness_id = harness_id(self.harness)

    @staticmethod
    def name() -> str:
        return "milo-ray-harness"

    def version(self) -> str:
        return f"{milo_ray.__version__}+{self._harness_id}"

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None, env: Any = None) -> None:
        """Refuse a missing harness before Harbor queues any trial."""
        super().preflight(kwargs, env)
        _check_harness((kwargs or {}).get("harness"))

    async def setup(self, environment: BaseEnvironment) -> None:
        """Nothing to install: the agent runs in Harbor's process and reaches the
        environment only through exec and file copies."""

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        module = load_harness(self.harness)
        backend = HarborSandbox(environment, asyncio.get_running_loop(), timeout_sec=self.command_timeout_sec)
        agent = getattr(module, ENTRY_FUNCTION)(build_chat_model(self.model_config), backend)
        usage = _UsageCallback()
        messages: list[Any] = []
        stopped = "finished"
        try:
            config = {"recursion_limit": self.recursion_limit, "callbacks": [usage]}
            async for state in agent.astream({"messages": [{"role": "user", "content": instruction}]},
                                             config=config, stream_mode="values"):
                messages = list(state.get("messages") or messages)
                self._fill(context, usage.tally, stopped)  # kept current in case Harbor's timeout cancels us
        except Exception as e:
            from langgraph.errors import GraphRecursionError

            if not isinstance(e, GraphRecursionError):
                stopped = f"error: {type(e).__name__}: {e}"
                raise
            # Out of steps is an outcome of the harness, not a crash: grade the workspace as left.
            stopped = f"recursion_limit {self.recursion_limit} reached"
            self.logger.warning("HarnessAgent: %s", stopped)
        except BaseException:  # cancelled by Harbor's agent timeout
            stopped = "cancelled"
            raise
        finally:
            self._fill(context, usage.tally, stopped)
            self._write_messages(messages, usage.tally, stopped)

    def _fill(self, context: AgentContext, tally: UsageTally, stopped: str) -> None:
        context.n_input_tokens = tally.input_tokens
        context.n_output_tokens = tally.output_tokens
        context.n_cache_tokens = tally.cache_tokens
        context.cost_usd = price(self.model_config, tally.input_tokens, tally.output_tokens)
        context.metadata = {**(context.metadata or {}), "harness": self.harness, "harness_id": self._harness_id,
                            "llm_calls": tally.calls, "stopped": stopped}

    def _write_messages(self, messages: list[Any], tally: UsageTally, stopped: str) -> None:
        from langchain_core.messages import messages_to_dict

        self.logs_dir.mkdir(parents=True, exist_ok=True)
        record = {"harness": self.harness, "harness_id": self._harness_id, "model": self.model_name,
                  "stopped": stopped, "usage": asdict(tally), "messages": messages_to_dict(messages)}
        (self.logs_dir / MESSAGES_FILE).write_text(json.dumps(record, indent=1, default=str))


def _check_harness(harness: Any) -> Path:
    if not harness:
        raise ValueError("HarnessAgent: no harness; pass --ak harness=PATH (a harness directory or .py file)")
    return harness_entry(harness).parent if Path(str(harness)).expanduser().is_dir() else harness_entry(harness)


def _check_key(model_config: dict[str, Any]) -> None:
    try:
        api_key(model_config)
    except ValueError as e:
        raise ValueError(f"HarnessAgent: {e} (here: --ak api_key_env=NAME)") from None
