"""A run's files on object storage: ``s3://`` (and, for reading, ``gs://``) URIs through
pyarrow's filesystems (docs/design.md, "Runs on object storage").

This module owns the URI (parsing, the one error a bad one gets), the byte moves between a
local directory and the bucket (:class:`Remote`), the ordered upload queue that keeps the
bucket a prefix of what the writer committed (:class:`Uploads`), and the read-only local
snapshot a reader (``milo_ray.results``, the report, DuckDB) works on.

Credentials never appear in a URI: pyarrow accepts ``access_key``/``secret_key`` in the query
string, and a URI is recorded in the manifest, so such a URI is refused; the keys come from
the AWS environment variables, a profile or an instance role, as for the AWS CLI.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import shutil
import tempfile
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

WRITABLE_SCHEMES = ("s3",)
READABLE_SCHEMES = ("s3", "gs", "gcs")
_CREDENTIAL_QUERY = frozenset({"access_key", "secret_key", "session_token", "role_arn", "external_id"})
# Writer-side files a reader's snapshot leaves out: blobs are fetched one by one when read.
BLOB_DIR = "blobs"
LEASE = "_writer.lease"
_RETRIES = (0.2, 1.0, 3.0)  # seconds between attempts of one upload (then the write fails)


class RemoteConfigError(ValueError):
    """A run location on object storage that cannot be used; the message names the config
    field and the fix."""


def is_uri(text: Any) -> bool:
    """Whether ``text`` names a location by URI (``scheme://...``) rather than a local path."""
    return isinstance(text, str) and "://" in text


@dataclass(frozen=True)
class RunURI:
    """``scheme://bucket/prefix[?query]``, checked. ``prefix`` has no leading or trailing
    slash; ``query`` holds pyarrow's filesystem options (``endpoint_override``, ``scheme``,
    ``region``...)."""

    text: str
    scheme: str
    bucket: str
    prefix: str
    query: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, *, field: str = "run.dir", write: bool = True) -> "RunURI":
        def bad(why: str) -> RemoteConfigError:
            return RemoteConfigError(f"{field}={text}: {why}")

        if not isinstance(text, str) or "://" not in text:
            raise bad("not a URI; use s3://BUCKET/PREFIX (or a local directory)")
        parts = urllib.parse.urlsplit(text)
        scheme = parts.scheme.lower()
        allowed = WRITABLE_SCHEMES if write else READABLE_SCHEMES
        if scheme not in allowed:
            extra = (" (gs:// runs are read-only here: Google Cloud Storage has no conditional write through "
                     "the S3 API that the writer's lease needs; write to s3:// and copy, or to a local directory)"
                     if scheme in READABLE_SCHEMES else "")
            raise bad(f"unknown scheme {parts.scheme + '://'!r}; use {' or '.join(s + '://' for s in allowed)}"
                      f"BUCKET/PREFIX{extra}")
        bucket = parts.netloc
        if not bucket or "@" in bucket or ":" in bucket:
            raise bad("no bucket name; use s3://BUCKET/PREFIX (no user or port before the bucket)")
        if parts.fragment:
            raise bad(f"a '#' fragment ({parts.fragment!r}) is not part of a location; remove it")
        prefix = parts.path.strip("/")
        if not prefix or any(p in ("", ".", "..") for p in prefix.split("/")):
            raise bad("needs a prefix naming the run below the bucket without empty, '.' or '..' "
                      "components, e.g. s3://BUCKET/runs/my-run")
        try:
            query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
        except ValueError:
            raise bad(f"malformed query string {parts.query!r}; use ?endpoint_override=HOST:PORT&scheme=http") from None
        secret = sorted(_CREDENTIAL_QUERY & set(query))
        if secret:
            raise bad(f"credentials in the URI ({', '.join(secret)}) would be recorded with the run; remove them and "
                      "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment instead")
        return cls(text=text, scheme=scheme, bucket=bucket, prefix=prefix, query=query)

    @property
    def path(self) -> str:
        """``bucket/prefix``: the run's root as pyarrow's filesystem names it."""
        return f"{self.bucket}/{self.prefix}"

    @property
    def key_prefix(self) -> str:
        return self.prefix + "/"

    def local_copy(self, base: Path) -> Path:
        """Where a writer keeps its working copy of this run below ``base``."""
        return Path(base) / self.scheme / self.bucket / self.prefix

    def __str__(self) -> str:
        return self.text


class RemoteUnavailable(OSError):
    """An upload to the run's bucket failed after retries; everything committed before it is
    in the bucket, and the rest stays queued locally for the next write."""


class Remote:
    """The run's root on object storage (``bucket/prefix``); paths below it are relative
    (``rollouts/part-....parquet``). ``s3://`` goes through boto3 (single PUTs: an object
    appears whole or not at all), ``gs://`` through ``pyarrow.fs`` (read only)."""

    def __init__(self, uri: RunURI, *, field: str = "run.dir"):
        self.uri, self.field = uri, field
        self._client = s3_client(uri, field=field) if uri.scheme == "s3" else None
        self.fs: Any = None
        if self._client is None:
            import pyarrow.fs as pafs

            try:
                self.fs, _ = pafs.FileSystem.from_uri(uri.text)
            except (ValueError, OSError) as exc:  # ArrowInvalid is a ValueError
                raise RemoteConfigError(f"{field}={uri.text}: {_first_line(exc)}; check the URI") from None

    def _key(self, rel: str) -> str:
        return f"{self.uri.prefix}/{rel}" if rel else self.uri.prefix

    def check_bucket(self) -> None:
        """``RemoteConfigError`` naming the field when the bucket is missing or refuses us."""
        if self._client is None:
            import pyarrow.fs as pafs

            try:
                missing = self.fs.get_file_info(self.uri.bucket).type == pafs.FileType.NotFound
            except OSError as exc:
                raise self._unreachable(exc) from None
        else:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                self._client.head_bucket(Bucket=self.uri.bucket)
                missing = False
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code not in ("404", "NoSuchBucket"):
                    raise self._unreachable(exc) from None
                missing = True
            except BotoCoreError as exc:
                raise self._unreachable(exc) from None
        if missing:
            raise RemoteConfigError(f"{self.field}={self.uri.text}: no bucket {self.uri.bucket!r}; create it "
                                    f"(aws s3 mb s3://{self.uri.bucket}) or name an existing one")

    def _unreachable(self, exc: BaseException) -> RemoteConfigError:
        return RemoteConfigError(f"{self.field}={self.uri.text}: bucket {self.uri.bucket!r} cannot be used "
                                 f"({_first_line(exc)}); check the credentials (AWS_ACCESS_KEY_ID/"
                                 "AWS_SECRET_ACCESS_KEY or AWS_PROFILE), the region and the endpoint")

    def put_file(self, local: Path, rel: str) -> None:
        with open(local, "rb") as f:
            self.put_bytes(rel, f.read())

    def put_bytes(self, rel: str, data: bytes) -> None:
        if self._client is None:
            raise PermissionError(f"{self.uri.text}: {self.uri.scheme}:// locations are read-only here")
        self._client.put_object(Bucket=self.uri.bucket, Key=self._key(rel), Body=data)

    def get_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        if self._client is None:
            try:
                with self.fs.open_input_stream(f"{self.uri.bucket}/{self._key(rel)}") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.uri.bucket, Key=self._key(rel))["Body"].read()
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404"):
                return None
            raise

    def delete(self, rel: str) -> None:
        if self._client is None:
            raise PermissionError(f"{self.uri.text}: {self.uri.scheme}:// locations are read-only here")
        self._client.delete_object(Bucket=self.uri.bucket, Key=self._key(rel))  # absent: no error

    def list(self, rel: str = "") -> list[str]:
        """Relative paths of every object at or below ``rel`` (none when absent)."""
        root = self.uri.key_prefix
        if self._client is None:
            import pyarrow.fs as pafs

            sel = pafs.FileSelector(f"{self.uri.bucket}/{self._key(rel)}", recursive=True, allow_not_found=True)
            keys = [i.path[len(self.uri.bucket) + 1:] for i in self.fs.get_file_info(sel)
                    if i.type == pafs.FileType.File]
        else:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.uri.bucket, Prefix=self._key(rel).rstrip("/") + "/")
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return sorted(k[len(root):] for k in keys if k.startswith(root))

    def download(self, rels: Iterable[str], local_root: Path, *, threads: int = 8) -> None:
        """Copy the objects ``rels`` below ``local_root`` (each written temp-then-rename)."""
        def one(rel: str) -> None:
            data = self.get_bytes(rel)
            if data is None:  # removed meanwhile (a compaction): its rows are in a newer part
                return
            dest = local_root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.parent / f".{dest.name}.dl.tmp"
            tmp.write_bytes(data)
            tmp.replace(dest)

        rels = list(rels)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(threads, len(rels) or 1))) as pool:
            list(pool.map(one, rels))


def s3_client(uri: RunURI, *, field: str = "run.dir") -> Any:
    """A boto3 S3 client for ``uri``: endpoint and region from the URI's options when given
    (``endpoint_override``, ``scheme``, ``region``, as pyarrow names them), else boto3's usual
    sources (``AWS_ENDPOINT_URL``, ``AWS_REGION``, the config file)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise RemoteConfigError(f"{field}={uri.text}: s3:// locations need boto3 (its conditional writes hold the "
                                "run's lease); pip install 'boto3>=1.35'") from None
    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise RemoteConfigError(f"{field}={uri.text}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or AWS_PROFILE, "
                                "or run where an instance role provides them")
    endpoint = uri.query.get("endpoint_override")
    if endpoint and "://" not in endpoint:
        endpoint = f"{uri.query.get('scheme', 'https')}://{endpoint}"
    region = uri.query.get("region") or session.region_name or "us-east-1"
    # Retries are ours (with_retries, the lease's renewals): a short connect timeout lets a
    # driver that lost the bucket notice within its lease.
    creds = session.get_credentials().get_frozen_credentials()
    key = (endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"), region,
           creds.access_key, creds.secret_key, creds.token)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:  # a client costs ~0.3 s to build and is thread-safe: one per account and endpoint
            config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
            client = _clients[key] = session.client("s3", endpoint_url=endpoint or None, region_name=region,
                                                    config=config)
    return client


_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _transient(exc: BaseException) -> bool:
    """Worth retrying: a connection failure, or the service's own error (5xx, throttling)."""
    if isinstance(exc, OSError):
        return True
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover
        return False
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or exc.response.get("Error", {}).get("Code") in ("SlowDown", "Throttling",
                                                                               "RequestTimeout")
    return isinstance(exc, BotoCoreError)


def with_retries(what: str, fn: Callable[[], Any], uri: RunURI, delays: tuple[float, ...] = _RETRIES) -> Any:
    """``fn()``, retried after each of ``delays`` on a transient failure; then ``RemoteUnavailable``."""
    for attempt, delay in enumerate((*delays, None)):
        try:
            return fn()
        except Exception as exc:
            if not _transient(exc):
                raise
            if delay is None:
                raise RemoteUnavailable(f"{uri.text}: {what} failed after {attempt + 1} attempts "
                                        f"({_first_line(exc)}); committed files stay in the local copy and "
                                        "are uploaded by the next write") from exc
            log.warning("%s: %s failed (%s); retrying in %.1f s", uri.text, what, _first_line(exc), delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


class Uploads:
    """Ordered puts and deletes of the writer's committed files. An operation runs only after
    every earlier one succeeded, so the bucket always holds a prefix of the local commits
    (a part never before the hash-list line or the blobs it depends on); a failed operation
    stays at the head of the queue and the next :meth:`push` retries it."""

    def __init__(self, remote: Remote, local_root: Path):
        self.remote, self.root = remote, Path(local_root)
        self._ops: deque[tuple[str, str]] = deque()
        self._lock = threading.Lock()

    def push(self, op: str, rel: str) -> None:
        """Queue ``("put"|"delete", rel)`` and run the queue."""
        if op not in ("put", "delete"):
            raise ValueError(f"unknown upload operation {op!r}")
        with self._lock:
            if not (self._ops and self._ops[-1] == (op, rel)):  # a re-put of a mutable file is one put
                self._ops.append((op, rel))
            self._drain()

    def drain(self) -> None:
        with self._lock:
            self._drain()

    def pending(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._ops)

    def _drain(self) -> None:
        while self._ops:
            op, rel = self._ops[0]
            if op == "put":
                local = self.root / rel
                if local.exists():  # a file replaced again since it was queued: its newest content
                    with_retries(f"uploading {rel}", lambda: self.remote.put_file(local, rel), self.remote.uri)
            else:
                with_retries(f"deleting {rel}", lambda: self.remote.delete(rel), self.remote.uri)
            self._ops.popleft()


# ---- readers -----------------------------------------------------------------------------
_SNAPSHOTS: dict[Path, Remote] = {}
_snap_lock = threading.Lock()
_snap_root: Path | None = None


def snapshot(uri: str, *, field: str = "path") -> Path:
    """A local read-only copy of every run at or below ``uri`` (its manifests and tables;
    blobs are fetched when read, see :func:`remote_for`), taken now. Removed at exit."""
    global _snap_root
    parsed = RunURI.parse(uri, field=field, write=False)
    remote = Remote(parsed, field=field)
    remote.check_bucket()
    with _snap_lock:
        if _snap_root is None:
            _snap_root = Path(tempfile.mkdtemp(prefix="milo_ray-remote-"))
            atexit.register(shutil.rmtree, _snap_root, True)
        dest = Path(tempfile.mkdtemp(dir=_snap_root)) / parsed.bucket / parsed.prefix
    rels = [r for r in remote.list() if not _is_blob_or_lease(r)]
    if not rels:
        raise RemoteConfigError(f"{field}={uri}: nothing stored there; pass the run.dir of a run written to "
                                "object storage")
    dest.mkdir(parents=True, exist_ok=True)
    remote.download(rels, dest)
    with _snap_lock:
        _SNAPSHOTS[dest.resolve()] = remote
    return dest


def _is_blob_or_lease(rel: str) -> bool:
    parts = rel.split("/")
    return BLOB_DIR in parts[:-1] or parts[-1] == LEASE


def remote_for(local: Path) -> tuple[Remote, str] | None:
    """For a directory inside a snapshot: the remote it copies and the directory's relative
    path there; None for any other directory."""
    local = Path(local).resolve()
    with _snap_lock:
        for root, remote in _SNAPSHOTS.items():
            if local == root or root in local.parents:
                rel = local.relative_to(root).as_posix()
                return remote, "" if rel == "." else rel
    return None
