"""The Docker sandbox's control calls: what it asks the daemon, and the shell programs it
runs inside a container to find and kill processes.

:func:`probe_daemon` is asked once per factory before any task runs: the daemon's CPU count
(``--cpus`` cannot exceed it) and whether it applies a seccomp profile to containers -- the
layer that refuses the keyring, ptrace, mount and namespace calls (docs/security.md): a
daemon without one (``docker info`` SecurityOptions lacking ``seccomp``, or its profile
``unconfined``) is refused before the run unless the user opts out. :func:`oom_kills` reads
a container's OOM kills from its memory cgroup on this host. :data:`SWEEP` and
:data:`MAIN_PID` run inside as the commands' own uid: every process of the container is that
uid's, so no capability is needed to see or kill them.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from milo_ray.boundary.sandbox.process import run_capped

log = logging.getLogger(__name__)

LABEL = "milo-ray.sandbox"
# Control-plane calls (run, rm, the kill sweep, cp) answer in well under a second on an idle
# daemon; a daemon busy with builds and many containers can stall for tens of seconds.
CONTROL_TIMEOUT_S = 120.0
CONTROL_OUTPUT_CAP = 64 * 1024

# Kills every process except PID 1 (docker-init), the main ``sleep`` ($1) and itself -- or
# with a marker ($2), only the processes whose environment holds it. Zombies are skipped
# (already dead, reaped by their parent). It repeats while it finds victims, since a victim
# may fork between the listing and the kill. Builtins only in the loop (busybox-compatible):
# under ``--pids-limit`` a fork may be refused.
SWEEP = r"""
main=$1; marker=$2; pass=0
while [ "$pass" -lt 20 ]; do
  found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$p" in 1|"$$"|"$main") continue;; esac
    st=; while read -r k v rest; do [ "$k" = State: ] && { st=$v; break; }; done 2>/dev/null < "$d/status"
    [ -z "$st" ] || [ "$st" = Z ] && continue
    if [ -n "$marker" ]; then
      tr '\000' '\n' < "$d/environ" 2>/dev/null | grep -qxF "$marker" || continue
    fi
    kill -9 "$p" 2>/dev/null && found=1
  done
  [ "$found" = 0 ] && exit 0
  pass=$((pass+1))
done
"""

# Right after ``docker run``, the only child of docker-init (PID 1) is the main process.
MAIN_PID = r"""
for d in /proc/[0-9]*; do
  while read -r k v rest; do [ "$k" = PPid: ] && { [ "$v" = 1 ] && echo "${d#/proc/}"; break; }; done 2>/dev/null < "$d/status"
done
"""


@dataclass(frozen=True)
class DaemonFacts:
    """What a run needs to know of the daemon: its CPU count and its seccomp options."""

    cpus: float
    security_options: tuple[str, ...]

    @property
    def seccomp(self) -> bool:
        """Whether the daemon gives containers a seccomp profile (not ``unconfined``)."""
        for option in self.security_options:
            fields = dict(f.partition("=")[::2] for f in option.split(","))
            if fields.get("name") == "seccomp" and fields.get("profile") != "unconfined":
                return True
        return False


def probe_daemon(docker: tuple[str, ...]) -> DaemonFacts | str:
    """The daemon's facts, or why it does not answer."""
    try:
        done = subprocess.run([*docker, "info", "--format", "{{.NCPU}} {{json .SecurityOptions}}"],
                              capture_output=True, text=True, timeout=CONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    ncpu, _, options = done.stdout.strip().partition(" ")
    try:
        parsed = json.loads(options) if options else None
    except ValueError:
        parsed = None
    if done.returncode != 0 or not ncpu.isdigit() or not isinstance(parsed, (list, type(None))):
        lines = (done.stderr or done.stdout).strip().splitlines()
        return lines[-1] if lines else f"docker info exited with {done.returncode}"
    return DaemonFacts(float(ncpu), tuple(str(o) for o in parsed or ()))


def remove_container(docker: tuple[str, ...], container: str) -> None:
    try:
        done = subprocess.run([*docker, "rm", "-f", "-v", container], capture_output=True, text=True,
                              timeout=CONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("could not remove %s: %s", container, e)
        return
    if done.returncode != 0 and "no such container" not in done.stderr.lower():
        log.warning("could not remove %s: %s", container, done.stderr.strip())


def find_main_pid(docker: tuple[str, ...], container: str, user: str) -> str:
    # docker-init forks the main process right after ``docker run`` returns; give it a
    # moment rather than failing the rollout on that race.
    for _ in range(50):
        run = run_capped([*docker, "exec", "-u", user, container, "sh", "-c", MAIN_PID],
                         timeout_s=CONTROL_TIMEOUT_S, output_cap_bytes=CONTROL_OUTPUT_CAP)
        pids = run.output.split()
        if run.exit_code == 0 and len(pids) == 1:
            return pids[0]
        threading.Event().wait(0.1)
    raise RuntimeError(f"container {container}: cannot find its main process ({run.output.strip()[-300:]})")


def memory_cgroup(docker: tuple[str, ...], container: str) -> Path | None:
    """The host directory of ``container``'s memory cgroup (v1's memory controller, or
    the v2 group), found through its main process's ``/proc/PID/cgroup``; None when the
    daemon runs elsewhere or the group is not visible here."""
    done = subprocess.run([*docker, "inspect", "--format", "{{.State.Pid}}", container], capture_output=True,
                          text=True, timeout=CONTROL_TIMEOUT_S)
    pid = done.stdout.strip()
    if done.returncode != 0 or not pid.isdigit() or pid == "0":
        return None
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            where = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            where = Path("/sys/fs/cgroup") / path.lstrip("/")
        else:
            continue
        if where.is_dir():
            return where
    return None


def oom_kills(docker: tuple[str, ...], container: str, cgroup: Path | None) -> int | None:
    """OOM kills in ``container`` so far: its memory cgroup's ``oom_kill`` counter (every
    process of it, not only the main one), at least 1 when Docker says the container was
    OOM-killed; None without a counter (the daemon on another host, an old kernel)."""
    counted = None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (cgroup / name).read_text() if cgroup is not None else ""
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                counted = int(value)
        if counted is not None:
            break
    if counted is None:
        return None
    done = subprocess.run([*docker, "inspect", "--format", "{{.State.OOMKilled}}", container], capture_output=True,
                          text=True, timeout=CONTROL_TIMEOUT_S)
    return max(counted, 1) if done.stdout.strip() == "true" else counted


def last_json_list(output: str, n: int) -> list[str | None] | None:
    lines = output.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return value if isinstance(value, list) and len(value) == n else None
