"""The private network of a sandbox whose task allows the internet: its own network
namespace with user-mode egress to public addresses only.

A task with ``allow_internet`` never joins the host's network namespace (there it would
reach every service listening on the host's loopback, Ray's included, and read the host's
sockets from ``/proc/net/tcp``). :class:`PrivateNetwork` instead makes, once per sandbox:

1. a network namespace held by a tiny host process (``unshare --net -- cat``, which exits
   when the worker that started it dies: its stdin pipe closes), which every command of
   the sandbox joins (``nsenter --net``, before bwrap; Docker: the container's own);
2. an egress filter inside that namespace, installed before any interface exists
   (``iptables-restore``; the sandbox has no capability to change it): IPv4 goes out only
   to public addresses -- loopback stays the namespace's own, and 10/8, 172.16/12,
   192.168/16, 100.64/10, 169.254/16 (cloud metadata), 0/8, multicast, reserved, and every
   address and on-link subnet of the host's own interfaces are refused with an ICMP
   error, so a connect fails at once rather than hanging. The one exception is port 53 to
   the host's resolvers (``/etc/resolv.conf``), so names resolve. IPv6 has no egress at
   all (only the namespace's own loopback), which closes fc00::/7 and fe80::/10;
3. user-mode networking by ``slirp4netns`` attached to the namespace: the sandbox's
   packets become ordinary sockets of an unprivileged host process, with host loopback
   disabled (``--disable-host-loopback``: 10.0.2.2 does not lead to the host's 127.0.0.1)
   and no port forwarded into the namespace, in its own mount namespace with its
   capabilities dropped (``--enable-sandbox``) and a seccomp filter (``--enable-seccomp``).

The filter works on destination addresses inside the namespace, so it holds whatever
slirp4netns does with a packet. Names are resolved by the host's resolvers: a resolver on
the host's own loopback (127.0.0.53) is unreachable from the namespace, and then only
numeric addresses work. Creating the network takes one namespace, two iptables-restore
runs and one slirp4netns start (~50-100 ms, once per sandbox, not per command). Root only:
the namespace is joined with ``nsenter``, which takes CAP_SYS_ADMIN.
"""

from __future__ import annotations

import ipaddress
import os
import select
import shutil
import subprocess
import tempfile
from typing import Iterable

# Destinations the sandbox never reaches, besides the host's own addresses and subnets.
BLOCKED_V4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
              "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
# How long the namespace holder and slirp4netns may take to come up: both take
# milliseconds, so this only trips on a hung machine, where failing the sandbox is right.
_START_TIMEOUT_S = 10.0
_TOOLS = ("unshare", "nsenter", "slirp4netns", "iptables-restore", "ip6tables-restore")


def missing_tools() -> str | None:
    """Why a private network cannot be made here, or None."""
    if os.geteuid() != 0:
        return "a private network namespace with egress needs a root worker (nsenter joins it)"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"a private network namespace with egress needs {', '.join(missing)} (apt-get install slirp4netns iptables)"
    return None


def host_networks() -> list[str]:
    """The host's own IPv4 addresses and on-link subnets (from ``ip``), as CIDRs."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10, check=True)
    nets: list[str] = []
    for line in out.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            iface = ipaddress.ip_interface(fields[fields.index("inet") + 1])
            nets += [f"{iface.ip}/32", str(iface.network)]
    return sorted(set(nets))


def resolvers(path: str = "/etc/resolv.conf") -> list[str]:
    """The IPv4 nameservers of ``path`` (the ones the sandbox's /etc shows)."""
    found = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    try:
                        if ipaddress.ip_address(parts[1]).version == 4:
                            found.append(parts[1])
                    except ValueError:
                        continue
    except OSError:
        pass
    return found


def filter_rules(blocked: Iterable[str], dns: Iterable[str]) -> tuple[str, str]:
    """(iptables-restore, ip6tables-restore) input for the namespace's OUTPUT chain."""
    v4 = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]",
          "-A OUTPUT -o lo -j ACCEPT"]
    for ns in dns:
        for proto in ("udp", "tcp"):
            v4.append(f"-A OUTPUT -d {ns}/32 -p {proto} --dport 53 -j ACCEPT")
    for net in blocked:
        # tcp-reset makes a TCP connect fail with ECONNREFUSED at once; other protocols
        # get an ICMP error (EHOSTUNREACH/ECONNREFUSED), never a silent drop to time out.
        v4.append(f"-A OUTPUT -d {net} -p tcp -j REJECT --reject-with tcp-reset")
        v4.append(f"-A OUTPUT -d {net} -j REJECT --reject-with icmp-admin-prohibited")
    v4.append("COMMIT")
    v6 = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]",
          "-A OUTPUT -o lo -j ACCEPT", "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
          "-A OUTPUT -j REJECT --reject-with icmp6-adm-prohibited", "COMMIT"]
    return "\n".join(v4) + "\n", "\n".join(v6) + "\n"


class PrivateNetwork:
    """One sandbox's network namespace with filtered user-mode egress (module docstring).
    ``join_prefix`` is the argv prefix that runs a command inside it; :meth:`close` ends
    it. ``pid``: attach to this existing process's namespace (a Docker container's)
    instead of making one."""

    def __init__(self, *, pid: int | None = None) -> None:
        why = missing_tools()
        if why:
            raise RuntimeError(why)
        self._holder: subprocess.Popen | None = None
        self._slirp: subprocess.Popen | None = None
        self._exit_w: int | None = None
        self._log = None
        try:
            self.pid = pid if pid is not None else self._start_holder()
            self.netns = f"/proc/{self.pid}/ns/net"
            v4, v6 = filter_rules([*BLOCKED_V4, *host_networks()], resolvers())
            for tool, rules in (("iptables-restore", v4), ("ip6tables-restore", v6)):
                run = subprocess.run(["nsenter", f"--net={self.netns}", tool], input=rules, capture_output=True,
                                     text=True, timeout=_START_TIMEOUT_S)
                if run.returncode != 0:
                    raise RuntimeError(f"the sandbox's egress filter could not be installed ({tool}): "
                                       f"{run.stderr.strip()[:300]}")
            self._start_slirp()
        except BaseException:
            self.close()
            raise

    @property
    def join_prefix(self) -> list[str]:
        return [shutil.which("nsenter") or "nsenter", f"--net={self.netns}", "--"]

    def _start_holder(self) -> int:
        # cat reads its stdin until the worker (holding the other end) closes it or dies.
        self._holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", "echo ready; exec cat"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        ready, _, _ = select.select([self._holder.stdout], [], [], _START_TIMEOUT_S)
        if not ready or self._holder.stdout.readline().strip() != b"ready":
            raise RuntimeError("the sandbox's network namespace could not be created (unshare --net)")
        self._holder.stdout.close()
        return self._holder.pid

    def _start_slirp(self) -> None:
        ready_r, ready_w = os.pipe()
        exit_r, self._exit_w = os.pipe()
        # A file, not a pipe: nobody drains slirp4netns's messages while it runs.
        self._log = tempfile.TemporaryFile()
        try:
            self._slirp = subprocess.Popen(
                ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox",
                 "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", str(self.pid), "tap0"],
                pass_fds=(ready_w, exit_r), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=self._log, start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        finally:
            os.close(ready_w)
            os.close(exit_r)
        try:
            ready, _, _ = select.select([ready_r], [], [], _START_TIMEOUT_S)
            if not ready or os.read(ready_r, 1) != b"1":
                self._log.seek(0)
                err = self._log.read()[-300:]
                raise RuntimeError(f"slirp4netns did not configure the sandbox's network: {err.decode(errors='replace')}")
        finally:
            os.close(ready_r)

    def close(self) -> None:
        """End slirp4netns and the namespace holder (idempotent)."""
        if self._exit_w is not None:
            os.close(self._exit_w)  # slirp4netns exits when this closes
            self._exit_w = None
        for proc in (self._slirp, self._holder):
            if proc is None:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stderr):
                if stream is not None:
                    stream.close()
        self._slirp = self._holder = None
        if self._log is not None:
            self._log.close()
            self._log = None


def container_network(docker: tuple[str, ...], container: str) -> PrivateNetwork:
    """A :class:`PrivateNetwork` in the namespace of ``container`` (started with
    ``--network none``), reached through its host pid: the Docker daemon must run on this
    host, in this PID namespace."""
    run = subprocess.run([*docker, "inspect", "--format", "{{.State.Pid}}", container], capture_output=True,
                         text=True, timeout=_START_TIMEOUT_S)
    pid = run.stdout.strip()
    if run.returncode != 0 or not pid.isdigit() or not os.path.exists(f"/proc/{pid}/ns/net"):
        raise RuntimeError(f"container {container}: its network namespace is not reachable from this host "
                           f"(pid {pid!r}); a task that allows the internet needs the Docker daemon on the worker's host")
    return PrivateNetwork(pid=int(pid))
