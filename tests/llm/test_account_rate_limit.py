"""Two runs on one cluster share their provider account's rate limit: two driver processes,
each in a Ray namespace of its own (as each run's driver is), call one scripted server
through the run's own model client with ``model.rpm=60`` -- the real limiter, its real
60-s window -- from four threads each, far more than the limit allows. The server's own
request log (arrival times) is the measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, ScriptedOpenAIServer, reply

pytestmark = pytest.mark.slow  # a local Ray cluster and two driver processes

HERE = Path(__file__).resolve().parent
RPM = 60
WINDOW_S = 10.0  # the first 10 s of the burst: at most 10 * RPM / 60 + 1 slots fall in it
SECONDS = 12.0
THREADS = 4


def _in_window(times: list[float], start: float, length: float) -> int:
    return sum(1 for t in times if start <= t < start + length)


def test_two_runs_on_one_account_together_keep_its_rpm(tmp_path):
    from ray.cluster_utils import Cluster

    root = str(HERE.parent.parent)
    env = {**os.environ, SCRIPTED_KEY_ENV: "local-secret", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                             "object_store_memory": 80 * 2**20})
    procs = []
    try:
        with ScriptedOpenAIServer([reply("ok")]) as srv:
            procs = [subprocess.Popen([sys.executable, str(HERE / "rate_limit_driver.py"), cluster.address, srv.url,
                                       str(RPM), str(SECONDS), str(THREADS)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                     for _ in range(2)]
            ready = []
            for p in procs:
                line = p.stdout.readline()
                assert line, p.stderr.read()[-3000:]
                ready.append(json.loads(line))
            import time

            start = time.monotonic()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            outs = []
            for p in procs:
                stdout, stderr = p.communicate(timeout=180)
                assert p.returncode == 0, stderr[-3000:]
                outs.append(json.loads(stdout.strip().splitlines()[-1]))
            times = sorted(t for t in srv.request_times if t >= start)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        cluster.shutdown()
    # Two runs: two namespaces, so nothing of one run's own is visible to the other.
    assert all(r["ready"] for r in ready) and ready[0]["namespace"] != ready[1]["namespace"]
    assert [o["calls"] for o in outs] and all(o["calls"] >= 2 for o in outs), outs  # both were served
    assert len(times) == sum(o["calls"] for o in outs)
    first = _in_window(times, start, WINDOW_S)
    span = times[-1] - times[0]
    print(f"\ntwo runs at rpm={RPM}: {first} requests in the first {WINDOW_S:g} s (limit {WINDOW_S * RPM / 60:g} + 1); "
          f"{len(times)} in {span:.1f} s = {60 * (len(times) - 1) / span:.1f}/min together; per run {outs}")
    # Slots are 60/RPM s apart for both runs together: the first 10 s hold at most 11.
    assert first <= WINDOW_S * RPM / 60 + 1, times
    # Any 10-s window too (one more for arrival jitter: a slot's request reaches the server
    # a variable few ms after the slot).
    assert max(_in_window(times, t, WINDOW_S) for t in times) <= WINDOW_S * RPM / 60 + 2, times
    # So no 60-s window, however aligned, sees more than RPM (+1) requests from both runs.
    assert len(times) - 1 <= span * RPM / 60 + 1
