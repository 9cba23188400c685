"""AWS: EC2 machines (``AwsProvider``) and S3 buckets (``S3Bucket``) through boto3.

Everything a sweep makes here carries cloudprof's tags (sweep id, creator,
creation and expiry time) so that teardown, ``cloudprof cleanup`` and the
least-privilege policy in ``infra/iam/aws-policy.json`` can find it by tag:

- one key pair per sweep, imported from the sweep's generated public key (never
  the user's own key), deleted with the sweep's last instance;
- one security group per sweep in the region's default VPC, admitting TCP 22
  from the caller's address only, deleted with the sweep's last instance; for a
  multi-node sweep (``VmRequest.cluster``) it also admits every TCP/UDP port
  from members of the group itself (a rule that references its own group), so
  the sweep's VMs reach each other and nothing else reaches them;
- instances with ``InstanceInitiatedShutdownBehavior=terminate`` and root
  volumes that die with them, so the startup script's self-shutdown deletes
  the VM even when the laptop that started it is gone.

VMs get no AWS credentials: they read inputs and write results through
presigned S3 URLs made here (``S3Bucket.signed_url``), scoped to one object and
a few hours. boto3 is imported inside functions so the CLI starts without it;
every SDK error is translated to a one-line ``CloudprofError`` (see
``translate_error``) that the engine can act on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.atomic import atomic_path
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
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_CREATOR,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    Bucket,
    Executor,
    Instance,
    Provider,
    ProviderOptions,
    Resource,
    VmRequest,
    creator_label,
)

if TYPE_CHECKING:
    import boto3

_T = TypeVar("_T")

DEFAULT_REGION = "us-east-1"
IMAGE_ENV = "CLOUDPROF_AWS_IMAGE"  # default image when the request names none
DEFAULT_TTL_S = 6 * 3600  # expiry tag when the engine gives none
USER_DATA_LIMIT = 16 * 1024  # EC2 refuses larger user data

# Images by short name → SSM public parameter per CPU architecture. Debian 12 is
# the default, as on GCP: its Python (3.11) runs the workloads wheel as it is.
_UBUNTU = "/aws/service/canonical/ubuntu/server"
IMAGES: dict[str, dict[str, str]] = {
    "ubuntu-24.04": {
        "x86_64": f"{_UBUNTU}/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id",
        "arm64": f"{_UBUNTU}/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id",
    },
    "ubuntu-22.04": {
        "x86_64": f"{_UBUNTU}/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id",
        "arm64": f"{_UBUNTU}/22.04/stable/current/arm64/hvm/ebs-gp2/ami-id",
    },
    "debian-12": {
        "x86_64": "/aws/service/debian/release/12/latest/amd64",
        "arm64": "/aws/service/debian/release/12/latest/arm64",
    },
    "al2023": {
        "x86_64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
        "arm64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
    },
}
DEFAULT_IMAGE = "debian-12"

# Every state but "terminated": what still costs money or may come back.
LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]

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
CLUSTER_RULE = "security-group-rule"  # AwsResource.kind of a group's inter-node rule


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
    from botocore.exceptions import (
        ClientError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        TokenRetrievalError,
    )

    if isinstance(err, CloudprofError):
        return err
    if isinstance(err, NoCredentialsError | PartialCredentialsError | TokenRetrievalError):
        return CredentialsError(f"{action}: no usable AWS credentials ({err}); {CREDENTIALS_HELP}")
    if isinstance(err, NoRegionError):
        return UsageError(f"{action}: no AWS region; pass --region or set AWS_DEFAULT_REGION")
    if not isinstance(err, ClientError):
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
def _translated(action: str, **context: Any) -> Iterator[None]:
    """Turn any SDK exception raised inside into translate_error(...)."""
    try:
        yield
    except CloudprofError:
        raise
    except Exception as err:  # SDK errors of every kind end as one line
        if type(err).__module__.split(".")[0] not in ("botocore", "boto3", "urllib3"):
            raise
        raise translate_error(err, action, **context) from err


def _is_not_found(err: BaseException) -> bool:
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
            from botocore.loaders import Loader

            extra = [os.path.expanduser(os.path.expandvars(p))
                     for p in (data_path.split(os.pathsep) if data_path else [])]
            loader = _LOADERS[data_path] = Loader(extra_search_paths=_SearchPaths(extra))
        return loader


def _session(region: str | None = None) -> boto3.session.Session:
    """A boto3 session on the standard chain (env, ~/.aws, SSO, instance role).

    Credentials, profile and region are read afresh for each session; only the
    service models are shared (``_shared_loader``).
    """
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    core.register_component("data_loader", _shared_loader(core.get_config_variable("data_path")))
    return boto3.session.Session(botocore_session=core, region_name=region)


RETRY_ATTEMPTS = 6  # tries of one call in all: 5 retries, backoff capped at 20 s each


def retry_config(**extra: Any) -> Any:
    """botocore's own retry policy for every client: ``standard`` mode retries throttling,
    5xx answers and dropped connections with exponential backoff and jitter (``adaptive``
    adds client-side rate limiting), so three transient DescribeInstances errors while a
    VM boots are waited out instead of failing the machine. ``AWS_RETRY_MODE`` and
    ``AWS_MAX_ATTEMPTS`` still choose, as boto3 documents; a Config would otherwise win.
    """
    from botocore.config import Config

    mode = os.environ.get("AWS_RETRY_MODE", "").strip()
    if mode not in ("standard", "adaptive"):
        mode = "standard"  # legacy mode retries fewer errors
    try:
        attempts = int(os.environ.get("AWS_MAX_ATTEMPTS", ""))
    except ValueError:
        attempts = RETRY_ATTEMPTS
    # total_max_attempts counts the first try, as AWS_MAX_ATTEMPTS does (max_attempts would not)
    return Config(retries={"mode": mode, "total_max_attempts": max(1, attempts)}, **extra)


def resolve_region(explicit: str | None = None) -> str:
    """--region, else AWS_REGION/AWS_DEFAULT_REGION or the profile's region, else us-east-1."""
    return explicit or _session().region_name or DEFAULT_REGION


def check_credentials(session: boto3.session.Session | None = None) -> str:
    """The caller's ARN; CredentialsError (one line, with setup help) when there is none."""
    from botocore.exceptions import BotoCoreError, ClientError

    session = session or _session()
    try:
        creds = session.get_credentials()
        if creds is None or not creds.get_frozen_credentials().access_key:
            raise CredentialsError(f"no AWS credentials found; {CREDENTIALS_HELP}")
        identity = session.client("sts", config=retry_config()).get_caller_identity()
    except (BotoCoreError, ClientError) as err:
        # Rejected keys are a CredentialsError with setup help; no network is not.
        raise translate_error(err, "checking AWS credentials") from err
    return str(identity.get("Arn", ""))


# ---------------------------------------------------------------- tags


def resource_tags(req: VmRequest) -> dict[str, str]:
    """cloudprof's four tags for a request: the engine's labels, defaults for any missing."""
    tags = {k: v for k, v in req.labels.items() if v}
    tags.setdefault(LABEL_SWEEP, req.sweep_id)
    if LABEL_CREATOR not in tags:
        tags[LABEL_CREATOR] = creator_label()
    now = int(time.time())
    tags.setdefault(LABEL_CREATED, str(now))
    tags.setdefault(LABEL_EXPIRES, str(now + DEFAULT_TTL_S))
    return tags


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _tag_dict(tag_list: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tag_list or []}


def _tag_filters(labels: dict[str, str]) -> list[dict[str, Any]]:
    filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in labels.items()]
    if not labels:  # "everything cloudprof made"
        filters.append({"Name": "tag-key", "Values": [LABEL_SWEEP]})
    return filters


def sweep_resource_name(sweep_id: str) -> str:
    """Name of the sweep's key pair and security group."""
    return f"cloudprof-{sweep_id}"


# ---------------------------------------------------------------- helpers


def image_parameter(image: str | None, machine: str) -> str | None:
    """SSM parameter for ``image`` (short name, parameter path); None for a literal AMI id."""
    image = image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE
    if image.startswith("ami-"):
        return None
    if image.startswith("/"):
        return image
    if image not in IMAGES:
        raise UsageError(
            f"unknown AWS image {image!r}: use one of {', '.join(IMAGES)}, "
            "an SSM parameter path (/aws/service/...) or an AMI id (ami-...)"
        )
    from orchestrator.catalog.machines import machine_arch

    return IMAGES[image][machine_arch("aws", machine)]  # Graviton machines boot arm64


# ---------------------------------------------------------------- resources (cleanup)


@dataclass
class AwsResource(Resource):
    """Something a sweep made in AWS, as ``cloudprof cleanup`` lists it."""

    kind: str  # "instance", "security-group", "key-pair", "security-group-rule"
    id: str
    name: str
    region: str
    state: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    zone: str | None = None  # instances only
    group_id: str | None = None  # inter-node rules only: the group the rule belongs to


def regions_to_search(primary: str, extra: set[str] | None = None) -> list[str]:
    """``primary`` first, then every other region cloudprof may have put machines in.

    That is the catalog's AWS regions (where the planner sends a machine by
    default) plus ``extra``, so cleanup and resume find a sweep's machines even
    when the shell's default region is another one.
    """
    from orchestrator.catalog.machines import load_catalog

    try:
        catalog = {m.region for m in load_catalog("aws") if m.region}
    except CloudprofError:  # an unreadable catalog must not block cleanup
        catalog = set()
    return [primary, *sorted((catalog | (extra or set())) - {primary})]


def list_resources(
    labels: dict[str, str] | None = None,
    region: str | None = None,
    session: boto3.session.Session | None = None,
) -> list[AwsResource]:
    """Live instances, key pairs, security groups and the groups' inter-node rules
    carrying all of ``labels`` (a rule carries its group's tags).

    With no labels: everything that carries a cloudprof sweep tag. With no
    region: the default region and the catalog's (see ``regions_to_search``).
    """
    regions = [region] if region else regions_to_search(resolve_region())
    # Clients first, here: a boto3 session is not thread-safe (its clients are), and the
    # first one parses EC2's model once for the others (_shared_loader), not once per thread.
    clients = {where: (session or _session(where)).client("ec2", region_name=where)
               for where in regions}
    return _across_regions(regions,
                           lambda where: _list_region(labels or {}, where, clients[where]))


_REGION_THREADS = 8  # regions listed at once: each is a few round trips, mostly waiting


def _across_regions(regions: list[str], list_one: Callable[[str], list[_T]]) -> list[_T]:
    """``list_one`` over the regions, at once, in the order given; a secondary region we
    may not use is skipped.

    Each region is a few calls to a distant endpoint (~0.1-0.3 s each from a laptop),
    so one after another they add up over the catalog's regions for every cleanup,
    resume and teardown. Nothing cloudprof made can be in a region its credentials
    cannot reach (an SCP, an opt-in region), so skipping it loses nothing; the first
    region's errors are raised, as is any other error, the first region's first.
    """
    if len(regions) <= 1:
        return [item for region in regions for item in list_one(region)]
    with concurrent.futures.ThreadPoolExecutor(min(len(regions), _REGION_THREADS)) as pool:
        futures = [pool.submit(list_one, region) for region in regions]
    out: list[_T] = []
    for index, future in enumerate(futures):
        try:
            out.extend(future.result())
        except (PermissionDeniedError, CredentialsError):
            if index == 0:
                raise
    return out


def _list_region(labels: dict[str, str], region: str, ec2: Any) -> list[AwsResource]:
    filters = _tag_filters(labels)
    out: list[AwsResource] = []
    with _translated(f"listing cloudprof resources in {region}"):
        for inst in _describe_instances(ec2, filters):
            tags = _tag_dict(inst.get("Tags"))
            out.append(
                AwsResource(
                    "instance",
                    inst["InstanceId"],
                    tags.get("Name", ""),
                    region,
                    inst["State"]["Name"],
                    tags,
                    (inst.get("Placement") or {}).get("AvailabilityZone"),
                )
            )
        groups = {g["GroupId"]: g for g in
                  ec2.describe_security_groups(Filters=filters)["SecurityGroups"]}
        for group in groups.values():
            out.append(
                AwsResource(
                    "security-group",
                    group["GroupId"],
                    group["GroupName"],
                    region,
                    "",
                    _tag_dict(group.get("Tags")),
                )
            )
        for rule in _cluster_rules(ec2, list(groups)):
            group = groups[rule["GroupId"]]
            out.append(
                AwsResource(
                    CLUSTER_RULE,
                    rule["SecurityGroupRuleId"],
                    f"{group['GroupName']} inter-node {rule['IpProtocol']}",
                    region,
                    "",
                    _tag_dict(group.get("Tags")),  # a rule carries its group's tags
                    group_id=group["GroupId"],
                )
            )
        for pair in ec2.describe_key_pairs(Filters=filters)["KeyPairs"]:
            out.append(
                AwsResource(
                    "key-pair",
                    pair.get("KeyPairId", pair["KeyName"]),
                    pair["KeyName"],
                    region,
                    "",
                    _tag_dict(pair.get("Tags")),
                )
            )
    return out


def delete_resources(
    resources: list[AwsResource],
    wait_s: float = 600,
    session: boto3.session.Session | None = None,
) -> None:
    """Delete what ``list_resources`` found: instances first, then groups and keys they used."""
    by_region: dict[str, list[AwsResource]] = {}
    for res in resources:
        by_region.setdefault(res.region, []).append(res)
    for region, items in by_region.items():
        ec2 = (session or _session(region)).client("ec2", region_name=region)
        instance_ids = [r.id for r in items if r.kind == "instance"]
        if instance_ids:
            _terminate(ec2, instance_ids, wait_s)
        for res in sorted(items, key=lambda r: r.kind != CLUSTER_RULE):  # rules, then groups
            if res.kind == CLUSTER_RULE:
                _revoke_cluster_rule(ec2, res)
            elif res.kind == "security-group":
                _delete_security_group(ec2, res.id, wait_s)
            elif res.kind == "key-pair":
                _delete_key_pair(ec2, res.name)


def _cluster_rules(ec2: Any, group_ids: list[str]) -> list[dict[str, Any]]:
    """The inter-node rules of ``group_ids``: ingress rules that reference their own group."""
    if not group_ids:
        return []
    rules: list[dict[str, Any]] = []
    pages = ec2.get_paginator("describe_security_group_rules").paginate(
        Filters=[{"Name": "group-id", "Values": group_ids}]
    )
    for page in pages:
        rules.extend(
            r for r in page["SecurityGroupRules"]
            if not r.get("IsEgress")
            and (r.get("ReferencedGroupInfo") or {}).get("GroupId") == r["GroupId"]
        )
    return rules


def _revoke_cluster_rule(ec2: Any, res: AwsResource) -> None:
    """Revoke one inter-node rule cleanup found; a rule or group already gone is fine."""
    from botocore.exceptions import ClientError

    with _translated(f"revoking inter-node rule {res.id} of {res.group_id}"):
        try:
            ec2.revoke_security_group_ingress(GroupId=res.group_id, SecurityGroupRuleIds=[res.id])
        except ClientError as err:
            if not (_is_not_found(err) or error_code(err)[0] == "InvalidPermission.NotFound"):
                raise


def _describe_instances(ec2: Any, filters: list[dict[str, Any]]) -> Iterator[dict]:
    filters = [*filters, {"Name": "instance-state-name", "Values": LIVE_STATES}]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            yield from reservation["Instances"]


def _describe_one(ec2: Any, instance_id: str) -> dict[str, Any]:
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def _terminate(ec2: Any, instance_ids: list[str], wait_s: float) -> None:
    """Terminate and wait until gone; ids that no longer exist are fine."""
    from botocore.exceptions import ClientError

    with _translated(f"terminating {', '.join(instance_ids)}"):
        gone: list[str] = []
        for iid in instance_ids:
            try:
                ec2.terminate_instances(InstanceIds=[iid])
                gone.append(iid)
            except ClientError as err:
                if not _is_not_found(err):
                    raise
        if gone:
            _wait(ec2, "instance_terminated", gone, wait_s)


def _wait(ec2: Any, waiter: str, instance_ids: list[str], wait_s: float) -> None:
    delay = max(1, min(AwsProvider.poll_s, wait_s))
    ec2.get_waiter(waiter).wait(
        InstanceIds=instance_ids,
        WaiterConfig={"Delay": delay, "MaxAttempts": max(1, int(wait_s / delay))},
    )


def _delete_security_group(ec2: Any, group_id: str, wait_s: float = 300) -> None:
    """Delete a group; retry while a terminating instance's interface still holds it.

    A group one of whose own rules references it (the inter-node rule) cannot be
    deleted on AWS until that rule is gone, so such rules are revoked first.
    """
    from botocore.exceptions import ClientError

    deadline = time.monotonic() + wait_s
    delay = 1.0
    with _translated(f"deleting security group {group_id}"):
        try:
            own = [r["SecurityGroupRuleId"] for r in _cluster_rules(ec2, [group_id])]
            if own:
                ec2.revoke_security_group_ingress(GroupId=group_id, SecurityGroupRuleIds=own)
        except ClientError as err:
            if not (_is_not_found(err) or error_code(err)[0] == "InvalidPermission.NotFound"):
                raise
        while True:
            try:
                ec2.delete_security_group(GroupId=group_id)
                return
            except ClientError as err:
                code, _ = error_code(err)
                if _is_not_found(err):
                    return
                if code != "DependencyViolation" or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 15)


def _delete_key_pair(ec2: Any, key_name: str) -> None:
    from botocore.exceptions import ClientError

    with _translated(f"deleting key pair {key_name}"):
        try:
            ec2.delete_key_pair(KeyName=key_name)
        except ClientError as err:
            if not _is_not_found(err):
                raise


# ---------------------------------------------------------------- provider


class AwsProvider(Provider):
    """EC2 instances in one region, each sweep with its own key pair and security group."""

    name = "aws"
    poll_s: float = 5.0  # waiter delay; EC2 needs ~30 s to boot anyway

    def __init__(self, options: ProviderOptions | None = None) -> None:
        self.options = options or ProviderOptions()
        self.region = resolve_region(self.options.region or _region_of(self.options.zone))
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.RLock()  # per-sweep resources, made once across threads
        self._creating: dict[str, int] = {}  # sweep id → creates in flight
        self._regions: set[str] = set()  # where create() was asked to put machines
        self._session: boto3.session.Session | None = None

    # -- plumbing

    @property
    def session(self) -> boto3.session.Session:
        if self._session is None:
            self._session = _session(self.region)
        return self._session

    def _client(self, service: str, region: str | None = None) -> Any:
        key = (service, region or self.region)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self.session.client(service, region_name=key[1],
                                                         config=retry_config())
            return self._clients[key]

    def _region_for(self, zone: str | None, region: str | None = None) -> str:
        return region or _region_of(zone) or self.region

    # -- Provider

    def check_credentials(self) -> None:
        check_credentials(self.session)

    def create(self, req: VmRequest) -> Instance:
        zone = req.zone or self.options.zone
        region = self._region_for(zone, req.region)
        self._regions.add(region)
        ec2 = self._client("ec2", region)
        tags = resource_tags(req)
        sweep = tags[LABEL_SWEEP]  # the engine's label value: what list() and cleanup match
        script = req.startup_script or ""
        size = len(script.encode())
        if size > USER_DATA_LIMIT:
            raise ProviderError(
                f"startup script is {size} bytes; EC2 user data allows {USER_DATA_LIMIT}"
            )
        with self._lock:
            self._creating[sweep] = self._creating.get(sweep, 0) + 1
        try:
            with self._lock:  # nodes of one sweep are created in parallel: one group, one rule
                key_name = self._ensure_key_pair(ec2, req, tags)
                group_id = self._ensure_security_group(ec2, tags, region)
                if req.cluster:
                    self._ensure_cluster_rule(ec2, group_id)
            image_id, root_device = self._image(region, req)
            params = self._run_params(req, tags, zone, image_id, root_device, key_name, group_id)
            described = self._run_instance(ec2, params, req, zone, region)
        except BaseException:
            with self._lock:
                self._creating[sweep] -= 1
            # Nothing runs: leave no key pair or group behind (unless others still use them).
            with contextlib.suppress(CloudprofError):
                self._release_sweep_resources(region, sweep)
            raise
        with self._lock:
            self._creating[sweep] -= 1
        inst = _to_instance(described, region)
        inst.user = req.ssh_user
        return inst

    def wait_ready(self, inst: Instance, timeout: float = 600) -> Instance:
        from botocore.exceptions import WaiterError

        region = self._region_for(inst.zone)
        ec2 = self._client("ec2", region)
        with _translated(f"waiting for {inst.name or inst.id}", zone=inst.zone):
            try:
                _wait(ec2, "instance_running", [inst.id], timeout)
            except WaiterError as err:
                # An error that outlived the client's retries ends the waiter too; a VM
                # that is running by now is ready all the same.
                if not _is_running(ec2, inst.id):
                    raise self._not_running(ec2, inst, timeout) from err
            described = _describe_one(ec2, inst.id)
        ready = _to_instance(described, region)
        ready.user = inst.user
        if not ready.facts.get("public_ip"):
            raise ProviderError(
                f"{inst.id} is running without a public IP: the default VPC's subnet in "
                f"{ready.zone} does not assign one (enable auto-assign public IPv4)"
            )
        return ready

    def connect(self, inst: Instance) -> Executor:
        from orchestrator.providers import remote

        return remote.connect(inst, self.options.ssh)

    def delete(self, inst: Instance) -> None:
        region = self._region_for(inst.zone)
        ec2 = self._client("ec2", region)
        _terminate(ec2, [inst.id], wait_s=900)
        sweep_id = inst.labels.get(LABEL_SWEEP) or self.options.sweep_id
        if sweep_id:
            self._release_sweep_resources(region, sweep_id)

    def list(self, labels: dict[str, str]) -> list[Instance]:
        """Live instances in the provider's region, those it created in, and the catalog's."""

        def list_one(region: str) -> list[Instance]:
            ec2 = self._client("ec2", region)
            with _translated(f"listing instances in {region}"):
                found = _describe_instances(ec2, _tag_filters(labels))
                return [_to_instance(i, region) for i in found]

        return _across_regions(regions_to_search(self.region, self._regions), list_one)

    def list_resources(self, labels: dict[str, str] | None = None) -> list[Resource]:
        """Instances, key pairs, security groups and inter-node rules carrying ``labels``,
        in the regions ``list`` searches (see the module's ``list_resources``)."""
        regions = regions_to_search(self.region, self._regions)
        clients = {where: self._client("ec2", where) for where in regions}  # made here, once
        return list(_across_regions(
            regions, lambda where: _list_region(labels or {}, where, clients[where])))

    def delete_resources(self, resources: Sequence[Resource]) -> None:
        """Delete what ``list_resources`` found, instances first (the module's function)."""
        delete_resources([r for r in resources if isinstance(r, AwsResource)],
                         session=self.session)

    # -- per-sweep key pair and security group

    def _ensure_key_pair(self, ec2: Any, req: VmRequest, tags: dict[str, str]) -> str:
        from botocore.exceptions import ClientError

        key_name = sweep_resource_name(tags[LABEL_SWEEP])
        if not req.ssh_public_key.strip():
            raise ProviderError("no SSH public key for the sweep (the engine makes one per sweep)")
        with _translated(f"importing key pair {key_name}"):
            try:
                ec2.import_key_pair(
                    KeyName=key_name,
                    PublicKeyMaterial=req.ssh_public_key.strip().encode(),
                    TagSpecifications=_shared_tags("key-pair", tags, key_name),
                )
            except ClientError as err:
                # Same sweep (resume, or a second machine): the same key was imported.
                if error_code(err)[0] != "InvalidKeyPair.Duplicate":
                    raise
        return key_name

    def _ensure_security_group(self, ec2: Any, tags: dict[str, str], region: str) -> str:
        from botocore.exceptions import ClientError

        sweep = tags[LABEL_SWEEP]
        name = sweep_resource_name(sweep)
        from orchestrator.providers.remote import caller_cidr

        cidr = caller_cidr()
        with _translated(f"creating security group {name}"):
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
            if not vpcs:
                raise ProviderError(
                    f"no default VPC in {region}; create one with `aws ec2 create-default-vpc "
                    f"--region {region}`"
                )
            vpc_id = vpcs[0]["VpcId"]
            try:
                group_id = ec2.create_security_group(
                    GroupName=name,
                    Description=f"cloudprof sweep {sweep}: SSH from the caller only",
                    VpcId=vpc_id,
                    TagSpecifications=_shared_tags("security-group", tags, name),
                )["GroupId"]
            except ClientError as err:
                if error_code(err)[0] != "InvalidGroup.Duplicate":
                    raise
                group_id = ec2.describe_security_groups(
                    Filters=[
                        {"Name": "group-name", "Values": [name]},
                        {"Name": "vpc-id", "Values": [vpc_id]},
                    ]
                )["SecurityGroups"][0]["GroupId"]
            ranges = (
                {"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": "cloudprof: the caller"}]}
                if ":" in cidr
                else {"IpRanges": [{"CidrIp": cidr, "Description": "cloudprof: the caller"}]}
            )
            try:
                ec2.authorize_security_group_ingress(
                    GroupId=group_id,
                    IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}],
                )
            except ClientError as err:
                if error_code(err)[0] != "InvalidPermission.Duplicate":
                    raise
        return group_id

    def _ensure_cluster_rule(self, ec2: Any, group_id: str) -> None:
        """Let the group's members reach each other on every TCP and UDP port (Ray's ports
        are many and partly random), and nobody else: the rule names the group itself.

        Checked before it is added (moto, unlike EC2, accepts a duplicate); called
        under the provider's lock, so parallel creates add it once.
        """
        from botocore.exceptions import ClientError

        with _translated(f"opening the inter-node ports of {group_id}"):
            present = {r["IpProtocol"] for r in _cluster_rules(ec2, [group_id])
                       if r.get("FromPort") == 0 and r.get("ToPort") == 65535}
            missing = [p for p in ("tcp", "udp") if p not in present]
            if not missing:
                return
            pair = {"GroupId": group_id, "Description": "cloudprof: the sweep's own VMs"}
            try:
                ec2.authorize_security_group_ingress(
                    GroupId=group_id,
                    IpPermissions=[
                        {"IpProtocol": p, "FromPort": 0, "ToPort": 65535,
                         "UserIdGroupPairs": [pair]}
                        for p in missing
                    ],
                )
            except ClientError as err:
                if error_code(err)[0] != "InvalidPermission.Duplicate":
                    raise

    def _release_sweep_resources(self, region: str, sweep_id: str) -> None:
        """Delete the sweep's key pair and group once no instance of the sweep remains."""
        ec2 = self._client("ec2", region)
        with self._lock:
            if self._creating.get(sweep_id, 0) > 0:
                return
            with _translated(f"listing instances of sweep {sweep_id}"):
                sweep_filter = _tag_filters({LABEL_SWEEP: sweep_id})
                if next(_describe_instances(ec2, sweep_filter), None) is not None:
                    return
                groups = ec2.describe_security_groups(Filters=sweep_filter)["SecurityGroups"]
            for group in groups:
                _delete_security_group(ec2, group["GroupId"])
            _delete_key_pair(ec2, sweep_resource_name(sweep_id))

    # -- run_instances

    def _image(self, region: str, req: VmRequest) -> tuple[str, str]:
        """(AMI id, root device name) for the request's image in ``region``."""
        from botocore.exceptions import ClientError

        parameter = image_parameter(req.image, req.machine)
        image_id = req.image or os.environ.get(IMAGE_ENV, "")
        with _translated(f"resolving the image for {req.machine} in {region}"):
            if parameter is not None:
                try:
                    image_id = self._client("ssm", region).get_parameter(Name=parameter)[
                        "Parameter"
                    ]["Value"]
                except ClientError as err:
                    if error_code(err)[0] == "ParameterNotFound":
                        raise ProviderError(
                            f"image parameter {parameter} does not exist in SSM in {region}"
                        ) from err
                    raise
            images = self._client("ec2", region).describe_images(ImageIds=[image_id])["Images"]
        # Ubuntu and Debian boot from /dev/sda1 or /dev/xvda: ask the image.
        root_device = images[0].get("RootDeviceName", "/dev/sda1") if images else "/dev/sda1"
        return image_id, root_device

    def _run_params(
        self,
        req: VmRequest,
        tags: dict[str, str],
        zone: str | None,
        image_id: str,
        root_device: str,
        key_name: str,
        group_id: str,
    ) -> dict[str, Any]:
        instance_tags = _tag_list({**tags, "Name": req.name})
        tagged = ["instance", "volume"] + (["spot-instances-request"] if req.spot else [])
        params: dict[str, Any] = {
            "ImageId": image_id,
            "InstanceType": req.machine,
            "MinCount": 1,
            "MaxCount": 1,
            "KeyName": key_name,
            "SecurityGroupIds": [group_id],
            "UserData": req.startup_script or "",
            # The startup script's self-shutdown deletes the VM, not just stops it.
            "InstanceInitiatedShutdownBehavior": "terminate",
            "BlockDeviceMappings": [
                {
                    "DeviceName": root_device,
                    "Ebs": {
                        "VolumeSize": int(req.disk_gb),
                        "VolumeType": "gp3",
                        "DeleteOnTermination": True,
                    },
                }
            ],
            "TagSpecifications": [{"ResourceType": t, "Tags": instance_tags} for t in tagged],
            # IMDSv2 only: nothing on the VM can be tricked into leaking metadata.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if zone:
            params["Placement"] = {"AvailabilityZone": zone}
        if req.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        return params

    def _run_instance(
        self, ec2: Any, params: dict[str, Any], req: VmRequest, zone: str | None, region: str
    ) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return ec2.run_instances(**params)["Instances"][0]
        except (BotoCoreError, ClientError) as err:
            capacity = error_code(err)[0] in CAPACITY_CODES
            next_zones = self._other_zones(ec2, req.machine, zone) if capacity else ()
            action = f"creating {req.machine} in {zone or region}"
            raise translate_error(err, action, zone=zone, next_zones=next_zones) from err

    def _other_zones(self, ec2: Any, machine: str, tried: str | None) -> tuple[str, ...]:
        """Zones of the region offering ``machine``, except ``tried`` (best effort)."""
        try:
            offers = ec2.describe_instance_type_offerings(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [machine]}],
            )["InstanceTypeOfferings"]
        except Exception:  # only a hint for the retry; the capacity error is what matters
            return ()
        return tuple(sorted({o["Location"] for o in offers} - {tried}))

    def _not_running(self, ec2: Any, inst: Instance, timeout: float) -> CloudprofError:
        """Why an instance did not reach "running" (capacity, spot, or a timeout)."""
        try:
            described = _describe_one(ec2, inst.id)
        except Exception as err:
            return translate_error(err, f"waiting for {inst.id}")
        state = described["State"]["Name"]
        reason = described.get("StateReason") or {}
        code, message = str(reason.get("Code", "")), str(reason.get("Message", ""))
        line = f"{inst.id} ({inst.machine}) is {state}"
        if code.endswith("InsufficientInstanceCapacity"):
            zone = described.get("Placement", {}).get("AvailabilityZone")
            return CapacityError(
                f"{line}: {code}", zone=zone, next_zones=self._other_zones(ec2, inst.machine, zone)
            )
        if state in ("pending",):
            return ProviderError(f"{line} after {timeout:.0f} s")
        return ProviderError(f"{line}: {code or 'no reason given'} {message}".strip())


def _is_running(ec2: Any, instance_id: str) -> bool:
    try:
        return bool(_describe_one(ec2, instance_id)["State"]["Name"] == "running")
    except Exception:  # the caller reports why it is not
        return False


def _region_of(zone: str | None) -> str | None:
    """us-east-1 from us-east-1b (and from local zones like us-west-2-lax-1a)."""
    if not zone:
        return None
    match = re.match(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d+)", zone)
    return match.group(1) if match else None


def _shared_tags(resource_type: str, tags: dict[str, str], name: str) -> list[dict[str, Any]]:
    """TagSpecifications of per-sweep resources: cloudprof's labels only, no machine ones."""
    keys = (LABEL_SWEEP, LABEL_CREATOR, LABEL_CREATED, LABEL_EXPIRES)
    shared = {**{k: tags[k] for k in keys if k in tags}, "Name": name}
    return [{"ResourceType": resource_type, "Tags": _tag_list(shared)}]


def _to_instance(described: dict[str, Any], region: str) -> Instance:
    tags = _tag_dict(described.get("Tags"))
    public_ip = described.get("PublicIpAddress")
    return Instance(
        provider="aws",
        id=described["InstanceId"],
        name=tags.get("Name", described["InstanceId"]),
        machine=described.get("InstanceType", ""),
        zone=(described.get("Placement") or {}).get("AvailabilityZone") or None,
        state=described["State"]["Name"],
        address=public_ip,  # orchestrator.providers.remote applies CLOUDPROF_SSH_ENDPOINT
        port=22,
        private_address=described.get("PrivateIpAddress") or None,
        labels=tags,
        facts={
            "public_ip": public_ip,
            "region": region,
            "spot": described.get("InstanceLifecycle") == "spot",
        },
    )


# ---------------------------------------------------------------- bucket

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_MD5_META = "cloudprof-md5"  # S3 metadata key: content md5 of multipart uploads
SIGV4_MAX_EXPIRY_S = 7 * 24 * 3600  # S3 refuses SigV4 URLs valid for longer
_OPEN = "open the bucket"  # the first call: a 404 here means no bucket


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
            self._session = _session()
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
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as err:
            raise self._bucket_error(err, action) from err
        except Boto3Error as err:  # upload_file's S3UploadFailedError wraps the S3 error
            cause = err.__cause__ or err.__context__
            if isinstance(cause, (BotoCoreError, ClientError)):
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
        from botocore.exceptions import ClientError

        # SigV4 everywhere: presigned URLs then sign only the host, so a VM's
        # plain HTTP PUT works whatever Content-Type it sends.
        config = retry_config(signature_version="s3v4")
        region = resolve_region(None)
        client = self.session.client("s3", region_name=region, config=config)
        with self._calls(_OPEN):
            try:
                head = client.head_bucket(Bucket=self.name)
                headers = head["ResponseMetadata"].get("HTTPHeaders", {})
            except ClientError as err:
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
        from botocore.exceptions import ClientError

        client = self.client
        with self._calls(f"read {key}"):
            try:
                return client.get_object(Bucket=self.name, Key=self._full(key))["Body"].read()
            except ClientError as err:
                if error_code(err)[0] in ("NoSuchKey", "404"):
                    return None
                raise
