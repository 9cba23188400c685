"""The cloud SDKs (boto3, botocore, google-cloud-*), each imported on first use.

They cost seconds to import, and ``cloudprof --help`` or a ``--dry-run`` needs none
of them, so no module imports one at its top. Instead of a function-local
``import`` wherever a call is made, the catalog and the providers name the SDK
module they need once, here: ``sdk.botocore_exceptions.ClientError`` imports
``botocore.exceptions`` the first time it is read, and is a plain attribute read
after that. The SDK-facing code itself (sessions, clients, error translation)
lives in ``sdk.aws`` and ``sdk.gcp``, below the catalog and the providers that
share it.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any


class LazyModule:
    """A module imported the first time one of its attributes is read (thread-safe)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None
        self._lock = threading.Lock()

    def load(self) -> ModuleType:
        """The module itself, imported now if it was not yet."""
        if self._module is None:
            with self._lock:
                if self._module is None:
                    self._module = importlib.import_module(self._name)
        return self._module

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy/pickle probes: not the module's
            raise AttributeError(attr)
        return getattr(self.load(), attr)

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded"
        return f"<lazy module {self._name!r} ({state})>"


# AWS
boto3 = LazyModule("boto3")
boto3_exceptions = LazyModule("boto3.exceptions")
botocore_config = LazyModule("botocore.config")
botocore_exceptions = LazyModule("botocore.exceptions")
botocore_loaders = LazyModule("botocore.loaders")
botocore_session = LazyModule("botocore.session")

# Google Cloud
google_auth = LazyModule("google.auth")
google_auth_credentials = LazyModule("google.auth.credentials")
google_auth_exceptions = LazyModule("google.auth.exceptions")
google_auth_requests = LazyModule("google.auth.transport.requests")
google_service_account = LazyModule("google.oauth2.service_account")
api_core_client_options = LazyModule("google.api_core.client_options")
api_core_exceptions = LazyModule("google.api_core.exceptions")
api_core_retry = LazyModule("google.api_core.retry")
billing_v1 = LazyModule("google.cloud.billing_v1")
compute_v1 = LazyModule("google.cloud.compute_v1")
storage = LazyModule("google.cloud.storage")
storage_retry = LazyModule("google.cloud.storage.retry")
requests = LazyModule("requests")
