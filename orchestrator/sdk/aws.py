"""AWS through boto3: sessions, the retry policy, and every SDK error as one cloudprof error.

Shared by the EC2 provider, the S3 bucket and the price fetcher, so one rule says
what a botocore error means (capacity, quota, permission, credentials) whichever
of them met it. boto3 and botocore are read through ``orchestrator.sdk``'s lazy
modules, so importing this module loads neither.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from orchestrator import sdk
from orchestrator.errors import (
    BucketError,
    CapacityError,
    CloudprofError,
    CredentialsError,
    PermissionDeniedError,
    ProviderError,
    QuotaError,
    UsageError,
)

if TYPE_CHECKING:
    import boto3

DEFAULT_REGION = "us-east-1"

CAPACITY_CODES = {
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientCapacity",
    "Unsupported",  # the type is not offered in that zone: another zone may have it
    "Server.InsufficientInstanceCapacity",
}
QUOTA_CODES = {
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "InsufficientFreeAddressesInSubnet",
}
PERMISSION_CODES = {
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "AllAccessDisabled",
    "OptInRequired",
    "Blocked",
}
CREDENTIAL_CODES = {
    "AuthFailure",
    "InvalidClientTokenId",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
}
UNKNOWN_TYPE_CODES = {"InvalidInstanceType", "InvalidInstanceType.NotFound"}
NOT_FOUND_SUFFIXES = (".NotFound", ".Malformed")

CREDENTIALS_HELP = (
    "set up AWS credentials with `aws configure` (access keys in ~/.aws), "
    "`aws sso login --profile NAME` plus AWS_PROFILE=NAME, or the AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY environment variables; `cloudprof sweep --dry-run` needs none"
)
POLICY_HINT = "infra/iam/aws-policy.json lists what cloudprof needs"


# ---------------------------------------------------------------- errors


def error_code(err: BaseException) -> tuple[str, str]:
    """(code, message) of a botocore ClientError; ("", str(err)) for anything else."""
    response = getattr(err, "response", None) or {}
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    message = str(error.get("Message") or "") or str(err)
    return code, message


def translate_error(
    err: BaseException,
    action: str,
    *,
    zone: str | None = None,
    next_zones: tuple[str, ...] = (),
) -> CloudprofError:
    """The one-line CloudprofError for an SDK exception raised while doing ``action``.

    The class tells the engine what to do: CapacityError → one try in
    ``next_zones[0]``; QuotaError and PermissionDeniedError → no retry, go on with
    the other machines; CredentialsError → stop the sweep.
    """
    exc = sdk.botocore_exceptions
    if isinstance(err, CloudprofError):
        return err
    if isinstance(err, exc.NoCredentialsError | exc.PartialCredentialsError
                  | exc.TokenRetrievalError):
        return CredentialsError(f"{action}: no usable AWS credentials ({err}); {CREDENTIALS_HELP}")
    if isinstance(err, exc.NoRegionError):
        return UsageError(f"{action}: no AWS region; pass --region or set AWS_DEFAULT_REGION")
    if not isinstance(err, exc.ClientError):
        return ProviderError(f"{action}: {type(err).__name__}: {err}")
    code, message = error_code(err)
    line = f"{action}: {code}: {message}"
    if code in CAPACITY_CODES:
        where = f" (also offered in: {', '.join(next_zones)})" if next_zones else ""
        return CapacityError(line + where, zone=zone, next_zones=next_zones)
    if code in QUOTA_CODES or code.endswith("LimitExceeded"):
        return QuotaError(f"{line} (raise the quota in the Service Quotas console)")
    if code in PERMISSION_CODES:
        return PermissionDeniedError(f"{line} ({POLICY_HINT})")
    if code in CREDENTIAL_CODES:
        return CredentialsError(f"{line}; {CREDENTIALS_HELP}")
    if code in UNKNOWN_TYPE_CODES or (
        code == "InvalidParameterValue" and "instancetype" in message.lower().replace(" ", "")
    ):
        return ProviderError(f"{action}: unknown instance type ({code}: {message})")
    return ProviderError(line)


@contextmanager
def translated(action: str, **context: Any) -> Iterator[None]:
    """Turn any SDK exception raised inside into translate_error(...)."""
    try:
        yield
    except CloudprofError:
        raise
    except Exception as err:  # SDK errors of every kind end as one line
        if type(err).__module__.split(".")[0] not in ("botocore", "boto3", "urllib3"):
            raise
        raise translate_error(err, action, **context) from err


def is_not_found(err: BaseException) -> bool:
    code, _ = error_code(err)
    return code.endswith(NOT_FOUND_SUFFIXES) or code in {"NoSuchKey", "NoSuchBucket", "404"}


# ---------------------------------------------------------------- sessions


class _SearchPaths(list[str]):
    """A loader's search paths, each once: boto3 appends its own data directory to the
    loader of every ``Session`` it makes, and ours is shared by all of them."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


_LOADERS: dict[str | None, Any] = {}  # AWS_DATA_PATH (or config's data_path) -> Loader
_LOADERS_LOCK = threading.Lock()


def _shared_loader(data_path: str | None) -> Any:
    """One botocore data loader per process (per ``data_path``), shared by every session.

    Each new session otherwise parses the service models again: EC2's alone costs
    ~0.5 s of CPU per client, and listing or deleting across the catalog's regions
    makes a session per region. The loader only reads botocore's bundled JSON, the
    same for every session of the process; its models are cached, as botocore does
    for the clients of one session. Built as ``botocore.loaders.create_loader`` does.
    """
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path)
        if loader is None:
            extra = [os.path.expanduser(os.path.expandvars(p))
                     for p in (data_path.split(os.pathsep) if data_path else [])]
            loader = sdk.botocore_loaders.Loader(extra_search_paths=_SearchPaths(extra))
            _LOADERS[data_path] = loader
        return loader


def new_session(region: str | None = None) -> boto3.session.Session:
    """A boto3 session on the standard chain (env, ~/.aws, SSO, instance role).

    Credentials, profile and region are read afresh for each session; only the
    service models are shared (``_shared_loader``).
    """
    core = sdk.botocore_session.get_session()
    core.register_component("data_loader", _shared_loader(core.get_config_variable("data_path")))
    return sdk.boto3.session.Session(botocore_session=core, region_name=region)


RETRY_ATTEMPTS = 6  # tries of one call in all: 5 retries, backoff capped at 20 s each


def retry_config(**extra: Any) -> Any:
    """botocore's own retry policy for every client: ``standard`` mode retries throttling,
    5xx answers and dropped connections with exponential backoff and jitter (``adaptive``
    adds client-side rate limiting), so three transient DescribeInstances errors while a
    VM boots are waited out instead of failing the machine. ``AWS_RETRY_MODE`` and
    ``AWS_MAX_ATTEMPTS`` still choose, as boto3 documents; a Config would otherwise win.
    """
    mode = os.environ.get("AWS_RETRY_MODE", "").strip()
    if mode not in ("standard", "adaptive"):
        mode = "standard"  # legacy mode retries fewer errors
    try:
        attempts = int(os.environ.get("AWS_MAX_ATTEMPTS", ""))
    except ValueError:
        attempts = RETRY_ATTEMPTS
    # total_max_attempts counts the first try, as AWS_MAX_ATTEMPTS does (max_attempts would not)
    retries = {"mode": mode, "total_max_attempts": max(1, attempts)}
    return sdk.botocore_config.Config(retries=retries, **extra)


def resolve_region(explicit: str | None = None) -> str:
    """--region, else AWS_REGION/AWS_DEFAULT_REGION or the profile's region, else us-east-1."""
    return explicit or new_session().region_name or DEFAULT_REGION


def check_credentials(session: boto3.session.Session | None = None) -> str:
    """The caller's ARN; CredentialsError (one line, with setup help) when there is none."""
    session = session or new_session()
    try:
        creds = session.get_credentials()
        if creds is None or not creds.get_frozen_credentials().access_key:
            raise CredentialsError(f"no AWS credentials found; {CREDENTIALS_HELP}")
        identity = session.client("sts", config=retry_config()).get_caller_identity()
    except (sdk.botocore_exceptions.BotoCoreError,
            sdk.botocore_exceptions.ClientError) as err:
        # Rejected keys are a CredentialsError with setup help; no network is not.
        raise translate_error(err, "checking AWS credentials") from err
    return str(identity.get("Arn", ""))


# ---------------------------------------------------------------- naming rules


_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def validate_bucket_name(name: str) -> None:
    """S3's naming rules, checked before any call so a typo costs nothing."""
    url = f"s3://{name}"
    if not 3 <= len(name) <= 63:
        raise BucketError(f"invalid bucket name {url!r}: S3 names have 3 to 63 characters")
    if not _BUCKET_RE.fullmatch(name):
        raise BucketError(
            f"invalid bucket name {url!r}: S3 names use lowercase letters, digits, dots and "
            "hyphens, and start and end with a letter or digit"
        )
    if ".." in name or ".-" in name or "-." in name:
        raise BucketError(f"invalid bucket name {url!r}: no adjacent dots or dot-hyphen pairs")
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        raise BucketError(f"invalid bucket name {url!r}: S3 names must not look like an IP address")
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        raise BucketError(f"invalid bucket name {url!r}: reserved prefix or suffix")
