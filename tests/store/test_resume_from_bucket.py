"""A run on object storage outlives its driver's machine: written through the CLI to a
local S3 server, its driver killed mid-run and its local files deleted, it resumes from the
bucket in a fresh working directory and finishes with every rollout exactly once; the
report, ``results.compare`` and DuckDB (``results.connect``) read it from the bucket."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
import zstandard

from milo_ray import results
from milo_ray.testing.s3 import SECRET_KEY, LocalS3

pytestmark = pytest.mark.slow

EVAL_ARGS = ["method=eval", "method.k=8", "method.split=test", "benchmark=surrogate_swepro",
             "run.progress=false", "run.report=false", "execution.num_cpus=2"]
TOTAL = 5 * 100 * 8  # harnesses x test tasks x k


def _env(s3: LocalS3) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN")}
    return {**env, **s3.env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}


def test_a_killed_run_resumes_from_the_bucket_on_a_fresh_machine_with_every_rollout_once(tmp_path, monkeypatch):
    with LocalS3() as s3:
        s3.apply(monkeypatch)
        bucket = s3.bucket(f"runs-{uuid.uuid4().hex[:8]}")
        uri = f"s3://{bucket}/team/exp-1"
        env = _env(s3)
        machine_a, machine_b = tmp_path / "a", tmp_path / "b"
        machine_a.mkdir()
        machine_b.mkdir()

        proc = subprocess.Popen([sys.executable, "-m", "milo_ray.run", *EVAL_ARGS, f"run.dir={uri}"], cwd=machine_a,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if any(k.startswith("team/exp-1/rollouts/part-") for k in s3.keys(bucket)):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "run finished before it could be interrupted; make it longer"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        before = results.load_run(uri)
        assert before.status == "running" and 0 < len(before.rollouts) < TOTAL
        shutil.rmtree(machine_a)  # the driver's node is gone, with its working copy

        resumed = subprocess.run([sys.executable, "-m", "milo_ray.run", f"run.resume={uri}", "run.progress=false"],
                                 cwd=machine_b, env=env, capture_output=True, text=True, timeout=900)
        assert resumed.returncode == 0, resumed.stderr[-3000:]

        after = results.load_run(uri)
        assert after.status == "finished"
        counts = after.rollouts.groupby(["harness_id", "task_id", "rollout_idx"]).size()
        assert len(counts) == TOTAL and (counts == 1).all(), "every rollout exactly once"
        kept = set(before.rollouts["cache_key"])
        assert kept <= set(after.rollouts["cache_key"]), "nothing stored before the kill was lost"
        assert len(after.manifest["history"]) == 2

        table = results.compare([after])
        assert list(table["status"]) == ["finished"] and table["run"].iloc[0] == "exp-1"
        ((n,),) = results.connect(uri).execute("select count(*) from rollouts").fetchall()
        assert n == TOTAL
        report = subprocess.run([sys.executable, "-m", "milo_ray.report", uri, "--out", str(tmp_path / "report")],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert report.returncode == 0, report.stderr[-2000:]
        assert (tmp_path / "report" / "report.html").is_file()

        # The bucket's key is a secret: no object of the run holds it.
        for key in s3.keys(bucket):
            data = s3.get(bucket, key)
            if key.endswith(".zst"):
                data = zstandard.ZstdDecompressor().decompress(data)
            assert SECRET_KEY.encode() not in data, key


MILO_ARGS = ["method=milo", "method.search_size=4", "method.val_size=3", "method.k_search=1", "method.k_val=1",
             "method.k_test=1", "method.max_rounds=6", "method.patience=1", "run.progress=false", "run.report=false",
             "execution.num_cpus=2"]
# Six rounds: the first admitted child comes in round 1, and the store flushes events up to
# five seconds late, so a loaded machine still kills the driver rounds before its end.


def test_a_killed_milo_run_resumes_from_the_bucket_without_its_workspace(tmp_path, monkeypatch):
    # MILO's nodes name harness and evidence directories under workspace/, which the
    # bucket does not hold: the resumed driver rebuilds them in its own working copy.
    with LocalS3() as s3:
        s3.apply(monkeypatch)
        bucket = s3.bucket(f"runs-{uuid.uuid4().hex[:8]}")
        uri = f"s3://{bucket}/team/milo-1"
        env = _env(s3)
        machine_a, machine_b = tmp_path / "a", tmp_path / "b"
        machine_a.mkdir()
        machine_b.mkdir()

        proc = subprocess.Popen([sys.executable, "-m", "milo_ray.run", *MILO_ARGS, f"run.dir={uri}"], cwd=machine_a,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        def children() -> int:  # a mutation's child recorded: its island's next round reads its files
            if not any(k.startswith("team/milo-1/events/part-") for k in s3.keys(bucket)):
                return 0
            nodes = results.load_run(uri).events_of("milo.node")
            return sum(n["node"]["origin"] == "mutation" and bool(n["node"]["admitted"]) for n in nodes)

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and not children():
            time.sleep(0.5)
        assert proc.poll() is None, "run finished before it could be interrupted; make it longer"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        before = results.load_run(uri)
        assert before.status == "running" and len(before.rollouts) > 0
        shutil.rmtree(machine_a)

        resumed = subprocess.run([sys.executable, "-m", "milo_ray.run", f"run.resume={uri}", "run.progress=false"],
                                 cwd=machine_b, env=env, capture_output=True, text=True, timeout=900)
        assert resumed.returncode == 0, resumed.stderr[-3000:]

        after = results.load_run(uri)
        assert after.status == "finished"
        assert after.rollouts["cache_key"].is_unique, "every rollout exactly once"
        assert set(before.rollouts["cache_key"]) <= set(after.rollouts["cache_key"])
        nodes = [n["node"]["node_id"] for n in after.events_of("milo.node")]
        assert len(nodes) == len(set(nodes)) > len(before.events_of("milo.node"))
        assert any(n["node"]["origin"] == "mutation" and n["node"]["round"] > 1 for n in after.events_of("milo.node"))
