"""The one-writer rule on object storage: a lease object beside the run's files.

A local run directory is held with ``flock``, which the kernel drops when the holder dies. A
bucket has no such thing, so the writer holds ``<prefix>/_writer.lease`` instead, made with S3's
conditional writes (boto3; pyarrow's S3 filesystem has no way to send them):

* acquire: ``PutObject`` with ``If-None-Match: *`` -- exactly one of two racing drivers
  creates the object;
* renew: every third of the lease, ``PutObject`` with ``If-Match: <our ETag>`` -- it fails
  once anyone else has replaced the object, and the writer then knows it lost the run;
* take over: a lease not renewed for its whole duration (by the bucket's own clock: the
  object's ``Last-Modified`` against the response's ``Date``, so no two machines' clocks are
  compared), or held by a process that no longer exists on this host, is replaced with
  ``If-Match: <its ETag>`` -- of two drivers taking over the same stale lease, one wins;
* release: ``DeleteObject`` with ``If-Match: <our ETag>``.

Fencing: before each commit the writer calls :meth:`S3Lease.check`, which refuses when a
renewal found the lease taken or when no renewal succeeded for a whole lease duration (past
that, another driver may legitimately have taken over). So a driver cut off from the bucket
stops writing before anyone else can start.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from email.utils import parsedate_to_datetime
from typing import Any

from milo_ray.store.integrity import RunLocked
from milo_ray.store.remote import LEASE, RemoteConfigError, RunURI, s3_client

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 60.0
_TAKEN = ("PreconditionFailed", "ConditionalRequestConflict")
_CREDENTIALS = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken")


class S3Lease:
    """The writer's lease on one run's prefix (see the module docstring)."""

    def __init__(self, uri: RunURI, *, lease_seconds: float = DEFAULT_LEASE_SECONDS, field: str = "run.dir"):
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self.uri, self.field, self.lease_seconds = uri, field, float(lease_seconds)
        self.key = f"{uri.key_prefix}{LEASE}"
        self._client = s3_client(uri, field=field)
        self._body = json.dumps({"token": uuid.uuid4().hex, "pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.time(), "lease_seconds": self.lease_seconds}).encode()
        self._etag: str | None = None
        self._renewed = 0.0  # monotonic time a successful renewal was *sent* (conservative)
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- acquire ---------------------------------------------------------------------------
    def acquire(self) -> None:
        from botocore.exceptions import ClientError

        for _ in range(3):  # a lease released between our two requests: try again
            sent = time.monotonic()
            try:
                self._etag = self._put(IfNoneMatch="*")
            except ClientError as exc:
                code = self._code(exc)
                if code not in _TAKEN:
                    raise self._config_error(exc) from None
                if not self._take_over():
                    continue
            else:
                self._renewed = sent
            self._start_renewing()
            return
        raise RunLocked(f"{self.uri.text}: the writer lease changed hands repeatedly while acquiring it; retry")

    def _take_over(self) -> bool:
        """Replace a stale lease; False when it vanished meanwhile. ``RunLocked`` when it is live."""
        from botocore.exceptions import ClientError

        try:
            got = self._client.get_object(Bucket=self.uri.bucket, Key=self.key)
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                return False
            raise self._config_error(exc) from None
        etag, modified = got["ETag"], got["LastModified"]
        try:
            holder = json.loads(got["Body"].read() or b"{}")
        except ValueError:
            holder = {}
        now = parsedate_to_datetime(got["ResponseMetadata"]["HTTPHeaders"]["date"])
        age = (now - modified).total_seconds()
        duration = float(holder.get("lease_seconds") or self.lease_seconds)
        dead_here = holder.get("host") == socket.gethostname() and not _alive(holder.get("pid"))
        if age < duration and not dead_here:
            raise RunLocked(
                f"{self.uri.text} is in use by pid {holder.get('pid', '?')} on {holder.get('host', '?')} (its lease was "
                f"renewed {age:.0f} s ago and lapses in {duration - age:.0f} s unless renewed): a run has exactly "
                "one writing driver; stop it, or wait for the lease to lapse when its node is gone, then resume "
                "(read it meanwhile with milo_ray.results)")
        sent = time.monotonic()
        try:
            self._etag = self._put(IfMatch=etag)
        except ClientError as exc:
            if self._code(exc) in _TAKEN:
                raise RunLocked(f"{self.uri.text}: another driver took over the run's stale lease first") from None
            raise self._config_error(exc) from None
        self._renewed = sent
        why = "its process is gone" if dead_here else f"not renewed for {age:.0f} s"
        log.warning("%s: took over the writer lease of pid %s on %s (%s)", self.uri.text, holder.get("pid"),
                    holder.get("host"), why)
        return True

    # ---- hold ------------------------------------------------------------------------------
    def _put(self, **condition: str) -> str:
        r = self._client.put_object(Bucket=self.uri.bucket, Key=self.key, Body=self._body,
                                    ContentType="application/json", **condition)
        return r["ETag"]

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.uri.prefix}", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        while not self._stop.wait(self.lease_seconds / 3):
            sent = time.monotonic()
            try:
                self._etag = self._put(IfMatch=self._etag)
                self._renewed = sent
            except ClientError as exc:
                if self._code(exc) in _TAKEN:
                    self._lost = f"{self.uri.text}: another driver took over this run's writer lease"
                    log.error("%s; this driver stops writing to it", self._lost)
                    return
                log.warning("%s: renewing the writer lease failed (%s); retrying", self.uri.text, exc)
            except BotoCoreError as exc:  # connection errors: the bucket is unreachable for now
                log.warning("%s: renewing the writer lease failed (%s); retrying", self.uri.text, exc)

    def check(self) -> None:
        """``RunLocked`` unless this driver still holds the lease (call before each commit)."""
        if self._lost:
            raise RunLocked(self._lost)
        if self._etag is None:
            raise RunLocked(f"{self.uri.text}: this driver holds no writer lease (released)")
        silent = time.monotonic() - self._renewed
        if silent >= self.lease_seconds:
            raise RunLocked(f"{self.uri.text}: the writer lease could not be renewed for {silent:.0f} s, so another "
                            "driver may hold the run now; this driver stops writing (resume the run to continue)")

    def release(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        etag, self._etag = self._etag, None
        if etag is None or self._lost:
            return
        try:
            self._client.delete_object(Bucket=self.uri.bucket, Key=self.key, IfMatch=etag)
        except (ClientError, BotoCoreError) as exc:  # the lease lapses by itself
            log.warning("%s: releasing the writer lease failed (%s); it lapses after %.0f s", self.uri.text, exc,
                        self.lease_seconds)

    # ---- errors ----------------------------------------------------------------------------
    @staticmethod
    def _code(exc: Any) -> str:
        return str(exc.response.get("Error", {}).get("Code", ""))

    def _config_error(self, exc: Any) -> Exception:
        code = self._code(exc)
        if code == "NoSuchBucket":
            return RemoteConfigError(f"{self.field}={self.uri.text}: no bucket {self.uri.bucket!r}; create it "
                                     f"(aws s3 mb s3://{self.uri.bucket}) or name an existing one")
        if code in _CREDENTIALS or code == "403":
            return RemoteConfigError(f"{self.field}={self.uri.text}: the bucket refused the credentials ({code}); "
                                     "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and that they "
                                     f"may read and write s3://{self.uri.bucket}/{self.uri.prefix}/")
        return exc


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError):
        return True  # unknown holder: only the lease's age can free it
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
