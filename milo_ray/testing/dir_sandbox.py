"""A small real sandbox for tests: the task's absolute paths (the workdir, /logs, /tests,
/solution, /tmp) are host directories under one root, mounted at those paths with
``bwrap`` over a read-only view of the host system, so real Harbor scripts that write
``/logs/verifier/reward.txt`` run unchanged. No network unless the spec allows it.

It honours ``SandboxSpec.copy_in`` and ``env``; it ignores ``needs_docker`` (tests choose
their tasks) and resource limits. Limitation: the workdir must be a top-level path or sit
under one of the mapped directories (bwrap cannot create a mount point inside the
read-only host tree).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse

from milo_ray.boundary.sandbox.base import LOGS_DIR, SOLUTION_DIR, TESTS_DIR, Sandbox, SandboxSpec
from milo_ray.boundary.sandbox.process import CappedProcess, start_capped

OUTPUT_CAP = 200_000


class DirSandbox(Sandbox):
    def __init__(self, root: Path, *, workdir: str = "/app", env: dict[str, str] | None = None,
                 allow_internet: bool = False, default_timeout: int = 120):
        if shutil.which("bwrap") is None:
            raise RuntimeError("DirSandbox needs bwrap on PATH")
        self.root = Path(root)
        self.workdir = workdir
        self.env = dict(env or {})
        self.allow_internet = allow_internet
        self.default_timeout = default_timeout
        self._procs: set[CappedProcess] = set()
        self.closed = False
        # sandbox path -> host dir, longest first so nested paths map to the inner mount
        targets = [workdir, LOGS_DIR, TESTS_DIR, SOLUTION_DIR, "/tmp"]
        self.mounts = {t: self.root / t.strip("/").replace("/", "__") for t in dict.fromkeys(targets)}
        for host in self.mounts.values():
            host.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_spec(cls, spec: SandboxSpec, root: Path, **kw) -> "DirSandbox":
        sb = cls(root, workdir=spec.workdir, env=spec.env, allow_internet=spec.allow_internet, **kw)
        for host, target in spec.copy_in:
            dest = sb.host_path(target)
            if dest is None:
                raise ValueError(f"copy_in target {target!r} is outside the sandbox's writable paths")
            if Path(host).is_dir():
                shutil.copytree(host, dest, dirs_exist_ok=True)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(host, dest)
        return sb

    @property
    def id(self) -> str:
        return f"dir:{self.root}"

    def host_path(self, path: str) -> Path | None:
        """The host file behind an absolute sandbox path, or None outside the mounts."""
        p = PurePosixPath(path)
        if not p.is_absolute() or ".." in p.parts:
            return None
        for target in sorted(self.mounts, key=len, reverse=True):
            t = PurePosixPath(target)
            if p == t or t in p.parents:
                return self.mounts[target].joinpath(*p.relative_to(t).parts)
        return None

    def _bwrap_args(self) -> list[str]:
        args = ["bwrap", "--die-with-parent", "--unshare-pid", "--dev", "/dev", "--proc", "/proc"]
        tops = {PurePosixPath(t).parts[1] for t in self.mounts}
        for entry in sorted(Path("/").iterdir()):
            if entry.name in ("proc", "dev") or entry.name in tops:
                continue
            if entry.is_symlink():
                args += ["--symlink", os.readlink(entry), str(entry)]
            else:
                args += ["--ro-bind", str(entry), str(entry)]
        for target in sorted(self.mounts, key=len):  # parents before nested mounts
            args += ["--bind", str(self.mounts[target]), target]
        if not self.allow_internet:
            args.append("--unshare-net")
        return args + ["--chdir", self.workdir]

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if self.closed:
            return ExecuteResponse(output="sandbox is closed", exit_code=1)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
               "LANG": "C.UTF-8", **self.env}
        limit = timeout or self.default_timeout
        # The output's last OUTPUT_CAP bytes are kept: a test reads what a script printed last.
        proc = start_capped([*self._bwrap_args(), "bash", "-c", command], timeout_s=limit, output_cap_bytes=0,
                            tail_bytes=OUTPUT_CAP, env=env)
        self._procs.add(proc)
        try:
            run = proc.wait()
        finally:
            self._procs.discard(proc)
        if run.timed_out:
            return ExecuteResponse(output=run.output + f"\n[timed out after {limit}s]", exit_code=124,
                                   truncated=run.truncated)
        return ExecuteResponse(output=run.output, exit_code=run.exit_code, truncated=run.truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, data in files:
            host = self.host_path(path)
            if host is None:
                out.append(FileUploadResponse(path=path, error="permission_denied"))
                continue
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_bytes(data)
            out.append(FileUploadResponse(path=path, error=None))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            host = self.host_path(path)
            if host is None or not host.is_file():
                out.append(FileDownloadResponse(path=path, content=None, error="file_not_found"))
            else:
                out.append(FileDownloadResponse(path=path, content=host.read_bytes(), error=None))
        return out

    def interrupt(self) -> None:
        for proc in list(self._procs):
            proc.kill()

    def close(self) -> None:
        self.interrupt()
        self.closed = True
