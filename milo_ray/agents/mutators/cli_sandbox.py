"""Running a coding-agent CLI inside bubblewrap, its model calls going only to the run's
model gateway, with a per-call token instead of a provider key.

A CLI mutator (Claude Code, Codex) is an agent that reads task-derived text (evidence,
trajectories) and runs shell commands: it is untrusted like a harness. Here it runs in a
bwrap sandbox with the mutation's workspace at ``/workspace`` (the only writable place
besides its scratch ``HOME``, ``/tmp`` and ``/logs``), the host system, the CLI's install
directory and the lineage files the snapshot names read-only, a clean environment and no
network. Its one way out is the gateway:

* on the host, :class:`UnixRelay` listens on a Unix socket in a fresh directory and forwards
  every connection to the gateway's TCP address;
* that directory is bound read-only into the sandbox (a socket on a read-only mount can still
  be connected to), and :data:`RELAY_SCRIPT`, started before the CLI, listens on
  ``127.0.0.1:<port>`` inside the sandbox's own network namespace and forwards to the socket;
* the CLI's provider base URL points at that loopback address (Claude Code:
  ``ANTHROPIC_BASE_URL`` + ``ANTHROPIC_AUTH_TOKEN``; Codex: a ``model_providers`` entry of
  its config, given with ``-c``, whose ``base_url`` is that address, ``wire_api`` the
  Responses API and ``env_key`` ``OPENAI_API_KEY``), and the token it presents is one the
  gateway issued for this call alone and revokes when the call ends.

The gateway is any object with the :class:`ModelGateway` protocol (the run's host-side
gateway, or a test's fake). Only ``http://`` gateways on the host are supported: the relay
carries bytes, so a TLS certificate would not match the loopback name the CLI sees.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable
from urllib.parse import unquote, urlsplit, urlunsplit

from milo_ray.boundary.sandbox.interpreter import interpreter_env, interpreter_paths

# The loopback port the relay listens on inside the sandbox (its own network namespace:
# no other process can hold it).
SANDBOX_PORT = 18080
SOCKET_NAME = "gateway.sock"
# Largest file the CLI may write (RLIMIT_FSIZE, set by the command's shell): its transcript
# and stderr land in /logs. Not the spec's storage_mb, which would put the workspace on a
# volume of the sandbox's own, gone when it closes: the caller reads the workspace after.
FILE_LIMIT_MB = 64
# How each preset reaches a gateway: the API flavour it speaks, the variables that take
# the base URL and the token, and arguments that point it there (``{base_url}``: the URL as
# the CLI sees it, ``{token_env}``: the token's variable). ANTHROPIC_API_KEY is set empty:
# any value would take precedence over ANTHROPIC_AUTH_TOKEN (and bypass the gateway's token).
#
# Codex speaks only the Responses API (``wire_api = "chat"`` is refused by current
# releases) and reads its provider from config: the arguments define a provider of its
# own (``model_providers.milo_gateway``) so that it never falls back to OpenAI's endpoint,
# its login or its WebSocket transport, and leave retrying to the gateway (whose retries
# are the run's policy). Its own sandbox is bypassed, as Codex documents for a run that is
# sandboxed from outside: this sandbox is the boundary, and a second one nested inside it
# works only where the host lets an unprivileged user create namespaces within it.
CODEX_PROVIDER = "milo_gateway"
PRESET_GATEWAY: dict[str, dict[str, Any]] = {
    "claude": {"api": "anthropic", "base_url_env": "ANTHROPIC_BASE_URL", "token_env": ("ANTHROPIC_AUTH_TOKEN",),
               "extra": {"ANTHROPIC_API_KEY": "", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                         "DISABLE_AUTOUPDATER": "1"},
               "args": ()},
    "codex": {"api": "openai", "base_url_env": "OPENAI_BASE_URL", "token_env": ("OPENAI_API_KEY",),
              "extra": {},
              "args": ("--dangerously-bypass-approvals-and-sandbox",
                       "-c", f'model_provider="{CODEX_PROVIDER}"',
                       "-c", f'model_providers.{CODEX_PROVIDER}.name="milo model gateway"',
                       "-c", f'model_providers.{CODEX_PROVIDER}.base_url="{{base_url}}"',
                       "-c", f'model_providers.{CODEX_PROVIDER}.env_key="{{token_env}}"',
                       "-c", f'model_providers.{CODEX_PROVIDER}.wire_api="responses"',
                       "-c", f"model_providers.{CODEX_PROVIDER}.supports_websockets=false",
                       "-c", f"model_providers.{CODEX_PROVIDER}.request_max_retries=0",
                       "-c", f"model_providers.{CODEX_PROVIDER}.stream_max_retries=0")},
}


def gateway_args(vars_: dict[str, Any], base_url: str) -> list[str]:
    """The preset's arguments that point its CLI at the gateway (see :data:`PRESET_GATEWAY`)."""
    return [a.replace("{base_url}", base_url).replace("{token_env}", vars_["token_env"][0])
            for a in vars_.get("args", ())]


@runtime_checkable
class ModelGateway(Protocol):
    """The host-side model gateway as a CLI mutator uses it.

    ``base_url(api)``: the http URL a client of API flavour ``api`` (``"openai"``: chat
    completions / responses; ``"anthropic"``: messages) sends its requests to, as a
    provider base URL (a client appends ``/v1/messages``, ``/chat/completions``...).
    ``issue_token(role=, caller=)``: a fresh token the gateway accepts for one agent call
    (metered against ``role``/``caller``), worthless elsewhere. ``revoke_token(token)``:
    the call ended; the gateway refuses the token from now on."""

    def base_url(self, api: str) -> str: ...

    def issue_token(self, *, role: str, caller: str) -> str: ...

    def revoke_token(self, token: str) -> None: ...


def gateway_address(url: str) -> tuple[str, int] | str:
    """(host, port) of an ``http://`` gateway URL, or the socket path of an
    ``http+unix://<percent-encoded socket path>/...`` one; ``ValueError`` otherwise."""
    parts = urlsplit(url)
    if parts.scheme == "http+unix" and parts.netloc:
        return unquote(parts.netloc)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"gateway base URL {url!r}: must be an http:// URL of a host-side gateway "
                         "(the sandbox relays plain TCP to it)")
    return parts.hostname, parts.port or 80


def inside_url(url: str) -> str:
    """The gateway URL as the CLI sees it: the relay's loopback address, same path."""
    parts = urlsplit(url)
    return urlunsplit(("http", f"127.0.0.1:{SANDBOX_PORT}", parts.path, parts.query, ""))


# --------------------------------------------------------------------------- relays

class UnixRelay:
    """Host side: a Unix socket in a fresh private directory whose every connection is
    forwarded to ``target``: ``(host, port)``, or the path of the gateway's own Unix
    socket (whose directory stays private: only this relay's is shown to the sandbox).
    Usable as a context manager; ``close`` stops it."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target if isinstance(target, str) else (target[0], int(target[1]))
        self.dir = Path(tempfile.mkdtemp(prefix="milo-gw-"))
        # The sandbox's commands run as an unprivileged user, who must be able to reach the
        # socket: traverse-only on the directory (nothing to list), the socket itself open.
        # What answers behind it still asks for a per-call token.
        os.chmod(self.dir, 0o711)
        self.path = self.dir / SOCKET_NAME
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o666)  # the sandbox's user may differ from ours
        self._sock.listen(64)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="gateway-relay", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        try:
            if isinstance(self.target, str):
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                upstream.settimeout(30)
                upstream.connect(self.target)
            else:
                upstream = socket.create_connection(self.target, timeout=30)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        _splice(conn, upstream)

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "UnixRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes; then close both."""

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    t = threading.Thread(target=pump, args=(b, a), daemon=True)
    t.start()
    pump(a, b)
    t.join(60)
    a.close()
    b.close()


# Sandbox side (stdlib only; runs as ``python3 -c``): listen on the loopback port, then fork
# so the shell sees the exit only once connections can be accepted; the child forwards each
# connection to the bound Unix socket until the sandbox ends.
RELAY_SCRIPT = r"""
import os, socket, sys, threading
sock_path, port = sys.argv[1], int(sys.argv[2])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port)); ls.listen(64)
if os.fork():
    os._exit(0)
os.setsid()
def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def serve(c):
    u = socket.socket(socket.AF_UNIX)
    try:
        u.connect(sock_path)
    except OSError:
        c.close(); return
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
    pump(c, u)
while True:
    conn, _ = ls.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


# --------------------------------------------------------------------------- the run

@dataclass(frozen=True)
class SandboxedRun:
    """The outcome of one sandboxed CLI run (as :class:`~milo_ray.agents.mutators.cli.CliRun`)."""

    returncode: int | None
    timed_out: bool = False
    launch_error: str | None = None


def readonly_paths(exe: str, extra: Sequence[str], external: Sequence[str]) -> list[str]:
    """Host paths the CLI's sandbox shows read-only besides the system directories: the
    CLI's install directory (where its executable really lives; for a CLI installed from
    npm, the ``node_modules`` directory holding its package, whose launcher finds the
    platform binary in a sibling package), this interpreter (a script CLI's shebang),
    ``extra`` (``sandbox_readonly``) and the lineage files the snapshot names."""

    real = os.path.realpath(exe)
    paths = [os.path.dirname(real), os.path.dirname(os.path.abspath(exe))]
    paths += [str(d) for d in Path(real).parents if d.name == "node_modules"][:1]
    paths += interpreter_paths() + [str(p) for p in extra] + list(external)
    out: list[str] = []
    for p in paths:
        if p and p not in out:
            out.append(p)
    return out


def run_in_sandbox(argv: list[str], *, scratch: Path, env: dict[str, str], readonly: Sequence[str],
                   relay: UnixRelay | None, stdout: Path, stderr: Path, time_cap_s: float,
                   output_cap_bytes: int = 100_000) -> SandboxedRun:
    """Run ``argv`` (its executable a host path the sandbox shows) in a bwrap sandbox whose
    workdir ``/workspace`` is ``scratch/workspace`` (prepared by the caller), with ``env``
    as its whole environment (plus the sandbox's PATH/HOME/LANG), the relay to the gateway
    when given, and the CLI's stdout/stderr written to ``stdout``/``stderr`` on the host."""
    from milo_ray.boundary.sandbox.base import SandboxSpec
    from milo_ray.boundary.sandbox.bwrap import DEFAULT_HOST_READONLY, BwrapSandboxFactory

    ro = list(readonly) + ([str(relay.dir)] if relay is not None else [])
    factory = BwrapSandboxFactory(command_timeout_s=time_cap_s, output_cap_bytes=output_cap_bytes,
                                  host_readonly=(*DEFAULT_HOST_READONLY, *ro))
    spec = SandboxSpec(task_id="cli-mutation", workdir="/workspace", allow_internet=False,
                       env={**interpreter_env(), **env})
    try:
        sandbox = factory.open(spec, scratch)
    except Exception as e:
        return SandboxedRun(None, launch_error=f"could not open the CLI's sandbox: {e}")
    try:
        steps = [f"ulimit -f {FILE_LIMIT_MB * 1024}"]  # 1 KiB blocks; soft and hard, so it stays
        if relay is not None:
            steps.append(" ".join(shlex.quote(a) for a in (sys.executable, "-c", RELAY_SCRIPT, str(relay.path),
                                                           str(SANDBOX_PORT))))
        cli = " ".join(shlex.quote(a) for a in argv)
        steps.append(f"exec {cli} </dev/null >/logs/cli-stdout.txt 2>/logs/cli-stderr.txt")
        run = sandbox.execute(" && ".join(steps), timeout=max(1, int(time_cap_s + 0.999)))
        for name, dest in (("cli-stdout.txt", stdout), ("cli-stderr.txt", stderr)):
            got = sandbox.download_files([f"/logs/{name}"])[0]
            dest.write_bytes(got.content or b"")
        timed_out = run.exit_code == 124 and "timed out after" in (run.output or "")[-300:]
        if run.exit_code == 127 and not stdout.stat().st_size:
            return SandboxedRun(None, launch_error=f"the sandbox could not start {argv[0]!r}: {(run.output or '')[-300:]}")
        return SandboxedRun(None if timed_out else run.exit_code, timed_out=timed_out)
    finally:
        sandbox.close()
