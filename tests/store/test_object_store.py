"""Runs on object storage (``milo_ray/store/mirrored.py``) against a local S3 server (moto):
the store contract with the bucket as the truth, the writer's lease, and bad locations."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import uuid

import pytest

from milo_ray.store.integrity import RunLocked
from milo_ray.store.lease import S3Lease
from milo_ray.store.mirrored import MirroredRunStore, open_remote_run
from milo_ray.store.remote import LEASE, Remote, RemoteConfigError, RunURI
from milo_ray.testing.s3 import LocalS3
from milo_ray.testing.store_contract import RunStoreContract, make_result


@pytest.fixture(scope="module")
def s3_server():
    with LocalS3() as server:
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch):
    s3_server.apply(monkeypatch)
    return s3_server


@pytest.fixture
def bucket(s3):
    return s3.bucket(f"b-{uuid.uuid4().hex[:10]}")


class _Mirrored:
    """Every reopen starts from an empty working copy: what the store reads back came from
    the bucket."""

    def __init__(self, tmp_path, bucket):
        self.tmp_path, self.bucket = tmp_path, bucket
        self._ids = itertools.count()
        self._open: list[MirroredRunStore] = []

    def new(self, **flush_options):
        n = next(self._ids)
        store = MirroredRunStore(f"s3://{self.bucket}/runs/run-{n}", self.tmp_path / f"copy-{n}", **flush_options)
        self._open.append(store)
        return store

    def reopen(self, store):
        store.close()
        again = MirroredRunStore(store.uri, self.tmp_path / f"copy-{next(self._ids)}", flush_rows=store.flush_rows,
                                 flush_seconds=store.flush_seconds)
        self._open.append(again)
        return again

    def close_all(self):
        for s in self._open:
            s.close()


@pytest.fixture
def backend(tmp_path, bucket):
    b = _Mirrored(tmp_path, bucket)
    yield b
    b.close_all()


class TestMirroredStoreContract(RunStoreContract):
    pass


# ---- commits reach the bucket as they happen ----------------------------------------------
def test_a_flushed_part_and_every_blob_it_references_are_in_the_bucket_before_close(s3, bucket, tmp_path):
    store = MirroredRunStore(f"s3://{bucket}/r", tmp_path / "w", flush_seconds=None)
    store.append_rollouts([make_result(i) for i in range(5)])
    store.flush()
    keys = set(s3.keys(bucket))
    refs = store.read("rollouts")["trace_ref"].to_pylist()
    assert any(k.startswith("r/rollouts/part-") for k in keys)
    assert "r/rollouts/_parts.sha256" in keys
    assert all(f"r/blobs/{ref[:2]}/{ref}.zst" in keys for ref in refs)
    store.close()
    assert f"r/{LEASE}" not in s3.keys(bucket)  # released


def test_a_run_resumes_from_the_bucket_alone(s3, bucket, tmp_path):
    first = MirroredRunStore(f"s3://{bucket}/r", tmp_path / "machine-a", run_id="the-run")
    first.append_rollouts([make_result(i) for i in range(7)])
    first.write_manifest({"status": "running"})
    first.close()
    again = MirroredRunStore(f"s3://{bucket}/r", tmp_path / "machine-b")
    assert again.run_id == "the-run"
    assert again.completed_keys() == {f"key-h0-{i}" for i in range(7)}
    assert again.get_blob(again.read("rollouts")["trace_ref"][3].as_py())["trajectory"]["i"] == 3
    again.close()


def test_a_reader_sees_the_bucket_run_and_its_blobs(s3, bucket, tmp_path):
    with MirroredRunStore(f"s3://{bucket}/r", tmp_path / "w") as store:
        store.append_rollouts([make_result(i) for i in range(3)])
    reader = open_remote_run(f"s3://{bucket}/r")
    assert reader.read("rollouts").num_rows == 3
    assert reader.get_blob(reader.read("rollouts")["trace_ref"][0].as_py())["trajectory"]["i"] == 0


# ---- one writer ----------------------------------------------------------------------------
def test_a_second_writer_is_refused_while_the_lease_is_live(s3, bucket, tmp_path):
    store = MirroredRunStore(f"s3://{bucket}/r", tmp_path / "a")
    try:
        with pytest.raises(RunLocked, match="exactly one writing driver"):
            MirroredRunStore(f"s3://{bucket}/r", tmp_path / "b")
    finally:
        store.close()
    MirroredRunStore(f"s3://{bucket}/r", tmp_path / "b").close()  # free again once released


def _plant_lease(s3, bucket, **holder):
    s3.client().put_object(Bucket=bucket, Key=f"r/{LEASE}", Body=json.dumps(holder).encode())


def test_the_lease_of_a_driver_that_died_on_this_host_is_taken_over(s3, bucket, tmp_path):
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _plant_lease(s3, bucket, pid=int(dead.stdout), host=socket.gethostname(), lease_seconds=3600, token="x")
    MirroredRunStore(f"s3://{bucket}/r", tmp_path / "w").close()


def test_a_lease_from_another_host_is_taken_over_only_once_it_lapsed(s3, bucket, tmp_path):
    _plant_lease(s3, bucket, pid=1, host="gone-node", lease_seconds=3600, token="x")
    with pytest.raises(RunLocked, match="gone-node"):
        MirroredRunStore(f"s3://{bucket}/r", tmp_path / "w")
    _plant_lease(s3, bucket, pid=1, host="gone-node", lease_seconds=1, token="x")
    time.sleep(2.1)  # the bucket's clock has whole seconds
    MirroredRunStore(f"s3://{bucket}/r", tmp_path / "w2").close()


def test_a_writer_whose_lease_was_taken_commits_nothing_more(s3, bucket, tmp_path):
    store = MirroredRunStore(f"s3://{bucket}/r", tmp_path / "w", lease_seconds=0.9, flush_seconds=None)
    store.append_rollouts([make_result(0)])
    store.flush()
    _plant_lease(s3, bucket, pid=1, host="usurper", lease_seconds=3600, token="y")
    deadline = time.monotonic() + 20
    while store._lease._lost is None and time.monotonic() < deadline:  # the next renewal finds out
        time.sleep(0.05)
    store.append_rollouts([make_result(1)])
    with pytest.raises(RunLocked, match="took over"):
        store.flush()
    parts = [k for k in s3.keys(bucket) if k.startswith("r/rollouts/part-")]
    assert len(parts) == 1
    store._closed = True  # its buffered row is the usurper's to rerun
    store._release_writer_lock()


def test_racing_drivers_create_the_lease_exactly_once(s3, bucket):
    uri = RunURI.parse(f"s3://{bucket}/r")
    leases = [S3Lease(uri), S3Lease(uri)]
    outcomes = []
    for lease in leases:
        try:
            lease.acquire()
            outcomes.append("held")
        except RunLocked:
            outcomes.append("refused")
    assert outcomes == ["held", "refused"]
    leases[0].release()


# ---- bad locations -------------------------------------------------------------------------
@pytest.mark.parametrize("uri, says", [
    ("s3://", "no bucket"),
    ("s3://bucket", "needs a prefix"),
    ("s3://bucket/a/../b", "needs a prefix"),
    ("ftp://bucket/run", "unknown scheme"),
    ("gs://bucket/run", "read-only here"),
    ("s3://bucket/run?secret_key=abc", "credentials in the URI"),
])
def test_a_malformed_location_is_refused_naming_run_dir(uri, says):
    with pytest.raises(RemoteConfigError, match="run.dir=") as info:
        RunURI.parse(uri)
    assert says in str(info.value)


def test_a_missing_bucket_is_refused_naming_run_dir(s3, tmp_path):
    with pytest.raises(RemoteConfigError, match=r"run.dir=s3://no-such-bucket-x/r: no bucket"):
        MirroredRunStore("s3://no-such-bucket-x/r", tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_missing_credentials_are_refused_naming_run_dir(s3, bucket, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(RemoteConfigError, match="run.dir=.*no AWS credentials"):
        Remote(RunURI.parse(f"s3://{bucket}/r"))


@pytest.mark.slow  # a whole command line (composition, the benchmark built) in this process
@pytest.mark.parametrize("run_dir, says", [
    ("ftp://bucket/run", "run.dir=ftp://bucket/run: unknown scheme"),
    ("s3://no-such-bucket-y/run", "run.dir=s3://no-such-bucket-y/run: no bucket 'no-such-bucket-y'"),
])
def test_the_cli_refuses_an_unusable_run_dir_before_writing_anything(s3, tmp_path, monkeypatch, capsys, run_dir, says):
    from milo_ray.run import main

    monkeypatch.chdir(tmp_path)
    assert main([f"run.dir={run_dir}", "run.progress=false"]) == 2
    assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_bucket_keys_are_secrets_that_never_reach_the_bucket(s3, bucket, tmp_path):
    """The driver's store for an s3:// run.dir registers the AWS keys for redaction: a
    manifest or row holding one is stored with a marker instead."""
    from milo_ray import redaction
    from milo_ray.run import _open_store
    from milo_ray.testing.s3 import SECRET_KEY

    assert {"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} <= set(
        redaction.secret_env_names({"AWS_SECRET_ACCESS_KEY": "x", "AWS_SESSION_TOKEN": "y", "AWS_REGION": "z"}))
    redaction.clear()
    try:
        store = _open_store(tmp_path / "w", False, RunURI.parse(f"s3://{bucket}/r"))
        store.write_manifest({"config": {"leaked": SECRET_KEY}})
        store.event("leak", {"text": f"key={SECRET_KEY}"})
        store.close()
    finally:
        redaction.clear()
    for key in s3.keys(bucket):
        assert SECRET_KEY.encode() not in s3.get(bucket, key), key
    assert redaction.marker("AWS_SECRET_ACCESS_KEY") in s3.get(bucket, "r/manifest.json").decode()
