"""A local S3-compatible server for tests: moto's server mode in a child process on a free
loopback port, nothing outside this machine.

``with LocalS3() as s3:`` starts it; ``s3.env`` holds the variables that point boto3 and
pyarrow at it (``AWS_ENDPOINT_URL``, dummy keys, a region) for a subprocess, and
``s3.apply(monkeypatch)`` sets them in this process; ``s3.bucket(name)`` creates a bucket.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key-0f8a1c"  # recognisable, so a test can look for it in stored files
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalS3:
    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
                    # pyarrow's S3 client would otherwise ask the EC2 metadata service for a region
                    "AWS_EC2_METADATA_DISABLED": "true"}
        self._proc: subprocess.Popen | None = None

    def start(self) -> "LocalS3":
        exe = shutil.which("moto_server")
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        self._proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env={**os.environ, **self.env})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with code {self._proc.returncode}; pip install 'moto[server]'")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto_server did not start listening within 30 s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> "LocalS3":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def apply(self, monkeypatch: Any) -> None:
        for k, v in self.env.items():
            monkeypatch.setenv(k, v)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(k, raising=False)

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY)

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
