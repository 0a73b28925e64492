"""A mutator (and SSR optimizer) that runs an installed coding-agent CLI: Claude Code
(``claude -p``), Codex (``codex exec``) or any command given as an argv template.

The CLI works in the same workspace (:mod:`milo_ray.agents.mutators.workspace`) and
reads the same instructions (:mod:`milo_ray.agents.prompts`) as every other coding
agent of the search; the child is read back from the workspace's ``out/`` and checked
the same way (nothing written, or written elsewhere, is a rejected child with the
reason).

Files, all beside ``request.workdir`` (never inside it: the runner reads every file
there as part of the child harness), named after it (``<workdir>`` below):

    <workdir>.cli-workspace/   the workspace (removed afterwards unless keep_workspace)
    <workdir>.cli-prompt.md    the rendered instructions (``{prompt_file}``), kept
    <workdir>.cli-stdout.txt   the CLI's stdout: its transcript (JSON / JSONL for the presets)
    <workdir>.cli-stderr.txt   the CLI's stderr

Where the CLI runs (a CLI reads task-derived text and runs commands: it is untrusted):

* by default, inside bubblewrap (:mod:`milo_ray.agents.mutators.cli_sandbox`): the
  workspace at ``/workspace``, the host system, the CLI's install directory and the lineage
  files read-only, a scratch HOME, a clean environment, no network but a relay to the run's
  model ``gateway``, to which the CLI's provider base URL points, with a per-call token the
  gateway issues and revokes instead of a key (a gateway with ``bind_token``, as the run's
  own, gives the token a socket of its own, the relay's only target, and refuses it on any
  other) (Claude Code: ``ANTHROPIC_BASE_URL`` and
  ``ANTHROPIC_AUTH_TOKEN``, the Messages API; Codex: a ``model_providers`` entry given with
  ``-c`` -- the gateway's URL, the Responses API, the token in ``OPENAI_API_KEY``; a custom
  ``command`` names its variables in ``base_url_env``/``token_env``). No key is given to it:
  ``pass_env`` may not name a credential;
* with ``trusted_host: true`` only, on the host as the user (for a CLI that cannot be
  pointed at a gateway, or is logged in to a subscription): the workspace as its working
  directory, HOME, PATH, LANG, the variables named in ``pass_env`` (an API key is passed
  by its name, never stored in config) and ``env``; every call logs a warning.

Either way the CLI runs in its own session (its whole process group is killed at the
cap) with stdin closed.

Usage, as the CLIs report it (checked against their documentation, late 2025):

* Claude Code, ``--output-format json``: one object ``{"type": "result", "result",
  "is_error", "num_turns", "total_cost_usd", "usage": {input_tokens, output_tokens,
  cache_creation_input_tokens, cache_read_input_tokens}}``. ``--output-format
  stream-json`` (and ``json`` with ``--verbose``, an array) end with that same object.
  Input tokens are counted as all three input fields: cache reads and writes are
  tokens the model processed (Anthropic's ``input_tokens`` excludes them).
* Codex, ``exec --json``: JSON lines; ``{"type": "turn.completed", "usage":
  {input_tokens, cached_input_tokens, output_tokens}}`` per turn (summed here;
  ``cached_input_tokens`` is a part of ``input_tokens``, not added), the final answer
  in ``{"type": "item.completed", "item": {"type": "agent_message", "text"}}`` (older
  releases: ``item_type: assistant_message``). Codex reports no USD.

A sandboxed CLI whose gateway meters its calls (``metered(token)``, as
:class:`milo_ray.boundary.gateway.mutation.MutationGateway` does) is charged what the
gateway recorded -- tokens and USD -- instead of what it printed.

USD: the CLI's own figure when it gives one; else tokens priced by
``usd_per_mtok_input/output`` or by ``model`` (litellm's prices, through
:func:`milo_ray.llm.client.price`); else None (unknown is never free). A run killed at
the cap has unknown spend (None) whatever it printed so far.

Limits: the cap here is this mutator's own; keep ``time_cap_s`` at or below the
runner's cap. On Ray the runner ends a hung worker with a forced cancel, which this
process cannot answer: a CLI still running then (its session detached from the
worker) is only ended by its own exit, so the mutator's cap must come first.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shlex
import shutil
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from milo_ray.llm.client import price, secret
from milo_ray.agents.mutators.cli_sandbox import (
    PRESET_GATEWAY, ModelGateway, UnixRelay, gateway_address, gateway_args, inside_url, readonly_paths,
    run_in_sandbox,
)
from milo_ray.agents.mutators.cli_usage import USAGE_FORMATS, CliUsage, parse_output
from milo_ray.agents.mutators.workspace import collect, prepare, template_for
from milo_ray.agents.prompts import render_from
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.llm.usage import AgentUsage
from milo_ray.boundary.sandbox.process import run_capped

PLACEHOLDERS = ("prompt", "prompt_file", "workspace", "output_path", "model")

# Presets: argv templates of the two CLIs the search is used with. ``--permission-mode
# acceptEdits`` lets Claude Code write files without asking (``-p`` cannot ask).
# ``host_args`` are added on the host only (``trusted_host``): there Codex's own sandbox is
# all there is, and its default for ``exec`` is read-only; ``workspace-write`` lets it write
# under its working directory (the workspace) and read everywhere. In the bwrap sandbox the
# preset's gateway arguments (:data:`~.cli_sandbox.PRESET_GATEWAY`) are added instead.
PRESETS: dict[str, dict[str, Any]] = {
    "claude": {
        "command": ["claude", "-p", "{prompt}", "--output-format", "json", "--permission-mode", "acceptEdits"],
        "model_args": ["--model", "{model}"],
        "host_args": [],
        "read_dir_flag": "--add-dir",
        "usage_format": "claude_json",
    },
    "codex": {
        "command": ["codex", "exec", "--json", "--skip-git-repo-check", "{prompt}"],
        "model_args": ["-m", "{model}"],
        "host_args": ["--sandbox", "workspace-write"],
        "read_dir_flag": None,
        "usage_format": "codex_jsonl",
    },
}

# Each output stream keeps its first MAX_STREAM_BYTES and its last TAIL_BYTES: a CLI
# that prints without end must not fill the disk, and the usage summary comes last.
MAX_STREAM_BYTES = 16 * 1024 * 1024
TAIL_BYTES = 1024 * 1024
# After SIGTERM to the group, how long the CLI gets to exit before SIGKILL.
KILL_GRACE_S = 3.0
REPORT_CHARS = 4000
# Environment names that hold credentials: their values belong in the environment the
# run starts with (passed by name, ``pass_env``), never in a config file.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
GATEWAY_APIS = ("openai", "anthropic")
SANDBOX_ROOT = "/workspace"
log = logging.getLogger(__name__)


class CliMutator:
    """Runs a coding-agent CLI as MILO's mutator or SSR's optimizer.

    command: argv template (a list, or one string split like a shell would) with the
        placeholders ``{prompt}`` (the instructions), ``{prompt_file}`` (a file holding
        them), ``{workspace}``, ``{output_path}``, ``{model}``; ``{{`` is a literal brace.
    preset: ``claude`` or ``codex`` instead of ``command``: the CLI's argv, its usage
        format, ``--model`` when ``model`` is set, and (Claude Code) ``--add-dir`` for
        every directory outside the workspace the snapshot names (other lineage nodes'
        files), which Claude Code would otherwise not let the agent read.
    usage_format: how stdout is read for usage and the final message: ``claude_json``,
        ``codex_jsonl``, ``none`` (usage unknown) or ``auto`` (recognised from the output).
    model: the CLI's model (``{model}``), and the name prices are looked up by.
    time_cap_s: the CLI's process group is killed after this many seconds.
    env: extra environment variables (no credentials: see ``pass_env``).
    pass_env: names of variables copied from this process's environment (API keys).
    keep_workspace: keep ``<workdir>.cli-workspace`` after the call (for inspection).
    usd_per_mtok_input / usd_per_mtok_output: prices when the CLI reports tokens only.
    gateway: the run's model gateway (a :class:`~milo_ray.agents.mutators.cli_sandbox.ModelGateway`,
        or a ``_target_`` mapping building one); the sandboxed CLI's only way to a model.
    trusted_host: run the CLI on the host with HOME and ``pass_env`` instead (no sandbox,
        no gateway), with a warning on every call.
    base_url_env / token_env / gateway_api: for a custom ``command`` in the sandbox, the
        variables its CLI reads the base URL and the key from, and the API it speaks
        (``openai`` or ``anthropic``); the presets know theirs.
    sandbox_readonly: more host paths the sandbox shows read-only (e.g. where ``node`` lives).
    """

    def __init__(self, command: Sequence[str] | str | None = None, *, preset: str | None = None,
                 name: str | None = None, usage_format: str | None = None, model: str | None = None,
                 time_cap_s: float = 2700.0, env: dict[str, str] | None = None, pass_env: Sequence[str] = (),
                 keep_workspace: bool = False, usd_per_mtok_input: float | None = None,
                 usd_per_mtok_output: float | None = None, gateway: Any = None, trusted_host: bool = False,
                 base_url_env: str | None = None, token_env: str | None = None, gateway_api: str = "openai",
                 sandbox_readonly: Sequence[str] = ()) -> None:
        if (command is None) == (preset is None):
            raise ValueError("CliMutator: give exactly one of `command` (an argv template) or `preset` "
                             f"({'|'.join(PRESETS)})")
        read_dir_flag = None
        if preset is not None:
            if preset not in PRESETS:
                raise ValueError(f"CliMutator: preset={preset!r}; expected one of {sorted(PRESETS)}")
            p = PRESETS[preset]
            argv = (list(p["command"]) + (list(p["model_args"]) if model else [])
                    + (list(p["host_args"]) if trusted_host else []))
            read_dir_flag = p["read_dir_flag"]
            usage_format = usage_format or p["usage_format"]
        else:
            argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        if not argv or not argv[0].strip():
            raise ValueError("CliMutator: `command` is empty; expected an argv like ['claude', '-p', '{prompt}']")
        for arg in argv:
            for field_name in _fields(arg):
                if field_name not in PLACEHOLDERS:
                    raise ValueError(f"CliMutator: `command` names an unknown placeholder {{{field_name}}} in "
                                     f"{arg!r}; placeholders: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        if "{" in argv[0]:
            raise ValueError(f"CliMutator: `command`'s executable {argv[0]!r} must not be a placeholder")
        if any("model" in _fields(a) for a in argv) and not model:
            raise ValueError("CliMutator: `command` uses {model} but `model` is not set")
        usage_format = usage_format or "auto"
        if usage_format not in USAGE_FORMATS:
            raise ValueError(f"CliMutator: usage_format={usage_format!r}; expected one of {list(USAGE_FORMATS)}")
        if not float(time_cap_s) > 0:
            raise ValueError(f"CliMutator: time_cap_s={time_cap_s} must be > 0")
        env = dict(env or {})
        for k, v in env.items():
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or not isinstance(v, str):
                raise ValueError(f"CliMutator: env entry {k!r}={v!r}: names must be identifiers, values strings")
            if _SECRET_NAME.search(k):
                raise ValueError(f"CliMutator: env sets {k}, which looks like a credential; put its name in "
                                 "`pass_env` and set it in the environment the run starts with")
        pass_env = [str(n) for n in pass_env]
        for n in pass_env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n):
                raise ValueError(f"CliMutator: pass_env entry {n!r} is not a variable name")
        if (usd_per_mtok_input is None) != (usd_per_mtok_output is None):
            raise ValueError("CliMutator: set both usd_per_mtok_input and usd_per_mtok_output, or neither")
        for field_name, value in (("usd_per_mtok_input", usd_per_mtok_input),
                                  ("usd_per_mtok_output", usd_per_mtok_output)):
            if value is not None and float(value) < 0:
                raise ValueError(f"CliMutator: {field_name}={value} must be >= 0")
        self.argv = argv
        self.preset = preset
        self.name = name or f"cli:{preset or Path(argv[0]).name}"
        self.usage_format = usage_format
        self.model = model
        self.time_cap_s = float(time_cap_s)
        self.env = env
        self.pass_env = pass_env
        self.keep_workspace = bool(keep_workspace)
        self.read_dir_flag = read_dir_flag
        self.prices = (None if usd_per_mtok_input is None
                       else (float(usd_per_mtok_input), float(usd_per_mtok_output)))  # type: ignore[arg-type]
        self.trusted_host = bool(trusted_host)
        self.gateway = gateway
        self.sandbox_readonly = [str(p) for p in sandbox_readonly]
        for p in self.sandbox_readonly:
            if not p.startswith("/"):
                raise ValueError(f"CliMutator: sandbox_readonly entry {p!r} must be an absolute path")
        self.gateway_vars = self._gateway_vars(preset, base_url_env, token_env, gateway_api)

    def _gateway_vars(self, preset: str | None, base_url_env: str | None, token_env: str | None,
                      gateway_api: str) -> dict[str, Any] | None:
        """How the sandboxed CLI is pointed at the gateway (None: it runs on the host)."""
        if self.trusted_host:
            return None
        secret = [n for n in self.pass_env if _SECRET_NAME.search(n)]
        if secret:
            raise ValueError(f"CliMutator {self.name}: pass_env names {secret}, but a sandboxed CLI never gets a "
                             "key: it reaches its model through the gateway with a per-call token. Remove them, or "
                             "set trusted_host: true to run the CLI on the host with your keys")
        if preset is not None and base_url_env is None:
            return dict(PRESET_GATEWAY[preset])
        if gateway_api not in GATEWAY_APIS:
            raise ValueError(f"CliMutator: gateway_api={gateway_api!r}; expected one of {list(GATEWAY_APIS)}")
        if not base_url_env or not token_env:
            raise ValueError(f"CliMutator {self.name}: a custom `command` runs in the sandbox only when it can be "
                             "pointed at the model gateway: set base_url_env and token_env (the variables its CLI "
                             "reads the base URL and the key from), or set trusted_host: true to run it on the host")
        for n in (base_url_env, token_env):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n):
                raise ValueError(f"CliMutator: {n!r} is not a variable name (base_url_env/token_env)")
        return {"api": gateway_api, "base_url_env": base_url_env, "token_env": (token_env,), "extra": {}}

    # ------------------------------------------------------------------ the call

    def mutate(self, request: MutationRequest) -> MutationResult:
        """Run the CLI on ``request``'s workspace; the child is copied to
        ``request.workdir``. Never raises: a failure is ``MutationResult.error``."""
        t0 = time.monotonic()
        try:
            return self._mutate(request, t0)
        except Exception as e:  # a broken workspace or an OS error is a rejected child
            why = f"cli mutator failed: {type(e).__name__}: {e}"[:2000]
            return MutationResult(None, error=why,
                                  usage=AgentUsage(cost_usd=None, seconds=time.monotonic() - t0, error=why))

    def _mutate(self, request: MutationRequest, t0: float) -> MutationResult:
        workdir = Path(request.workdir)
        base = workdir.parent / workdir.name
        paths = {k: Path(f"{base}.cli-{k}") for k in ("workspace", "prompt.md", "stdout.txt", "stderr.txt")}
        env = self._environment()
        exe = shutil.which(self.argv[0], path=env["PATH"] if self.trusted_host else os.environ.get("PATH", os.defpath))
        if exe is None:
            why = f"executable {self.argv[0]!r} not found on PATH"
            return MutationResult(None, error=why, usage=AgentUsage(cost_usd=0.0, seconds=time.monotonic() - t0,
                                                                    error=why))
        if self.trusted_host:
            log.warning("CliMutator %s: trusted_host=true: %s runs on the host, unsandboxed, with HOME and %s",
                        self.name, self.argv[0], ", ".join(self.pass_env) or "no pass_env variables")
            return self._run_on_host(request, exe, env, paths, t0)
        return self._run_sandboxed(request, exe, paths, t0)

    def _argv(self, exe: str, prompt: str, prompt_file: str, ws: Any) -> list[str]:
        values = {"prompt": prompt, "prompt_file": prompt_file, "workspace": ws.agent_root,
                  "output_path": ws.seen(ws.output_path), "model": self.model or ""}
        argv = [exe] + [a.format(**values) for a in self.argv[1:]]
        if self.read_dir_flag:
            for d in ws.external_dirs():
                argv += [self.read_dir_flag, d]
        return argv

    def _run_on_host(self, request: MutationRequest, exe: str, env: dict[str, str], paths: dict[str, Path],
                     t0: float) -> MutationResult:
        try:
            ws = prepare(request, paths["workspace"])

            prompt = render_from(template_for(request), ws.values())
            paths["prompt.md"].write_text(prompt, encoding="utf-8")
            argv = self._argv(exe, prompt, str(paths["prompt.md"]), ws)
            run = _run(argv, cwd=ws.root, env=env, stdout=paths["stdout.txt"], stderr=paths["stderr.txt"],
                       time_cap_s=self.time_cap_s)
            return self._outcome(request, run, ws, paths, t0)
        finally:
            if not self.keep_workspace:
                shutil.rmtree(paths["workspace"], ignore_errors=True)

    def _gateway(self) -> Any:
        gw = self.gateway
        if isinstance(gw, dict) and "_target_" in gw:
            from hydra.utils import instantiate

            gw = self.gateway = instantiate(gw, _convert_="all")
        return gw

    def _run_sandboxed(self, request: MutationRequest, exe: str, paths: dict[str, Path], t0: float) -> MutationResult:
        import tempfile

        gateway = self._gateway()
        if not isinstance(gateway, ModelGateway):
            why = (f"CliMutator {self.name}: no model gateway to send the sandboxed CLI's model calls to; configure "
                   "the run's gateway, or set trusted_host: true to run the CLI on the host with your keys")
            return MutationResult(None, error=why, usage=AgentUsage(cost_usd=0.0, seconds=time.monotonic() - t0,
                                                                    error=why))
        vars_ = self.gateway_vars or {}
        scratch = Path(tempfile.mkdtemp(prefix="milo-cli-"))
        token = None
        try:
            url = gateway.base_url(vars_["api"])
            target = gateway_address(url)
            ws = prepare(request, scratch / "workspace", agent_root=SANDBOX_ROOT)

            prompt = render_from(template_for(request), ws.values())
            paths["prompt.md"].write_text(prompt, encoding="utf-8")
            (scratch / "logs").mkdir(exist_ok=True)
            (scratch / "logs" / "prompt.md").write_text(prompt, encoding="utf-8")
            argv = self._argv(exe, prompt, "/logs/prompt.md", ws) + gateway_args(vars_, inside_url(url))
            token = gateway.issue_token(role="mutator", caller=self.name)
            if callable(getattr(gateway, "bind_token", None)):
                # The token's own socket: the relay carries the CLI there, and the token is
                # worthless on any other (a leaked one cannot be spent from elsewhere).
                target = gateway.bind_token(token)
            env = {k: os.environ[k] for k in ("LANG",) if k in os.environ}
            env.update({k: os.environ[k] for k in self.pass_env if k in os.environ})
            env.update(self.env)
            env.update(vars_.get("extra", {}))
            env[vars_["base_url_env"]] = inside_url(url)
            for name in vars_["token_env"]:
                env[name] = token
            with UnixRelay(target) as relay:
                run = run_in_sandbox(argv, scratch=scratch, env=env,
                                     readonly=readonly_paths(exe, self.sandbox_readonly, ws.external_dirs()),
                                     relay=relay, stdout=paths["stdout.txt"], stderr=paths["stderr.txt"],
                                     time_cap_s=self.time_cap_s)
            # A gateway that meters its calls says what the CLI spent (the CLI's own
            # report is what an untrusted program prints).
            metered = gateway.metered(token) if callable(getattr(gateway, "metered", None)) else None
            return self._outcome(request, run, ws, paths, t0, metered=metered)
        finally:
            if token is not None:
                gateway.revoke_token(token)
            if self.keep_workspace and (scratch / "workspace").is_dir():
                shutil.rmtree(paths["workspace"], ignore_errors=True)
                shutil.move(str(scratch / "workspace"), paths["workspace"])
            shutil.rmtree(scratch, ignore_errors=True)

    def _outcome(self, request: MutationRequest, run: Any, ws: Any, paths: dict[str, Path],
                 t0: float, metered: dict[str, Any] | None = None) -> MutationResult:
        """The result of a finished CLI run (on the host or in the sandbox); ``metered``:
        the gateway's account of its calls, which replaces the CLI's own."""
        workdir = Path(request.workdir)
        seconds = time.monotonic() - t0
        stdout = _read(paths["stdout.txt"])
        parsed = parse_output(stdout, self.usage_format)
        if metered is not None:
            parsed = dataclasses.replace(parsed, input_tokens=int(metered["input_tokens"]),
                                         output_tokens=int(metered["output_tokens"]),
                                         cost_usd=metered["cost_usd"], tokens_reported=True)
        report = (parsed.final_message or _tail(stdout, REPORT_CHARS)).strip()[:REPORT_CHARS]
        if run.launch_error is not None:
            why = f"could not start {self.argv[0]!r}: {run.launch_error}"
            return MutationResult(None, error=why, usage=AgentUsage(cost_usd=0.0, seconds=seconds, error=why))
        if run.timed_out:
            why = f"timed out after {self.time_cap_s:g}s"
            usage = AgentUsage(parsed.input_tokens, parsed.output_tokens,
                               cost_usd=metered["cost_usd"] if metered is not None else None, seconds=seconds,
                               error=why)
            return MutationResult(None, report=report, error=why, usage=usage)
        usage = AgentUsage(parsed.input_tokens, parsed.output_tokens, cost_usd=self._cost(parsed),
                           seconds=seconds)
        child, reason = ws.child()
        if child is None:
            if run.returncode != 0:
                reason = (f"{self.argv[0]} exited with code {run.returncode}"
                          + (f" ({parsed.error})" if parsed.error else "")
                          + f"; stderr: {_last_lines(_read(paths['stderr.txt']))}"
                          + self._missing_env_note() + f"; {reason}")
            elif parsed.error:
                reason = f"{reason}; the CLI reported: {parsed.error}"
            return MutationResult(None, report=report, error=reason[:2000], usage=usage.with_error(reason[:2000]))
        collect(ws, workdir)
        if run.returncode != 0:  # the child is still judged on its own merits
            report = f"[{self.argv[0]} exited with code {run.returncode}]\n{report}"
        return MutationResult(child, report=report, usage=usage)

    def _environment(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
        env.setdefault("PATH", os.defpath)
        # Key variables come as the driver handed them to this task (llm/client.py:use_secrets),
        # else from this process's environment.
        env.update({k: v for k in self.pass_env if (v := secret(k))})
        env.update(self.env)
        return env

    def _missing_env_note(self) -> str:
        missing = [n for n in self.pass_env if not secret(n)]
        return f"; pass_env names not set here: {', '.join(missing)}" if missing else ""

    def _cost(self, parsed: CliUsage) -> float | None:
        if parsed.cost_usd is not None:
            return parsed.cost_usd
        if not parsed.tokens_reported:
            return None
        if self.prices is not None:
            return (parsed.input_tokens * self.prices[0] + parsed.output_tokens * self.prices[1]) / 1e6
        if self.model:
            return price({"solver": self.model}, parsed.input_tokens, parsed.output_tokens)
        return None


def _fields(arg: str) -> list[str]:
    """Placeholder names in one argv element (``{{`` is a literal brace). A field with
    an attribute, index, conversion or format spec is returned whole, so it is refused
    as unknown."""
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as e:
        raise ValueError(f"CliMutator: `command` element {arg!r} is not a valid template: {e}") from None
    out = []
    for _, field_name, spec, conv in parsed:
        if field_name is None:
            continue
        out.append(field_name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else ""))
    return out


# --------------------------------------------------------------------------- running

@dataclass(frozen=True)
class CliRun:
    returncode: int | None
    timed_out: bool = False
    launch_error: str | None = None


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], stdout: Path, stderr: Path,
         time_cap_s: float) -> CliRun:
    """Run ``argv`` in its own session; past the cap, end its whole process group
    (SIGTERM, then SIGKILL after KILL_GRACE_S); whatever the CLI left running in its
    group (servers, shells) ends with it. Its stdout and stderr go to the two files."""
    try:
        run = run_capped(argv, timeout_s=time_cap_s, output_cap_bytes=MAX_STREAM_BYTES, tail_bytes=TAIL_BYTES,
                         separate_stderr=True, term_grace_s=KILL_GRACE_S, env=env, cwd=str(cwd))
    except OSError as e:
        stdout.write_bytes(b"")
        stderr.write_bytes(b"")
        hint = ("; the prompt is past the OS's limit for one argument: pass it as {prompt_file}"
                if e.errno == errno.E2BIG else "")
        return CliRun(None, launch_error=f"{type(e).__name__}: {e}{hint}")
    stdout.write_text(run.output, encoding="utf-8")
    stderr.write_text(run.stderr or "", encoding="utf-8")
    return CliRun(run.exit_code, timed_out=run.timed_out)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def _tail(text: str, n: int) -> str:
    return text[-n:]


def _last_lines(text: str, n: int = 10) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-1500:] or "(empty)"
