"""Routing: a provider name or bucket URL to the class that implements it.

Each cloud lives in its own modules (``gcp.py`` and ``gcp_storage.py``, ``aws.py``
and ``aws_storage.py``, ``ssh.py``, ``local.py``); this module is the only place
that knows the list. Each entry is a function that imports its module when the
provider is used, so that the CLI starts without loading any cloud SDK, and a
reader (or a tool) sees every arrow as a plain import.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.errors import BucketError, UsageError
from orchestrator.providers.base import Bucket, Provider, ProviderOptions


def _local() -> type[Provider]:
    from orchestrator.providers.local import LocalProvider

    return LocalProvider


def _ssh() -> type[Provider]:
    from orchestrator.providers.ssh import SshProvider

    return SshProvider


def _gcp() -> type[Provider]:
    from orchestrator.providers.gcp import GcpProvider

    return GcpProvider


def _aws() -> type[Provider]:
    from orchestrator.providers.aws import AwsProvider

    return AwsProvider


def _gcs() -> type[Bucket]:
    from orchestrator.providers.gcp_storage import GcsBucket

    return GcsBucket


def _s3() -> type[Bucket]:
    from orchestrator.providers.aws_storage import S3Bucket

    return S3Bucket


def _file() -> type[Bucket]:
    from orchestrator.providers.local import LocalBucket

    return LocalBucket


# name -> the function that imports and returns the provider's class
PROVIDERS: dict[str, Callable[[], type[Provider]]] = {
    "local": _local,
    "ssh": _ssh,
    "gcp": _gcp,
    "aws": _aws,
}

# bucket URL scheme -> the function that imports and returns the bucket's class
BUCKETS: dict[str, Callable[[], type[Bucket]]] = {
    "gs": _gcs,
    "s3": _s3,
    "file": _file,
}


def provider_class(name: str) -> type[Provider]:
    """The class behind ``name`` (the engine reads ``creates_machines`` before building one)."""
    if name not in PROVIDERS:
        raise UsageError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    return PROVIDERS[name]()


def get_provider(name: str, options: ProviderOptions | None = None) -> Provider:
    """The provider called ``name``, configured with ``options``."""
    return provider_class(name)(options or ProviderOptions())


def open_bucket(url: str) -> Bucket:
    """A bucket from ``gs://name``, ``s3://name``, ``file:///path`` or a plain directory path."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        scheme = "file"
    if scheme not in BUCKETS:
        raise BucketError(f"unsupported bucket URL {url!r}: use gs://, s3:// or a local directory")
    return BUCKETS[scheme]()(url)
