"""Google Cloud storage: ``GcsBucket``, a cloudprof bucket (``gs://name[/prefix]``) on GCS.

VMs get no Google credentials: they read inputs and write results through V4
signed URLs made here, one object and one method each. Settings:
``CLOUDPROF_GCS_SIGNER`` (the service account that signs when ADC cannot) and the
standard ``STORAGE_EMULATOR_HOST`` (the tests' emulator). Every SDK error is one
line (``orchestrator.sdk.gcp``), a missing bucket a ``BucketError`` that says how
to create it.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import sdk, settings
from orchestrator.atomic import atomic_path
from orchestrator.errors import BucketError, CredentialsError, UsageError
from orchestrator.providers.base import Bucket
from orchestrator.sdk.gcp import (
    CREDENTIALS_HINT,
    IAM_DOC,
    api_errors,
    project_from_env,
    short,
    validate_bucket_name,
)

SIGNER_ENV = settings.GCS_SIGNER.name


def _upload_retry() -> Any:
    """google-cloud-storage's own policy (backoff on 429, 5xx and dropped connections) for
    uploads: its default retries an upload only under a generation precondition, so one
    transient 503 failed the staging; rewriting an object with the same bytes is safe."""
    return sdk.storage_retry.DEFAULT_RETRY


_signer_lock = threading.Lock()
_emulator_signer: Any = None


def _emulator_signing_credentials() -> Any:
    """A throwaway service-account identity for the emulator, which checks no signature.

    It lets the tests run the real V4 signing code; real GCS is never given it.
    """
    global _emulator_signer
    with _signer_lock:
        if _emulator_signer is None:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import rsa

            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
            _emulator_signer = sdk.google_service_account.Credentials.from_service_account_info({
                "type": "service_account", "client_email": "emulator@cloudprof.invalid",
                "private_key": pem, "token_uri": "https://oauth2.googleapis.com/token",
                "project_id": "emulator"})
        return _emulator_signer


class GcsBucket(Bucket):
    """``gs://name[/prefix]``: keys are relative to the prefix."""

    def __init__(self, url: str, project: str | None = None, workers: int = 8) -> None:
        if not url.startswith("gs://"):
            raise BucketError(f"not a GCS URL: {url!r} (expected gs://bucket[/prefix])")
        name, _, prefix = url[len("gs://"):].partition("/")
        validate_bucket_name(name)
        self.url = url
        self.name = name
        self.prefix = prefix.strip("/")
        self.project = project or project_from_env()
        self.workers = workers
        self._local = threading.local()
        self._checked = False

    # ---- plumbing

    def _client(self) -> Any:
        """One client per thread: uploads run in a pool and requests sessions are not shared."""
        client = getattr(self._local, "client", None)
        if client is None:
            try:
                client = sdk.storage.Client(project=self.project)
            except sdk.google_auth_exceptions.DefaultCredentialsError:
                raise CredentialsError(CREDENTIALS_HINT) from None
            except OSError as exc:  # no project found etc.
                raise CredentialsError(f"{CREDENTIALS_HINT} ({short(str(exc), 120)})") from None
            self._local.client = client
        return client

    def _bucket(self) -> Any:
        bucket = self._client().bucket(self.name)
        if not self._checked:
            self._check(bucket)
        return bucket

    def _check(self, bucket: Any) -> None:
        """Missing bucket or no access: one line before any upload starts.

        Listing needs only storage.objects.list (what the role in infra/iam grants);
        ``get_bucket`` would need storage.buckets.get too.
        """
        try:
            list(self._client().list_blobs(bucket, max_results=1))
        except api_errors() as exc:
            raise self._error(exc, "listing") from None
        self._checked = True

    def _error(self, exc: BaseException, action: str) -> Exception:
        gexc, auth = sdk.api_core_exceptions, sdk.google_auth_exceptions
        if isinstance(exc, gexc.NotFound):
            return BucketError(f"bucket gs://{self.name} does not exist: create it with "
                               f"`gcloud storage buckets create gs://{self.name} "
                               "--location=REGION`")
        if isinstance(exc, gexc.Forbidden | gexc.Unauthorized):
            return BucketError(f"no permission for {action} in gs://{self.name}: "
                               f"{short(getattr(exc, 'message', str(exc)), 160)} "
                               f"(roles needed: {IAM_DOC})")
        if isinstance(exc, auth.DefaultCredentialsError | auth.RefreshError):
            return CredentialsError(CREDENTIALS_HINT)
        if isinstance(exc, CredentialsError | BucketError):
            return exc
        return BucketError(f"gs://{self.name}: {action} failed: {short(str(exc), 200)}")

    def _key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, name: str) -> str:
        return name[len(self.prefix) + 1:] if self.prefix else name

    # ---- Bucket interface

    def list(self, prefix: str) -> dict[str, str]:
        """Keys below the directory ``prefix`` ("" for all) with their md5 (hex)."""
        bucket = self._bucket()
        full = self._key(prefix) if prefix.strip("/") else self.prefix
        full = f"{full}/" if full else None
        try:
            blobs = list(self._client().list_blobs(bucket, prefix=full))
        except api_errors() as exc:
            raise self._error(exc, "listing") from None
        return {self._rel(b.name): base64.b64decode(b.md5_hash).hex() if b.md5_hash else ""
                for b in blobs}

    # upload_dir and download_dir: Bucket's, over these two

    def put_file(self, path: Path, key: str, md5: str,
                 progress: Callable[[int], None] | None) -> None:
        try:
            self._client().bucket(self.name).blob(self._key(key)).upload_from_filename(
                str(path), checksum="md5", retry=_upload_retry())
        except api_errors() as exc:
            raise self._error(exc, f"uploading {key}") from None
        if progress is not None:  # the client reports no bytes mid-file: one call a file
            progress(path.stat().st_size)

    def get_file(self, key: str, target: Path) -> None:
        try:
            with atomic_path(target) as tmp:
                self._client().bucket(self.name).blob(self._key(key)).download_to_filename(
                    str(tmp))
        except api_errors() as exc:
            raise self._error(exc, f"downloading {key}") from None

    def signed_url(self, key: str, method: str = "GET", expires_s: int = 6 * 3600) -> str:
        """A V4 signed URL for one object and one method: all the VM ever gets.

        Signing needs a private key the user's ADC may not have: a service-account key
        or impersonated credentials sign directly; otherwise ``CLOUDPROF_GCS_SIGNER``
        names a service account whose key Google signs with (IAM signBlob).
        """
        method = method.upper()
        if method not in ("GET", "PUT"):
            raise UsageError(f"signed URLs are for GET or PUT, not {method}")
        blob = self._client().bucket(self.name).blob(self._key(key))
        kwargs: dict[str, Any] = {"version": "v4", "method": method,
                                  "expiration": dt.timedelta(seconds=expires_s)}
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            if "://" not in emulator:
                emulator = f"http://{emulator}"
            kwargs.update(api_access_endpoint=emulator,
                          credentials=_emulator_signing_credentials())
        else:
            creds = self._client()._credentials
            signer = settings.GCS_SIGNER.get()
            if signer:
                if not creds.valid:
                    creds.refresh(sdk.google_auth_requests.Request())
                kwargs.update(service_account_email=signer, access_token=creds.token)
            elif not (hasattr(creds, "sign_bytes") and getattr(creds, "signer_email", None)):
                raise CredentialsError(
                    "GCS signed URLs need a signing identity: set "
                    f"{SIGNER_ENV}=SA_EMAIL (you need roles/iam.serviceAccountTokenCreator "
                    "on it), or run `gcloud auth application-default login "
                    "--impersonate-service-account=SA_EMAIL`")
        try:
            return blob.generate_signed_url(**kwargs)
        except api_errors() as exc:
            raise self._error(exc, f"signing a URL for {key}") from None

    def delete_prefix(self, prefix: str) -> int:
        keys = list(self.list(prefix))

        def delete(key: str) -> int:
            try:
                self._client().bucket(self.name).blob(self._key(key)).delete()
            except sdk.api_core_exceptions.NotFound:
                return 0
            except api_errors() as exc:
                raise self._error(exc, f"deleting {key}") from None
            return 1

        return sum(self._parallel(delete, keys))

    def put_bytes(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        blob = self._bucket().blob(self._key(key))
        blob.metadata = metadata or None
        try:
            blob.upload_from_string(data, content_type="application/json")
        except api_errors() as exc:
            raise self._error(exc, f"writing {key}") from None

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._bucket().blob(self._key(key)).download_as_bytes()
        except sdk.api_core_exceptions.NotFound:
            return None
        except api_errors() as exc:
            raise self._error(exc, f"reading {key}") from None
