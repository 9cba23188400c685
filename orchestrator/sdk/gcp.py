"""Google Cloud through its client libraries: credentials, Compute clients, errors.

Shared by the Compute Engine provider, the GCS bucket and the price fetcher, so
one rule says what a google error means, whichever of them met it: the sweep
engine decides by class (a ``CapacityError`` is worth one try in the next zone, a
``QuotaError`` is not, a ``PermissionDeniedError`` points at ``IAM_DOC``). The
libraries are read through ``orchestrator.sdk``'s lazy modules, so importing this
module loads none of them.
"""

from __future__ import annotations

import os
import re
from typing import Any

from orchestrator import sdk, settings
from orchestrator.errors import (
    BucketError,
    CapacityError,
    CredentialsError,
    PermissionDeniedError,
    ProviderError,
    QuotaError,
    UsageError,
)

PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
IAM_DOC = "infra/iam/gcp-roles.md"
CREDENTIALS_HINT = (
    "no Google Cloud credentials: run `gcloud auth application-default login` "
    "(or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file); "
    "--dry-run needs none"
)
STOCKOUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                  "RESOURCE_POOL_EXHAUSTED", "STOCKOUT")
QUOTA_CODES = ("QUOTA_EXCEEDED", "quotaExceeded")


# ---------------------------------------------------------------- credentials and clients


def endpoint() -> str | None:
    """The Compute REST endpoint of a stand-in (``CLOUDPROF_GCE_ENDPOINT``); None for Google's."""
    return settings.GCE_ENDPOINT.get()


def credentials(scope: str, *, anonymous: bool = False) -> tuple[Any, str | None]:
    """(credentials, ADC's project): Application Default Credentials for ``scope``, or
    anonymous ones for a stand-in endpoint; no ADC is one line with setup help."""
    if anonymous:
        return sdk.google_auth_credentials.AnonymousCredentials(), None
    try:
        found, project = sdk.google_auth.default(scopes=[scope])
    except sdk.google_auth_exceptions.DefaultCredentialsError:
        raise CredentialsError(CREDENTIALS_HINT) from None
    return found, project


def project_from_env() -> str | None:
    """The project the standard variables name (GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT)."""
    return next((os.environ[e] for e in PROJECT_ENVS if os.environ.get(e)), None)


def resolve_project(explicit: str | None, adc_project: str | None) -> str:
    """--project, else the standard variables, else ADC's own; UsageError when none."""
    project = explicit or project_from_env() or adc_project
    if not project:
        raise UsageError("no Google Cloud project: pass --project or set GOOGLE_CLOUD_PROJECT")
    return project


def compute_client(kind: str, creds: Any) -> Any:
    """A ``google.cloud.compute_v1`` client (``kind``, e.g. "InstancesClient") over REST,
    pointed at ``CLOUDPROF_GCE_ENDPOINT`` when a stand-in is set."""
    url = endpoint()
    options = sdk.api_core_client_options.ClientOptions(api_endpoint=url) if url else None
    return getattr(sdk.compute_v1, kind)(transport="rest", credentials=creds,
                                         client_options=options)


# ---------------------------------------------------------------- errors


def short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def api_errors() -> tuple[type[BaseException], ...]:
    """What a google call raises for reasons outside cloudprof (never its own bugs)."""
    return (sdk.api_core_exceptions.GoogleAPICallError, sdk.google_auth_exceptions.GoogleAuthError,
            sdk.requests.RequestException)


def translate_api_error(exc: BaseException, what: str) -> Exception:
    """An SDK exception (HTTP error from a call) as one cloudprof error."""
    gexc, auth = sdk.api_core_exceptions, sdk.google_auth_exceptions
    if isinstance(exc, auth.DefaultCredentialsError):
        return CredentialsError(CREDENTIALS_HINT)
    if isinstance(exc, auth.TransportError):  # the network, not the login
        return ProviderError(f"gcp: cannot reach Google for {what}: {short(str(exc), 160)}")
    if isinstance(exc, auth.GoogleAuthError):
        return CredentialsError(f"gcp: credentials failed for {what}: {short(str(exc), 160)}; "
                                "run `gcloud auth application-default login`")
    if isinstance(exc, sdk.requests.RequestException):
        return ProviderError(f"gcp: cannot reach Compute Engine for {what}: "
                             f"{short(str(exc), 160)}")

    message = short(getattr(exc, "message", None) or str(exc))
    details = [str(getattr(exc, "reason", "") or "")] + [
        str(e.get("reason", "")) for e in (getattr(exc, "errors", None) or [])
        if isinstance(e, dict)]
    reasons = " ".join(details) + " " + message
    if any(code in reasons for code in STOCKOUT_CODES):
        return CapacityError(f"gcp: no capacity for {what}: {message}")
    if any(code in reasons for code in QUOTA_CODES) or "Quota " in message:
        return QuotaError(f"gcp: quota exceeded for {what}: {message}")
    if isinstance(exc, gexc.Unauthenticated | gexc.Unauthorized):
        return CredentialsError(f"gcp: credentials rejected for {what}: {message}; "
                                "run `gcloud auth application-default login`")
    if isinstance(exc, gexc.Forbidden | gexc.PermissionDenied):
        return PermissionDeniedError(f"gcp: permission denied for {what}: {message} "
                                     f"(roles needed: {IAM_DOC})")
    return ProviderError(f"gcp: {what} failed: {message}")


def translate_operation_error(op: Any, what: str) -> Exception | None:
    """The error a finished GCE operation reports (how GCE reports stockouts), if any."""
    errors = list(op.error.errors) if op.error else []
    if not errors and not op.http_error_status_code:
        return None
    codes = [e.code for e in errors]
    message = short("; ".join(f"{e.code}: {e.message}" for e in errors)
                     or f"{op.http_error_status_code} {op.http_error_message}")
    if any(c in STOCKOUT_CODES for c in codes) or "stockout" in message.lower():
        return CapacityError(f"gcp: no capacity for {what} ({message})")
    if any(c in QUOTA_CODES for c in codes):
        return QuotaError(f"gcp: quota exceeded for {what} ({message}); "
                          "raise it in the console (IAM & Admin → Quotas)")
    if op.http_error_status_code == 403:
        return PermissionDeniedError(f"gcp: permission denied for {what} ({message}); "
                                     f"roles needed: {IAM_DOC}")
    return ProviderError(f"gcp: {what} failed ({message})")


# ---------------------------------------------------------------- naming rules


_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")


def validate_bucket_name(name: str) -> None:
    """GCS naming rules, checked before any call so a typo costs no round trip."""
    problem = None
    if not 3 <= len(name) <= 222:
        problem = "must be 3-63 characters (up to 222 with dots)"
    elif not _BUCKET_RE.match(name):
        problem = ("may hold only lower-case letters, digits, '-', '_' and '.', "
                   "and must start and end with a letter or digit")
    elif "." not in name and len(name) > 63:
        problem = "must be at most 63 characters without dots"
    elif any(not 1 <= len(part) <= 63 for part in name.split(".")):
        problem = "each dot-separated part must be 1-63 characters"
    elif re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        problem = "must not look like an IP address"
    elif name.startswith("goog") or re.search(r"g[o0]{2}g[l1]e", name):
        problem = "must not start with 'goog' or contain 'google'"
    if problem:
        raise BucketError(f"invalid GCS bucket name {name!r}: {problem}")
