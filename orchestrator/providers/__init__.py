"""Routing: a provider name or bucket URL to the module that implements it.

Each cloud lives in one module (``gcp.py``, ``aws.py``, ``ssh.py``, ``local.py``)
holding both its machines and its bucket; this module is the only place that
knows the list, and imports a module only when it is used so that the CLI
starts without loading any cloud SDK.
"""

from __future__ import annotations

import importlib

from orchestrator.errors import BucketError, UsageError
from orchestrator.providers.base import Bucket, Provider, ProviderOptions

PROVIDERS: dict[str, str] = {
    "local": "orchestrator.providers.local:LocalProvider",
    "ssh": "orchestrator.providers.ssh:SshProvider",
    "gcp": "orchestrator.providers.gcp:GcpProvider",
    "aws": "orchestrator.providers.aws:AwsProvider",
}

BUCKETS: dict[str, str] = {
    "gs": "orchestrator.providers.gcp:GcsBucket",
    "s3": "orchestrator.providers.aws:S3Bucket",
    "file": "orchestrator.providers.local:LocalBucket",
}


def _load(target: str) -> type:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def provider_class(name: str) -> type[Provider]:
    """The class behind ``name`` (the engine reads ``creates_machines`` before building one)."""
    if name not in PROVIDERS:
        raise UsageError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    return _load(PROVIDERS[name])


def get_provider(name: str, options: ProviderOptions | None = None) -> Provider:
    """The provider called ``name``, configured with ``options``."""
    if name not in PROVIDERS:
        raise UsageError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    return _load(PROVIDERS[name])(options or ProviderOptions())


def open_bucket(url: str) -> Bucket:
    """A bucket from ``gs://name``, ``s3://name``, ``file:///path`` or a plain directory path."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        scheme = "file"
    if scheme not in BUCKETS:
        raise BucketError(f"unsupported bucket URL {url!r}: use gs://, s3:// or a local directory")
    return _load(BUCKETS[scheme])(url)
