"""What a bubblewrap sandbox holds its commands to, and how a command's end reads.

:func:`enforced_limits` decides, for one sandbox, which limit each mechanism enforces
(a cgroup where the machine allows, an rlimit set by ``prlimit`` ahead of bwrap
otherwise, the :mod:`volume` for the total written) and says so in :class:`Limits`;
:func:`to_response` turns a capped run into what the agent reads.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from deepagents.backends.protocol import ExecuteResponse

from milo_ray.boundary.sandbox.base import SandboxSpec
from milo_ray.boundary.sandbox.cgroups import SandboxCgroup
from milo_ray.boundary.sandbox.process import CappedRun
from milo_ray.boundary.sandbox.volume import Volume


@dataclass(frozen=True)
class Limits:
    """Which resource limits a sandbox enforces, and by which mechanism (None: not
    enforced on this machine or not asked for)."""

    pids: str | None
    memory: str | None
    cpu: str | None
    file_size: str | None
    # The total every writable directory may hold (spec.storage_mb): a volume (:mod:`volume`).
    storage: str | None = None



def to_response(run: CappedRun, timeout_s: float | None) -> ExecuteResponse:
    """The agent-facing result: a timeout reads exit code 124 (as ``timeout(1)`` and
    deepagents' local shell report it) with a line saying what happened."""
    if run.timed_out:
        note = f"\nError: command timed out after {timeout_s:g} seconds and was killed.\n"
        return ExecuteResponse(output=run.output + note, exit_code=124, truncated=run.truncated)
    return ExecuteResponse(output=run.output, exit_code=run.exit_code, truncated=run.truncated)


def enforced_limits(cgroup: SandboxCgroup, spec: SandboxSpec, pids_limit: int | None,
                volume: Volume | None) -> tuple[Limits, list[str]]:
    """What a sandbox of ``spec`` enforces (:class:`Limits`), and the launcher prefix
    setting the rlimits before it execs bwrap (the rlimits are inherited by everything
    inside)."""
    cg = cgroup.enforced
    rlimits: list[str] = []
    pids = memory = cpu = file_size = None
    if pids_limit is not None:
        if "pids" in cg:
            pids = f"cgroup pids.max={pids_limit}"
        elif os.geteuid() != 0:
            # Counted per user namespace (bwrap makes one), so host processes of the
            # same uid do not use up the sandbox's allowance.
            rlimits.append(f"--nproc={pids_limit}")
            pids = f"RLIMIT_NPROC={pids_limit}"
    if spec.memory_mb is not None:
        if "memory" in cg:
            memory = f"cgroup memory limit {spec.memory_mb} MB"
        else:
            rlimits.append(f"--as={spec.memory_mb * 1024 * 1024}")
            memory = f"RLIMIT_AS={spec.memory_mb} MB per process"
    if spec.cpus is not None and "cpu" in cg:
        cpu = f"cgroup CPU quota {spec.cpus:g} CPUs"
    if spec.storage_mb is not None:
        rlimits.append(f"--fsize={spec.storage_mb * 1024 * 1024}")
        file_size = f"RLIMIT_FSIZE={spec.storage_mb} MB per file"
    storage = volume.mechanism if volume is not None else None
    launcher: list[str] = []
    if rlimits:
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise RuntimeError("the sandbox's rlimits need prlimit (util-linux), which is not installed")
        launcher += [prlimit, *rlimits, "--"]
    return Limits(pids, memory, cpu, file_size, storage), launcher
