"""AWS storage: ``S3Bucket``, a cloudprof bucket (``s3://name[/prefix]``) on S3.

VMs get no AWS credentials: they read inputs and write results through presigned
URLs made here (``S3Bucket.signed_url``), scoped to one object and a few hours.
Every SDK error is one line (``orchestrator.sdk.aws``), a missing bucket or
object a ``BucketError`` that says which.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import sdk
from orchestrator.atomic import atomic_path
from orchestrator.errors import BucketError, CloudprofError, CredentialsError
from orchestrator.providers.base import Bucket
from orchestrator.sdk.aws import (
    PERMISSION_CODES,
    POLICY_HINT,
    error_code,
    new_session,
    resolve_region,
    retry_config,
    translate_error,
    validate_bucket_name,
)

if TYPE_CHECKING:
    import boto3

_MD5_META = "cloudprof-md5"  # S3 metadata key: content md5 of multipart uploads
SIGV4_MAX_EXPIRY_S = 7 * 24 * 3600  # S3 refuses SigV4 URLs valid for longer
_OPEN = "open the bucket"  # the first call: a 404 here means no bucket


class S3Bucket(Bucket):
    """``s3://name[/prefix]``: keys given to and returned by the methods are below the prefix."""

    workers = 8  # parallel transfers

    def __init__(self, url: str) -> None:
        if not url.startswith("s3://"):
            raise BucketError(f"not an S3 URL: {url!r}")
        name, _, prefix = url[len("s3://") :].partition("/")
        validate_bucket_name(name)
        self.url = url.rstrip("/")
        self.name = name
        self.base = prefix.strip("/")
        self._client: Any = None
        self._lock = threading.Lock()
        self._session: boto3.session.Session | None = None

    @property
    def session(self) -> boto3.session.Session:
        if self._session is None:
            self._session = new_session()
        return self._session

    # -- plumbing

    def _full(self, key: str) -> str:
        key = key.lstrip("/")
        return f"{self.base}/{key}" if self.base and key else (self.base or key)

    def _relative(self, full: str) -> str:
        return full[len(self.base) + 1 :] if self.base else full

    def _prefix(self, prefix: str) -> str:
        full = self._full(prefix.strip("/"))
        return f"{full}/" if full else ""

    def _bucket_error(self, err: BaseException, action: str) -> CloudprofError:
        code, message = error_code(err)
        status = (
            (getattr(err, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        )
        if code == "NoSuchBucket" or (status == 404 and action == _OPEN):
            return BucketError(
                f"bucket s3://{self.name} does not exist (create it with: aws s3 mb s3://{self.name})"
            )
        if code in ("NoSuchKey", "404") or status == 404:
            return BucketError(f"cannot {action} s3://{self.name}: no such object")
        if code in PERMISSION_CODES or code == "403" or status == 403:
            return BucketError(
                f"no permission to {action} s3://{self.name} ({code} {message}; {POLICY_HINT})"
            )
        found = translate_error(err, f"{action} in s3://{self.name}")
        if isinstance(found, CredentialsError):
            return found
        return BucketError(str(found))

    @contextmanager
    def _calls(self, action: str) -> Iterator[None]:
        core = sdk.botocore_exceptions
        try:
            yield
        except (core.BotoCoreError, core.ClientError) as err:
            raise self._bucket_error(err, action) from err
        except sdk.boto3_exceptions.Boto3Error as err:  # upload_file's S3UploadFailedError wraps it
            cause = err.__cause__ or err.__context__
            if isinstance(cause, (core.BotoCoreError, core.ClientError)):
                raise self._bucket_error(cause, action) from err
            raise BucketError(f"cannot {action} in s3://{self.name}: "
                              f"{' '.join(str(err).split())}") from err

    @property
    def client(self) -> Any:
        """An S3 client in the bucket's own region (checked once: exists, reachable)."""
        with self._lock:
            if self._client is None:
                self._client = self._open()
            return self._client

    def _open(self) -> Any:
        # SigV4 everywhere: presigned URLs then sign only the host, so a VM's
        # plain HTTP PUT works whatever Content-Type it sends.
        config = retry_config(signature_version="s3v4")
        region = resolve_region(None)
        client = self.session.client("s3", region_name=region, config=config)
        with self._calls(_OPEN):
            try:
                head = client.head_bucket(Bucket=self.name)
                headers = head["ResponseMetadata"].get("HTTPHeaders", {})
            except sdk.botocore_exceptions.ClientError as err:
                headers = err.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
                if err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 301:
                    raise
        bucket_region = headers.get("x-amz-bucket-region")
        if bucket_region and bucket_region != region:
            client = self.session.client("s3", region_name=bucket_region, config=config)
        return client

    # -- Bucket

    def list(self, prefix: str = "") -> dict[str, str]:
        client = self.client
        out: dict[str, str] = {}
        with self._calls("list objects"):
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=self._prefix(prefix)
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    etag = obj.get("ETag", "").strip('"')
                    if "-" in etag:  # multipart: the ETag is not the md5, the metadata is
                        head = client.head_object(Bucket=self.name, Key=obj["Key"])
                        etag = head.get("Metadata", {}).get(_MD5_META, "")
                    out[self._relative(obj["Key"])] = etag
        return out

    # upload_dir and download_dir: Bucket's, over these two

    def put_file(self, path: Path, key: str, md5: str,
                 progress: Callable[[int], None] | None) -> None:
        with self._calls(f"upload {key}"):
            self.client.upload_file(
                str(path), self.name, self._full(key), ExtraArgs={"Metadata": {_MD5_META: md5}},
                Callback=progress,  # boto3 calls it with the bytes of each chunk sent
            )

    def get_file(self, key: str, target: Path) -> None:
        with atomic_path(target) as tmp, self._calls(f"download {key}"):
            self.client.download_file(self.name, self._full(key), str(tmp))

    def signed_url(self, key: str, method: str = "GET", expires_s: int = 6 * 3600) -> str:
        operations = {"GET": "get_object", "PUT": "put_object"}
        if method.upper() not in operations:
            raise BucketError(f"signed URLs are for GET or PUT, not {method!r}")
        with self._calls(f"sign {method} {key}"):
            return self.client.generate_presigned_url(
                operations[method.upper()],
                Params={"Bucket": self.name, "Key": self._full(key)},
                ExpiresIn=min(int(expires_s), SIGV4_MAX_EXPIRY_S),
            )

    def delete_prefix(self, prefix: str) -> int:
        keys = [self._full(k) for k in self.list(prefix)]
        client = self.client
        deleted = 0
        with self._calls(f"delete {prefix}"):
            for start in range(0, len(keys), 1000):  # DeleteObjects takes 1000 at most
                batch = keys[start : start + 1000]
                resp = client.delete_objects(
                    Bucket=self.name,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
                errors = resp.get("Errors", [])
                if errors:
                    first = errors[0]
                    raise BucketError(
                        f"could not delete {len(errors)} objects in s3://{self.name}, e.g. "
                        f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}"
                    )
                deleted += len(batch)
        return deleted

    def put_bytes(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        client = self.client
        with self._calls(f"write {key}"):
            client.put_object(Bucket=self.name, Key=self._full(key), Body=data,
                              Metadata=metadata or {}, ContentType="application/json")

    def get_bytes(self, key: str) -> bytes | None:
        client = self.client
        with self._calls(f"read {key}"):
            try:
                return client.get_object(Bucket=self.name, Key=self._full(key))["Body"].read()
            except sdk.botocore_exceptions.ClientError as err:
                if error_code(err)[0] in ("NoSuchKey", "404"):
                    return None
                raise
