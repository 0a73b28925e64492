"""The seccomp filter every bwrap sandbox's commands run under, compiled with libseccomp.

Docker applies its default seccomp profile to every container; bwrap applies none unless
given one (``--seccomp FD``: a compiled BPF program it loads just before it execs the
command, so bwrap's own setup is unaffected). This module owns that filter: the system
calls a task never needs and that reach kernel state beyond the sandbox's own process
tree -- the key management calls (a key on a keyring outlives the process and, on the
worker's session keyring, is visible to every sandbox), tracing another process, loading
BPF or kernel modules, mounting, new namespaces (``unshare``, ``setns``, ``clone`` with a
``CLONE_NEW*`` flag), perf events, userfaultfd, io_uring (whose operations bypass the
filter), raw I/O ports, swap, reboot, accounting, quotas, file handles, the clock -- all
fail with EPERM, as under Docker's default profile. ``clone3`` fails with ENOSYS, as under
Docker: its flags live in memory a filter cannot read, and ENOSYS makes the C library fall
back to ``clone``, whose flags it can. Everything else is allowed: the filter is a deny
list over Docker's, not a replacement for the sandbox's namespaces and user.

The filter is compiled once per process (a few milliseconds) through libseccomp's C API
(ctypes; the BPF is libseccomp's, never written here), for the native architecture and
its compatibility ABIs (x86 and x32 next to x86_64, arm next to aarch64) so a 32-bit
system call cannot go around it; a call from any other ABI kills the process. The program
is kept in a file of this process's own (a private 0700 directory), and each bwrap gets a
fresh descriptor of it from :func:`launcher`: bwrap reads its filter to the end, so
concurrent sandboxes must never share one open file.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import errno
import os
import platform
import shutil
import tempfile
import threading
from dataclasses import dataclass

# Denied with EPERM, whatever their arguments (names unknown to the running libseccomp
# or to every architecture of the filter are skipped).
DENIED = (
    # kernel keyrings: a key outlives its process and is keyed by uid or session
    "add_key", "keyctl", "request_key",
    # other processes' memory and file descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # kernel programs, modules, kexec, perf
    "bpf", "perf_event_open", "init_module", "finit_module", "delete_module", "create_module",
    "kexec_load", "kexec_file_load", "lookup_dcookie",
    # mounts and namespaces
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "unshare", "setns", "chroot",
    # memory and I/O facilities a filter cannot see into
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # the machine itself
    "iopl", "ioperm", "swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup",
    "settimeofday", "clock_settime", "sethostname", "setdomainname",
    "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "get_kernel_syms", "query_module",
    # files by handle (reach outside the mount namespace)
    "open_by_handle_at", "name_to_handle_at",
)
# clone() flags that make a namespace: refused (EPERM), so no process inside gets a user
# namespace in which it would hold capabilities.
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}
# personality() values allowed (PER_LINUX, PER_LINUX32, UNAME26 and both: Docker's list
# without the query 0xffffffff, which one comparison per rule cannot single out); any
# other persona (READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ADDR_NO_RANDOMIZE, ...) is refused.
PERSONALITY_ALLOWED = (0x0, 0x0008, 0x20000, 0x20008)
_PERSONALITY_BITS = 0x20008
_COMPAT_ARCHES = {"x86_64": ("x86", "x32"), "aarch64": ("arm",)}

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_GT, _SCMP_CMP_MASKED_EQ = 6, 7


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(RuntimeError):
    """libseccomp cannot be loaded or cannot compile the filter here."""


@dataclass(frozen=True)
class CompiledFilter:
    """The filter as bwrap loads it: ``path`` holds the BPF program (``size`` bytes, a
    whole number of 8-byte instructions); ``denied``: the system calls it refuses."""

    path: str
    size: int
    denied: tuple[str, ...]


_lock = threading.Lock()
_compiled: CompiledFilter | None = None
_error: str | None = None


def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise SeccompUnavailable(f"libseccomp is not installed ({e}); apt-get install libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *cmps: tuple[int, int, int, int]) -> bool:
    """Add one rule; False when no architecture of the filter knows ``name``."""
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr == -1:  # __NR_SCMP_ERROR: libseccomp does not know the call at all
        return False
    array = (_ArgCmp * max(1, len(cmps)))(*(_ArgCmp(*c) for c in cmps))
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
    if rc < 0:
        raise SeccompUnavailable(f"libseccomp refused the rule for {name}: {os.strerror(-rc)}")
    return True


def compile_bpf() -> tuple[bytes, tuple[str, ...]]:
    """(the BPF program, the system calls it denies outright). Pure: no caching."""
    lib = _libseccomp()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        for arch in _COMPAT_ARCHES.get(platform.machine(), ()):
            token = lib.seccomp_arch_resolve_name(arch.encode())
            rc = lib.seccomp_arch_add(ctx, token) if token else 0
            if rc < 0 and rc != -errno.EEXIST:
                raise SeccompUnavailable(f"libseccomp cannot add the {arch} ABI: {os.strerror(-rc)}")
        eperm = _errno_action(errno.EPERM)
        denied = tuple(name for name in DENIED if _rule(lib, ctx, eperm, name))
        for flag in CLONE_NEW_FLAGS.values():
            _rule(lib, ctx, eperm, "clone", (0, _SCMP_CMP_MASKED_EQ, flag, flag))
        _rule(lib, ctx, _errno_action(errno.ENOSYS), "clone3")
        # libseccomp takes one comparison per argument and rule, so "not one of these
        # values" is spelled as rules that each refuse a part of the rest: anything above
        # the largest allowed value, and any bit below it that no allowed value has.
        _rule(lib, ctx, eperm, "personality", (0, _SCMP_CMP_GT, max(PERSONALITY_ALLOWED), 0))
        for bit in range(max(PERSONALITY_ALLOWED).bit_length()):
            if not (1 << bit) & _PERSONALITY_BITS:
                _rule(lib, ctx, eperm, "personality", (0, _SCMP_CMP_MASKED_EQ, 1 << bit, 1 << bit))
        with tempfile.TemporaryFile() as f:
            rc = lib.seccomp_export_bpf(ctx, f.fileno())
            if rc < 0:
                raise SeccompUnavailable(f"libseccomp cannot export the filter: {os.strerror(-rc)}")
            f.seek(0)
            return f.read(), denied
    finally:
        lib.seccomp_release(ctx)


def compiled() -> CompiledFilter:
    """The filter, compiled once per process and kept in a file only this process's user
    can change; raises :class:`SeccompUnavailable` (every time) when it cannot be built."""
    global _compiled, _error
    with _lock:
        if _compiled is None and _error is None:
            try:
                program, denied = compile_bpf()
                where = tempfile.mkdtemp(prefix="milo_ray-seccomp-")  # 0700, this process's own
                path = os.path.join(where, "filter.bpf")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
                with os.fdopen(fd, "wb") as f:
                    f.write(program)
                atexit.register(shutil.rmtree, where, True)
                _compiled = CompiledFilter(path, len(program), denied)
            except (SeccompUnavailable, OSError) as e:
                _error = str(e)
        if _compiled is None:
            raise SeccompUnavailable(_error or "the seccomp filter could not be built")
        return _compiled


# The launcher opens the filter on a descriptor of bash's choosing (>= 10, so it never
# collides with one the caller passes, such as bwrap's --args) and puts ``--seccomp N``
# right after the bwrap executable, before every other option.
_LAUNCH = 'exec {fd}<"$0" || exit 125; exec "$1" --seccomp "$fd" "${@:2}"'


def launcher(bash: str = "/bin/bash") -> list[str]:
    """The argv prefix that runs ``<bwrap> <options...>`` (the words after it) with the
    filter: ``launcher() + [bwrap, *options]``. A fresh descriptor per command costs one
    exec of bash (~1 ms)."""
    return [bash, "-c", _LAUNCH, compiled().path]
