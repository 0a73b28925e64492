"""The scheduler on a simulated multi-node cluster: one worker per slotted node, and
rollouts lost with a node are retried on the nodes that remain."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow  # starts its own three-node Ray cluster in a subprocess
def test_rollouts_spread_over_nodes_and_survive_losing_one():
    runner = os.path.join(os.path.dirname(__file__), "multinode_runner.py")
    proc = subprocess.run([sys.executable, runner], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["spread"]) == 2 and sum(out["spread"].values()) == 16
    assert out["after_errors"] == [None] * 16
    assert out["doomed"] in out["spread"] and set(out["after_nodes"]) <= set(out["spread"])
    assert out["retried"] >= 1 and out["events"]["rollout_retry"] == out["retries"]
    assert out["events"]["rollout_worker_lost"] == 1
