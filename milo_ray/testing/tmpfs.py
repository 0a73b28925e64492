"""A small real filesystem that can run out of space, for tests of a full disk.

``SmallDisk`` mounts a size-limited tmpfs (root only; ``mount(8)``) and can grow it
in place (``remount``), which is how a test frees space without touching the files on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class MountRefused(RuntimeError):
    """This process may not mount a tmpfs (not root, or no mount capability)."""


class SmallDisk:
    def __init__(self, path: str | os.PathLike, size_kib: int):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        if shutil.which("mount") is None or os.geteuid() != 0:
            raise MountRefused("mounting a tmpfs needs root and mount(8)")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size_kib)}k", "tmpfs", str(self.path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise MountRefused(f"mount -t tmpfs refused: {done.stderr.strip()}")

    def resize(self, size_kib: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={int(size_kib)}k", str(self.path)], check=True,
                       capture_output=True)

    def fill(self) -> Path:
        """Take every free byte with one file (deleted or truncated to give space back)."""
        filler = self.path / "filler"
        with open(filler, "ab", buffering=0) as f:
            for chunk in (1 << 20, 64 << 10, 4 << 10, 1):  # down to the last byte
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError:
                    pass
        return filler

    def free_kib(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize // 1024

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
