"""Connecting the driver: a private local instance starts quietly and with token auth."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import os
from milo_ray.config import ExecutionConfig
from milo_ray.execution.cluster import connect
info = connect(ExecutionConfig(num_cpus=1, join_running=False))
print(info.started_here, info.slots, os.environ.get("RAY_AUTH_MODE"))
"""


def test_private_local_instance_keeps_token_auth_without_the_start_up_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "8.0", "token"]
    assert "Token authentication" not in proc.stderr, proc.stderr
