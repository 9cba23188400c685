"""AWS: EC2 machines (``AwsProvider``) through boto3; S3 buckets are ``aws_storage``.

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
a few hours (``aws_storage.S3Bucket``). boto3 is read through ``orchestrator.sdk`` so
the CLI starts without it; every SDK error is translated to a one-line
``CloudprofError`` (``sdk.aws.translate_error``) that the engine can act on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator import sdk, settings
from orchestrator.catalog.images import aws_image_parameter
from orchestrator.errors import (
    CapacityError,
    CloudprofError,
    CredentialsError,
    PermissionDeniedError,
    ProviderError,
)
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_CREATOR,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    Executor,
    Instance,
    Provider,
    ProviderOptions,
    Resource,
    VmRequest,
    creator_label,
)
from orchestrator.sdk import aws as sdk_aws
from orchestrator.sdk.aws import (
    CAPACITY_CODES,
    error_code,
    is_not_found,
    new_session,
    resolve_region,
    retry_config,
    translate_error,
    translated,
)

if TYPE_CHECKING:
    import boto3

_T = TypeVar("_T")

DEFAULT_TTL_S = 6 * 3600  # expiry tag when the engine gives none
USER_DATA_LIMIT = 16 * 1024  # EC2 refuses larger user data

# Every state but "terminated": what still costs money or may come back.
LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]

CLUSTER_RULE = "security-group-rule"  # AwsResource.kind of a group's inter-node rule


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
    clients = {where: (session or new_session(where)).client("ec2", region_name=where)
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
    with translated(f"listing cloudprof resources in {region}"):
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
        ec2 = (session or new_session(region)).client("ec2", region_name=region)
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
    with translated(f"revoking inter-node rule {res.id} of {res.group_id}"):
        try:
            ec2.revoke_security_group_ingress(GroupId=res.group_id, SecurityGroupRuleIds=[res.id])
        except sdk.botocore_exceptions.ClientError as err:
            if not (is_not_found(err) or error_code(err)[0] == "InvalidPermission.NotFound"):
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
    with translated(f"terminating {', '.join(instance_ids)}"):
        gone: list[str] = []
        for iid in instance_ids:
            try:
                ec2.terminate_instances(InstanceIds=[iid])
                gone.append(iid)
            except sdk.botocore_exceptions.ClientError as err:
                if not is_not_found(err):
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
    deadline = time.monotonic() + wait_s
    delay = 1.0
    with translated(f"deleting security group {group_id}"):
        try:
            own = [r["SecurityGroupRuleId"] for r in _cluster_rules(ec2, [group_id])]
            if own:
                ec2.revoke_security_group_ingress(GroupId=group_id, SecurityGroupRuleIds=own)
        except sdk.botocore_exceptions.ClientError as err:
            if not (is_not_found(err) or error_code(err)[0] == "InvalidPermission.NotFound"):
                raise
        while True:
            try:
                ec2.delete_security_group(GroupId=group_id)
                return
            except sdk.botocore_exceptions.ClientError as err:
                code, _ = error_code(err)
                if is_not_found(err):
                    return
                if code != "DependencyViolation" or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 15)


def _delete_key_pair(ec2: Any, key_name: str) -> None:
    with translated(f"deleting key pair {key_name}"):
        try:
            ec2.delete_key_pair(KeyName=key_name)
        except sdk.botocore_exceptions.ClientError as err:
            if not is_not_found(err):
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
            self._session = new_session(self.region)
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
        sdk_aws.check_credentials(self.session)

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
        region = self._region_for(inst.zone)
        ec2 = self._client("ec2", region)
        with translated(f"waiting for {inst.name or inst.id}", zone=inst.zone):
            try:
                _wait(ec2, "instance_running", [inst.id], timeout)
            except sdk.botocore_exceptions.WaiterError as err:
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
            with translated(f"listing instances in {region}"):
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
        key_name = sweep_resource_name(tags[LABEL_SWEEP])
        if not req.ssh_public_key.strip():
            raise ProviderError("no SSH public key for the sweep (the engine makes one per sweep)")
        with translated(f"importing key pair {key_name}"):
            try:
                ec2.import_key_pair(
                    KeyName=key_name,
                    PublicKeyMaterial=req.ssh_public_key.strip().encode(),
                    TagSpecifications=_shared_tags("key-pair", tags, key_name),
                )
            except sdk.botocore_exceptions.ClientError as err:
                # Same sweep (resume, or a second machine): the same key was imported.
                if error_code(err)[0] != "InvalidKeyPair.Duplicate":
                    raise
        return key_name

    def _ensure_security_group(self, ec2: Any, tags: dict[str, str], region: str) -> str:
        sweep = tags[LABEL_SWEEP]
        name = sweep_resource_name(sweep)
        from orchestrator.providers.remote import caller_cidr

        cidr = caller_cidr()
        with translated(f"creating security group {name}"):
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
            except sdk.botocore_exceptions.ClientError as err:
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
            except sdk.botocore_exceptions.ClientError as err:
                if error_code(err)[0] != "InvalidPermission.Duplicate":
                    raise
        return group_id

    def _ensure_cluster_rule(self, ec2: Any, group_id: str) -> None:
        """Let the group's members reach each other on every TCP and UDP port (Ray's ports
        are many and partly random), and nobody else: the rule names the group itself.

        Checked before it is added (moto, unlike EC2, accepts a duplicate); called
        under the provider's lock, so parallel creates add it once.
        """
        with translated(f"opening the inter-node ports of {group_id}"):
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
            except sdk.botocore_exceptions.ClientError as err:
                if error_code(err)[0] != "InvalidPermission.Duplicate":
                    raise

    def _release_sweep_resources(self, region: str, sweep_id: str) -> None:
        """Delete the sweep's key pair and group once no instance of the sweep remains."""
        ec2 = self._client("ec2", region)
        with self._lock:
            if self._creating.get(sweep_id, 0) > 0:
                return
            with translated(f"listing instances of sweep {sweep_id}"):
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
        parameter = aws_image_parameter(req.image, req.machine)
        image_id = req.image or settings.AWS_IMAGE.get() or ""
        with translated(f"resolving the image for {req.machine} in {region}"):
            if parameter is not None:
                try:
                    image_id = self._client("ssm", region).get_parameter(Name=parameter)[
                        "Parameter"
                    ]["Value"]
                except sdk.botocore_exceptions.ClientError as err:
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
        try:
            return ec2.run_instances(**params)["Instances"][0]
        except (sdk.botocore_exceptions.BotoCoreError,
                sdk.botocore_exceptions.ClientError) as err:
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
