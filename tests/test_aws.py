"""AWS provider and S3 bucket against moto in server mode (real boto3, real HTTP).

No SDK is patched: boto3 reaches the moto server through AWS_ENDPOINT_URL
(fixture ``moto_env``), and error paths use moto's own behaviour (instance type
validation, IAM enforcement, missing SSM parameters) or botocore's own
``ClientError`` type built with the codes AWS sends.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.catalog.images import aws_image_parameter as image_parameter
from orchestrator.errors import (
    BucketError,
    CapacityError,
    CloudprofError,
    CredentialsError,
    PermissionDeniedError,
    ProviderError,
    QuotaError,
)
from orchestrator.plan.planner import slug
from orchestrator.providers import get_provider, open_bucket
from orchestrator.providers.aws import (
    AwsProvider,
    delete_resources,
    list_resources,
    resource_tags,
    sweep_resource_name,
)
from orchestrator.providers.aws_storage import S3Bucket
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_CREATOR,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    ProviderOptions,
    VmRequest,
)
from orchestrator.providers.remote import SshKeys, startup_script
from orchestrator.sdk.aws import translate_error
from tests.fixtures.moto_server import FAKE_ACCESS_KEY, FAKE_SECRET_KEY
from tests.test_sweep_local import assert_inputs_labelled

REPO = Path(__file__).resolve().parent.parent
POLICY = REPO / "infra" / "iam" / "aws-policy.json"
SOURCE_CIDR = "203.0.113.7/32"  # set by moto_env


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SshKeys:
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    return SshKeys.for_sweep(tmp_path / "sweep-run")


def make_request(keys: SshKeys, sweep: str = "s-test1", **overrides: object) -> VmRequest:
    expires = int(time.time()) + 3600
    fields: dict = {
        "sweep_id": sweep,
        "name": f"cp-{sweep}-c6i-large",
        "machine": "c6i.large",
        "region": None,
        "zone": None,
        "spot": False,
        "labels": {
            LABEL_SWEEP: sweep,
            LABEL_CREATOR: "tester",
            LABEL_CREATED: str(int(time.time())),
            LABEL_EXPIRES: str(expires),
            "cloudprof-machine": "c6i-large",
        },
        "ssh_user": "ubuntu",
        "ssh_public_key": keys.user_public,
        "startup_script": startup_script(keys, "ubuntu", expires),
        "image": "al2023",  # moto serves Amazon Linux's public SSM parameters, not Ubuntu's
        "disk_gb": 30,
    }
    fields.update(overrides)
    return VmRequest(**fields)


def provider(**options: object) -> AwsProvider:
    prov = get_provider("aws", ProviderOptions(**options))
    assert isinstance(prov, AwsProvider)
    prov.poll_s = 1
    return prov


def ec2():
    import boto3

    return boto3.client("ec2")


def live_instances(sweep: str) -> list[dict]:
    pages = ec2().describe_instances(
        Filters=[
            {"Name": f"tag:{LABEL_SWEEP}", "Values": [sweep]},
            {
                "Name": "instance-state-name",
                "Values": ["pending", "running", "stopping", "stopped"],
            },
        ]
    )
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def sweep_groups(sweep: str) -> list[dict]:
    return ec2().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [sweep_resource_name(sweep)]}]
    )["SecurityGroups"]


def sweep_keys(sweep: str) -> list[dict]:
    return ec2().describe_key_pairs(
        Filters=[{"Name": "key-name", "Values": [sweep_resource_name(sweep)]}]
    )["KeyPairs"]


def assert_one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text and "Traceback" not in text
    return text


# ---------------------------------------------------------------- provider


def test_create_wait_list_delete_leaves_nothing(moto_env, keys: SshKeys) -> None:
    prov = provider(region="us-east-1")
    req = make_request(keys)
    created = prov.create(req)
    assert created.id.startswith("i-") and created.provider == "aws"

    ready = prov.wait_ready(created, timeout=30)
    assert ready.state == "running"
    assert ready.address and ready.address == ready.facts["public_ip"]
    assert ready.user == "ubuntu"

    listed = prov.list({LABEL_SWEEP: req.sweep_id})
    assert [i.id for i in listed] == [created.id]
    assert prov.list({LABEL_SWEEP: "some-other-sweep"}) == []
    assert len(sweep_groups(req.sweep_id)) == 1 and len(sweep_keys(req.sweep_id)) == 1

    prov.delete(ready)
    assert live_instances(req.sweep_id) == []
    assert prov.list({LABEL_SWEEP: req.sweep_id}) == []
    assert sweep_groups(req.sweep_id) == []
    assert sweep_keys(req.sweep_id) == []
    prov.delete(ready)  # idempotent: absent is fine


def test_instance_gets_tags_key_group_user_data_and_shutdown_terminate(
    moto_env, keys: SshKeys
) -> None:
    prov = provider()
    req = make_request(keys, zone="us-east-1b")
    inst = prov.create(req)
    client = ec2()
    described = client.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]

    tags = {t["Key"]: t["Value"] for t in described["Tags"]}
    for key in (LABEL_SWEEP, LABEL_CREATOR, LABEL_CREATED, LABEL_EXPIRES):
        assert tags[key] == req.labels[key]
    assert tags["Name"] == req.name
    assert described["InstanceType"] == "c6i.large"
    assert described["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert described["KeyName"] == sweep_resource_name(req.sweep_id)
    assert described.get("InstanceLifecycle") != "spot"

    # The security group admits TCP 22 from the caller only, and nothing else.
    (group_ref,) = described["SecurityGroups"]
    group = client.describe_security_groups(GroupIds=[group_ref["GroupId"]])["SecurityGroups"][0]
    assert group["GroupName"] == sweep_resource_name(req.sweep_id)
    (rule,) = group["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 22, 22)
    assert [r["CidrIp"] for r in rule["IpRanges"]] == [SOURCE_CIDR]
    assert rule.get("Ipv6Ranges", []) == []
    group_tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert group_tags[LABEL_SWEEP] == req.sweep_id
    assert group_tags[LABEL_EXPIRES] == req.labels[LABEL_EXPIRES]

    pair = sweep_keys(req.sweep_id)[0]
    assert {t["Key"]: t["Value"] for t in pair["Tags"]}[LABEL_EXPIRES] == req.labels[LABEL_EXPIRES]

    user_data = client.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")
    assert base64.b64decode(user_data["UserData"]["Value"]).decode() == req.startup_script
    shutdown = client.describe_instance_attribute(
        InstanceId=inst.id, Attribute="instanceInitiatedShutdownBehavior"
    )
    assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"

    # The root volume is tagged too and dies with the instance.
    (mapping,) = described["BlockDeviceMappings"]
    assert mapping["Ebs"]["DeleteOnTermination"] is True
    volume = client.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"][0]
    assert volume["Size"] == 30
    assert {t["Key"]: t["Value"] for t in volume["Tags"]}[LABEL_SWEEP] == req.sweep_id

    prov.delete(inst)
    assert client.describe_volumes()["Volumes"] == []


def test_spot_request_and_shared_resources_live_until_the_last_instance(
    moto_env, keys: SshKeys
) -> None:
    prov = provider()
    first = prov.create(make_request(keys, spot=True))
    second = prov.create(make_request(keys, name="cp-s-test1-m6i-large", machine="m6i.large"))
    described = ec2().describe_instances(InstanceIds=[first.id])["Reservations"][0]["Instances"][0]
    assert described["InstanceLifecycle"] == "spot"
    assert len(sweep_groups("s-test1")) == 1  # one group and one key for the whole sweep

    prov.delete(first)
    assert [i["InstanceId"] for i in live_instances("s-test1")] == [second.id]
    assert len(sweep_groups("s-test1")) == 1 and len(sweep_keys("s-test1")) == 1

    prov.delete(second)
    assert sweep_groups("s-test1") == [] and sweep_keys("s-test1") == []


def test_machines_go_to_the_requested_region_and_are_listed_there(moto_env, keys: SshKeys) -> None:
    prov = provider()  # provider region us-east-1 (AWS_DEFAULT_REGION)
    inst = prov.create(make_request(keys, region="us-west-2", zone=None))
    ready = prov.wait_ready(inst, timeout=30)
    assert ready.zone and ready.zone.startswith("us-west-2")
    assert [i.id for i in prov.list({LABEL_SWEEP: "s-test1"})] == [inst.id]
    assert sweep_groups("s-test1") == []  # none in us-east-1: the group is in us-west-2
    # A new process (resume, cleanup) finds it too: the catalog's regions are searched.
    assert [i.id for i in provider().list({LABEL_SWEEP: "s-test1"})] == [inst.id]
    assert {r.region for r in list_resources({LABEL_SWEEP: "s-test1"})} == {"us-west-2"}
    prov.delete(ready)
    assert prov.list({LABEL_SWEEP: "s-test1"}) == []
    assert list_resources({LABEL_SWEEP: "s-test1"}, region="us-west-2") == []


def test_regions_are_listed_at_once_and_found_in_their_order(moto_env, keys: SshKeys) -> None:
    """Each region is a few round trips to a distant endpoint: cleanup, resume and teardown
    search the catalog's regions at once. botocore's own event hook holds each region's
    first call until another region's is in flight (one by one, each would wait 10 s)."""
    import threading

    import boto3

    west = provider().create(make_request(keys, sweep="s-west", region="us-west-2", zone=None))
    east = provider().create(make_request(keys, sweep="s-east"))
    session = boto3.session.Session()
    lock, together = threading.Lock(), threading.Event()
    in_flight = [0, 0]  # now, most

    def hold(**_: object) -> None:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            if in_flight[0] >= 2:
                together.set()
        together.wait(10)
        with lock:
            in_flight[0] -= 1

    session.events.register("before-send.ec2.DescribeInstances", hold)
    found = list_resources(session=session)

    assert in_flight[1] >= 2
    assert [(r.region, r.id) for r in found if r.kind == "instance"] == [
        ("us-east-1", east.id), ("us-west-2", west.id)]  # the shell's region, then the catalog's


def test_unknown_instance_type_is_one_line_and_leaves_nothing(moto_env, keys: SshKeys) -> None:
    prov = provider()
    with pytest.raises(ProviderError) as info:
        prov.create(make_request(keys, machine="c6i.enormous"))
    text = assert_one_line(info.value)
    assert "unknown instance type" in text and "c6i.enormous" in text
    assert not isinstance(info.value, CapacityError | QuotaError)
    assert live_instances("s-test1") == []
    assert sweep_groups("s-test1") == [] and sweep_keys("s-test1") == []


def test_missing_image_parameter_is_one_line(moto_env, keys: SshKeys) -> None:
    # moto has no Canonical parameters: the same answer AWS gives for a wrong path.
    with pytest.raises(ProviderError) as info:
        provider().create(make_request(keys, image="ubuntu-24.04"))
    text = assert_one_line(info.value)
    assert "/aws/service/canonical/ubuntu/server/24.04" in text and "does not exist" in text
    assert sweep_groups("s-test1") == [] and sweep_keys("s-test1") == []


def test_every_resource_gets_the_four_tags_even_without_engine_labels() -> None:
    req = VmRequest("s-bare", "cp-s-bare-x", "c6i.large", None, None, False, {}, "u", "k", "")
    tags = resource_tags(req)
    assert tags[LABEL_SWEEP] == "s-bare" and tags[LABEL_CREATOR]
    assert int(tags[LABEL_EXPIRES]) > int(tags[LABEL_CREATED]) >= int(time.time()) - 5


def test_image_choice_follows_architecture_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUDPROF_AWS_IMAGE", raising=False)
    assert image_parameter(None, "c6i.large") == "/aws/service/debian/release/12/latest/amd64"
    assert image_parameter(None, "c7g.large") == "/aws/service/debian/release/12/latest/arm64"
    # every Graviton family of the catalog (its arch column), the newest included
    assert image_parameter(None, "c8g.4xlarge").endswith("/arm64")
    assert image_parameter(None, "r7g.large").endswith("/arm64")
    assert image_parameter(None, "m7a.large").endswith("/amd64")
    assert "/arm64/" in image_parameter("ubuntu-24.04", "t4g.small")
    assert image_parameter("al2023", "m7gd.xlarge").endswith("arm64")
    assert image_parameter("ami-0123456789abcdef0", "c6i.large") is None
    monkeypatch.setenv("CLOUDPROF_AWS_IMAGE", "ubuntu-22.04")
    assert "/22.04/stable/current/amd64/" in image_parameter(None, "c6i.large")
    with pytest.raises(CloudprofError) as info:
        image_parameter("windows-95", "c6i.large")
    assert "windows-95" in assert_one_line(info.value)


def test_bad_source_cidr_is_refused(moto_env, keys: SshKeys, monkeypatch) -> None:
    monkeypatch.setenv("CLOUDPROF_SSH_SOURCE_CIDR", "0.0.0.0/0")
    with pytest.raises(CloudprofError) as info:
        provider().create(make_request(keys))
    assert "whole internet" in assert_one_line(info.value)
    assert live_instances("s-test1") == [] and sweep_keys("s-test1") == []


def test_list_resources_and_delete_resources_for_cleanup(moto_env, keys: SshKeys) -> None:
    prov = provider()
    inst = prov.create(make_request(keys, sweep="s-old"))
    prov.create(make_request(keys, sweep="s-keep"))

    found = list_resources({LABEL_SWEEP: "s-old"})
    kinds = sorted(r.kind for r in found)
    assert kinds == ["instance", "key-pair", "security-group"]
    assert all(r.sweep_id == "s-old" and r.expires_at and r.expires_at > time.time() for r in found)
    found_inst = next(r for r in found if r.kind == "instance")
    assert found_inst.id == inst.id and found_inst.zone and found_inst.region == "us-east-1"
    assert len(list_resources()) == 6  # no labels: everything carrying a sweep tag

    delete_resources(found)
    assert list_resources({LABEL_SWEEP: "s-old"}) == []
    assert len(list_resources({LABEL_SWEEP: "s-keep"})) == 3


def test_sessions_share_the_service_models_but_read_credentials_and_region_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cleanup and resume make a session per region: each parsed EC2's model again (~0.5 s)."""
    from orchestrator.sdk.aws import new_session as _session

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    east = _session("us-east-1")
    assert east.get_credentials().access_key == "first-key"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second-key")
    west = _session("eu-west-1")

    loader = east._session.get_component("data_loader")
    assert west._session.get_component("data_loader") is loader
    assert west.get_credentials().access_key == "second-key"
    assert west.client("ec2").meta.region_name == "eu-west-1"
    paths = list(loader.search_paths)
    _session()
    assert loader.search_paths == paths and len(set(paths)) == len(paths)  # no growth


# ---------------------------------------------------------------- credentials and permissions


def test_no_credentials_is_one_line_with_setup_help(
    moto_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in list(os.environ):
        if key.startswith("AWS_") and key != "AWS_ENDPOINT_URL":
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role on this box
    with pytest.raises(CredentialsError) as info:
        provider().check_credentials()
    text = assert_one_line(info.value)
    assert "aws configure" in text and "--dry-run" in text and "sso" in text.lower()
    assert info.value.exit_code == 5


def iam_user(policy: dict | None) -> tuple[str, str]:
    """A moto IAM user with ``policy`` attached; its access key pair."""
    import boto3

    iam = boto3.client("iam")
    iam.create_user(UserName="cp-user")
    if policy is not None:
        iam.put_user_policy(
            UserName="cp-user", PolicyName="cloudprof", PolicyDocument=json.dumps(policy)
        )
    key = iam.create_access_key(UserName="cp-user")["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def test_unknown_keys_and_missing_permissions_are_one_line(
    moto_env, keys: SshKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket="cp-perm-bucket")
    key_id, secret = iam_user(policy=None)
    moto_env.enforce_iam(True)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    with pytest.raises(CredentialsError) as info:
        provider().create(make_request(keys))
    assert "InvalidClientTokenId" in assert_one_line(info.value) or "AuthFailure" in str(info.value)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(PermissionDeniedError) as denied:
        provider().create(make_request(keys))
    text = assert_one_line(denied.value)
    # AWS says UnauthorizedOperation for EC2, moto says AccessDenied: both are this class.
    assert "ec2:ImportKeyPair" in text and "aws-policy.json" in text

    with pytest.raises(BucketError) as bucket_denied:
        S3Bucket("s3://cp-perm-bucket").list("")
    assert "no permission" in assert_one_line(bucket_denied.value) and "403" in str(
        bucket_denied.value
    )


# ---------------------------------------------------------------- error translation


def client_error(code: str, message: str, operation: str = "RunInstances"):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("InsufficientInstanceCapacity", CapacityError),
        ("Unsupported", CapacityError),
        ("InstanceLimitExceeded", QuotaError),
        ("VcpuLimitExceeded", QuotaError),
        ("MaxSpotInstanceCountExceeded", QuotaError),
        ("UnauthorizedOperation", PermissionDeniedError),
        ("AccessDenied", PermissionDeniedError),
        ("AuthFailure", CredentialsError),
        ("InvalidAMIID.NotFound", ProviderError),
    ],
)
def test_translate_error_classes(code: str, cls: type) -> None:
    err = translate_error(
        client_error(code, "We currently do not have\nsufficient capacity."), "creating c6i.large"
    )
    assert type(err) is cls
    text = assert_one_line(err)
    assert code in text and text.startswith("creating c6i.large")


def test_capacity_error_names_the_zones_to_try_next(moto_env) -> None:
    prov = provider()
    zones = prov._other_zones(ec2(), "c6i.large", "us-east-1a")
    assert zones and "us-east-1a" not in zones and all(z.startswith("us-east-1") for z in zones)
    err = translate_error(
        client_error("InsufficientInstanceCapacity", "no capacity"),
        "creating c6i.large in us-east-1a",
        zone="us-east-1a",
        next_zones=zones,
    )
    assert isinstance(err, CapacityError)
    assert err.zone == "us-east-1a" and err.next_zones == zones
    assert zones[0] in str(err)


@pytest.mark.parametrize("attempts", [None, "2"])
def test_transient_describe_errors_while_booting_are_retried_not_fatal(
    ec2_faults, keys: SshKeys, monkeypatch: pytest.MonkeyPatch, attempts: str | None
) -> None:
    """Three 503s from DescribeInstances while the VM boots: botocore's standard retry
    policy (our default attempts) waits them out; with only two attempts a call (the
    fixture's) the waiter gives up, and a VM found running after all is still ready."""
    if attempts is None:
        monkeypatch.delenv("AWS_MAX_ATTEMPTS")
    else:
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", attempts)
    prov = provider()
    inst = prov.create(make_request(keys))
    before = len(ec2_faults.calls("DescribeInstances"))
    ec2_faults.inject("DescribeInstances", "Unavailable", 503, times=3)
    ready = prov.wait_ready(inst, timeout=120)
    assert ready.id == inst.id and ready.facts.get("public_ip")
    assert len(ec2_faults.calls("DescribeInstances")) - before >= 4  # 3 failed, then answered
    assert not ec2_faults.faults  # every injected error was met
    prov.delete(inst)
    assert live_instances("s-test1") == []


def test_an_s3_error_while_uploading_is_one_line(
    ec2_faults, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 through the fault front, every PUT failing: upload_file's S3UploadFailedError
    (once a long traceback) is one BucketError line naming the object, after retries."""
    import boto3

    boto3.client("s3").create_bucket(Bucket="cp-flaky")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", ec2_faults.endpoint)
    ec2_faults.inject("PUT", "InternalError", 500)
    src = tmp_path / "src"
    write_tree(src, {"a.parquet": b"alpha"})
    with pytest.raises(BucketError) as info:
        open_bucket("s3://cp-flaky").upload_dir(src, "s1/inputs")
    text = assert_one_line(info.value)
    assert "upload s1/inputs/a.parquet" in text and "s3://cp-flaky" in text, text
    assert len(ec2_faults.calls("PUT")) == 2  # the fixture's AWS_MAX_ATTEMPTS: retried once


def test_capacity_error_from_ec2_then_the_next_zone_works(ec2_faults, keys: SshKeys) -> None:
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", 500, zone="us-east-1a")
    prov = provider()
    with pytest.raises(CapacityError) as info:
        prov.create(make_request(keys, zone="us-east-1a"))
    err = info.value
    text = assert_one_line(err)
    assert "InsufficientInstanceCapacity" in text and "us-east-1a" in text
    assert err.zone == "us-east-1a" and err.next_zones and "us-east-1a" not in err.next_zones
    assert sweep_groups("s-test1") == [] and sweep_keys("s-test1") == []

    inst = prov.create(make_request(keys, zone=err.next_zones[0]))
    assert inst.zone == err.next_zones[0]
    prov.delete(inst)
    assert live_instances("s-test1") == []


@pytest.mark.parametrize(
    ("code", "status", "cls"),
    [
        ("VcpuLimitExceeded", 400, QuotaError),
        ("InstanceLimitExceeded", 400, QuotaError),
        ("UnauthorizedOperation", 403, PermissionDeniedError),
    ],
)
def test_quota_and_permission_errors_from_ec2(
    ec2_faults, keys: SshKeys, code: str, status: int, cls: type
) -> None:
    ec2_faults.inject("RunInstances", code, status)
    with pytest.raises(cls) as info:
        provider().create(make_request(keys))
    assert code in assert_one_line(info.value)
    assert len(ec2_faults.calls("RunInstances")) == 1  # not retried: it would not help
    assert sweep_groups("s-test1") == [] and sweep_keys("s-test1") == []


def test_unknown_type_from_aws_invalid_parameter_value() -> None:
    err = translate_error(
        client_error("InvalidParameterValue", "Invalid value 'c6i.huge' for InstanceType."),
        "creating c6i.huge",
    )
    assert type(err) is ProviderError and "unknown instance type" in str(err)


# ---------------------------------------------------------------- bucket


@pytest.mark.parametrize(
    "name",
    [
        "ab",
        "a" * 64,
        "My-Bucket",
        "bad_name",
        "bad name",
        "-start",
        "end-",
        "a..b",
        "192.168.1.2",
        "semi;colon",
        "xn--bucket",
    ],
)
def test_invalid_bucket_names_fail_before_any_call(name: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: no call made
    with pytest.raises(BucketError) as info:
        open_bucket(f"s3://{name}")
    assert "invalid bucket name" in assert_one_line(info.value)


def test_missing_bucket_says_how_to_create_it(moto_env) -> None:
    with pytest.raises(BucketError) as info:
        S3Bucket("s3://cp-no-such-bucket").list("inputs")
    assert assert_one_line(info.value) == (
        "bucket s3://cp-no-such-bucket does not exist "
        "(create it with: aws s3 mb s3://cp-no-such-bucket)"
    )


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_upload_skips_matching_hashes_download_list_delete(moto_env, tmp_path: Path) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket="cp-data")
    bucket = open_bucket("s3://cp-data/runs")
    assert isinstance(bucket, S3Bucket)
    big = os.urandom(9 * 1024 * 1024)  # above boto3's multipart threshold: ETag is not the md5
    files = {"a.parquet": b"alpha", "sub/b.parquet": b"beta" * 100, "big.bin": big}
    src = tmp_path / "src"
    write_tree(src, files)

    first = bucket.upload_dir(src, "s1/inputs")
    assert sorted(first) == ["s1/inputs/a.parquet", "s1/inputs/big.bin", "s1/inputs/sub/b.parquet"]
    listed = bucket.list("s1/inputs")
    assert listed == {f"s1/inputs/{k}": hashlib.md5(v).hexdigest() for k, v in files.items()}
    raw_keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="cp-data")["Contents"]]
    assert all(k.startswith("runs/s1/inputs/") for k in raw_keys)

    assert bucket.upload_dir(src, "s1/inputs") == []  # every hash matches: nothing uploaded
    (src / "a.parquet").write_bytes(b"changed")
    assert bucket.upload_dir(src, "s1/inputs") == ["s1/inputs/a.parquet"]
    assert bucket.list("s1/in") == {}  # a prefix is a directory, not a string prefix

    out = tmp_path / "out"
    got = bucket.download_dir("s1/inputs", out)
    assert sorted(p.relative_to(out).as_posix() for p in got) == sorted(files)
    assert (out / "sub" / "b.parquet").read_bytes() == files["sub/b.parquet"]
    assert (out / "big.bin").read_bytes() == big
    assert (out / "a.parquet").read_bytes() == b"changed"
    # Again: a file that already has the object's md5 is kept (same inode, not rewritten,
    # the multipart one by its metadata md5), one that differs is replaced whole.
    inodes = {name: (out / name).stat().st_ino for name in ("big.bin", "sub/b.parquet")}
    (out / "a.parquet").write_bytes(b"edited here")
    bucket.download_dir("s1/inputs", out)
    assert {name: (out / name).stat().st_ino for name in inodes} == inodes
    assert (out / "a.parquet").read_bytes() == b"changed"

    assert bucket.delete_prefix("s1/inputs") == 3
    assert bucket.list("") == {}


def test_presigned_urls_work_with_plain_http(moto_env) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket="cp-signed")
    bucket = S3Bucket("s3://cp-signed")
    put_url = bucket.signed_url("s1/results/summary.json", "PUT", expires_s=600)
    assert "X-Amz-Signature=" in put_url and "cp-signed" in put_url
    body = b'{"units": 42}'
    request = urllib.request.Request(
        put_url, data=body, method="PUT", headers={"Content-Type": "application/octet-stream"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
    assert bucket.list("s1/results") == {"s1/results/summary.json": hashlib.md5(body).hexdigest()}

    with urllib.request.urlopen(bucket.signed_url("s1/results/summary.json"), timeout=10) as resp:
        assert resp.read() == body
    with pytest.raises(BucketError):
        bucket.signed_url("x", "DELETE")


# ---------------------------------------------------------------- IAM policy


def _iam_action(service: str, operation: str) -> str:
    """The IAM action an API call needs (S3 names differ from its operations)."""
    s3 = {
        "HeadBucket": "ListBucket",
        "ListObjectsV2": "ListBucket",
        "HeadObject": "GetObject",
        "DeleteObjects": "DeleteObject",
        "CreateMultipartUpload": "PutObject",
        "UploadPart": "PutObject",
        "CompleteMultipartUpload": "PutObject",
    }
    return f"s3:{s3.get(operation, operation)}" if service == "s3" else f"{service}:{operation}"


def _policy_allows(policy: dict, action: str) -> bool:
    import fnmatch

    for statement in policy["Statement"]:
        actions = statement["Action"]
        actions = [actions] if isinstance(actions, str) else actions
        if statement["Effect"] == "Allow" and any(fnmatch.fnmatch(action, a) for a in actions):
            return True
    return False


def test_iam_policy_covers_every_call_cloudprof_makes(
    moto_env, keys: SshKeys, tmp_path: Path
) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket="cp-policy")
    calls: set[tuple[str, str]] = set()

    def record(model, **_: object) -> None:
        calls.add((model.service_model.signing_name, model.name))

    prov = provider()
    bucket = S3Bucket("s3://cp-policy")
    for session in (prov.session, bucket.session):
        session.events.register("before-call", record)
    prov.check_credentials()
    inst = prov.wait_ready(prov.create(make_request(keys, spot=True)), timeout=30)
    prov.list({LABEL_SWEEP: "s-test1"})
    prov.delete(inst)
    # a multi-node sweep's node: its group's inter-node rule is listed and revoked too
    leftover = prov.create(make_request(keys, sweep="s-crashed", cluster=True))
    delete_resources(
        list_resources({LABEL_SWEEP: "s-crashed"}, session=prov.session), session=prov.session
    )
    assert prov.list({LABEL_SWEEP: "s-crashed"}) == [] and leftover.id
    write_tree(tmp_path / "in", {"x.parquet": b"x"})
    bucket.upload_dir(tmp_path / "in", "p")
    bucket.download_dir("p", tmp_path / "out")
    bucket.signed_url("p/x.parquet")
    bucket.delete_prefix("p")

    policy = json.loads(POLICY.read_text())
    assert policy["Version"] == "2012-10-17"
    needed = {_iam_action(service, op) for service, op in calls if service != "sts"}
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "s3:PutObject"} <= needed
    missing = sorted(a for a in needed if not _policy_allows(policy, a))
    assert missing == []
    # Least privilege: no wildcard actions, nothing to pass roles or touch IAM users.
    granted = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert not any("*" in a for a in granted)
    assert not any(a.startswith("iam:") and a != "iam:CreateServiceLinkedRole" for a in granted)
    # Everything granted is used (or is implied by a call: tags at creation, spot's role).
    implied = {
        "ec2:CreateTags",  # tags given at creation (TagSpecifications)
        "iam:CreateServiceLinkedRole",  # the first spot request of an account
        "ec2:DescribeInstanceTypeOfferings",  # after a capacity error: zones to try next
        "s3:AbortMultipartUpload",  # boto3 cleans up a failed multipart upload
    }
    assert granted - needed - implied == set()


# ---------------------------------------------------------------- end to end


def _sweep_argv(bucket: str, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "orchestrator", "sweep", "--no-report", "--repeats", "1",
        "--provider", "aws",
        "--machine", "c6i.large", "--workers", "1,2", "--duration", "1",
        "--frames", "4", "--rows", "40", "--cols", "50", "--dim", "10",
        "--bucket", f"s3://{bucket}", "--out", str(out),
    ]  # fmt: skip


def _run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=280, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.fixture
def aws_vm_env(moto_env, sshd, monkeypatch: pytest.MonkeyPatch):
    """moto for the cloud, the loopback sshd for the "VM", Amazon Linux as the image."""
    from tests.fixtures.sshd import sshd_env

    for key, value in sshd_env(sshd).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLOUDPROF_AWS_IMAGE", "al2023")  # moto serves no Debian parameter
    return moto_env


@pytest.mark.slow
def test_sweep_end_to_end_after_a_capacity_error_leaves_no_instance(
    aws_vm_env, ec2_faults, tmp_path: Path
) -> None:
    """provision (no capacity in the first zone → the next zone, once) → stage →
    bootstrap → trials → collect → teardown, through the CLI."""
    import boto3
    import pandas as pd

    boto3.client("s3").create_bucket(Bucket="cp-e2e")
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", 500, zone="us-east-1a")
    out = tmp_path / "runs"
    proc = _run_cli(_sweep_argv("cp-e2e", out), tmp_path)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "InsufficientInstanceCapacity" in proc.stdout + proc.stderr
    zones = [c.get("Placement.AvailabilityZone") for c in ec2_faults.calls("RunInstances")]
    assert set(zones[:-1]) == {"us-east-1a"} and zones[-1] == "us-east-1b"

    (run_dir,) = [p for p in out.iterdir() if (p / "trials.parquet").exists()]
    sweep_id = json.loads((run_dir / "sweep.json").read_text())["sweep_id"]
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2]
    assert set(trials["status"]) == {"ok"} and set(trials["machine"]) == {"c6i.large"}
    assert (trials["units_per_s"] > 0).all()

    # The instance really went through EC2 (tagged with the sweep), and nothing is left.
    every = ec2().describe_instances(Filters=[{"Name": f"tag:{LABEL_SWEEP}", "Values": [sweep_id]}])
    described = [i for r in every["Reservations"] for i in r["Instances"]]
    assert len(described) == 1 and described[0]["InstanceType"] == "c6i.large"
    assert described[0]["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert described[0]["State"]["Name"] == "terminated"
    assert live_instances(sweep_id) == []
    assert sweep_groups(sweep_id) == [] and sweep_keys(sweep_id) == []
    assert list_resources({LABEL_SWEEP: sweep_id}) == []

    # Inputs were staged once in S3 and fetched by the "VM" through presigned URLs;
    # results went through the bucket too and their prefix was emptied after collection.
    keys = S3Bucket("s3://cp-e2e").list("")
    assert sum(k.startswith("inputs/") and k.endswith(".parquet") for k in keys) == 4, keys
    assert not any(k.startswith("results/") for k in keys), keys
    # The inputs prefix is labelled for `cloudprof cleanup`, in the marker's body and metadata.
    assert_inputs_labelled(S3Bucket("s3://cp-e2e"), run_dir)
    (marker,) = [k for k in keys if k.startswith(".cloudprof-labels/inputs/")]
    head = boto3.client("s3").head_object(Bucket="cp-e2e", Key=marker)
    assert head["Metadata"][LABEL_SWEEP] == slug(sweep_id), head["Metadata"]
    assert "not copied to the bucket" not in proc.stdout + proc.stderr
    # No credential of the user reaches the output or the results store.
    stored = "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file())
    for secret in (FAKE_ACCESS_KEY, FAKE_SECRET_KEY):
        assert secret not in proc.stdout + proc.stderr + stored


@pytest.mark.parametrize(
    ("code", "status"), [("VcpuLimitExceeded", 400), ("UnauthorizedOperation", 403)]
)
def test_sweep_with_quota_or_permission_error_is_one_line_and_leaves_nothing(
    ec2_faults, tmp_path: Path, code: str, status: int, monkeypatch, capsys
) -> None:
    import boto3

    from orchestrator import cli

    monkeypatch.setenv("CLOUDPROF_AWS_IMAGE", "al2023")
    boto3.client("s3").create_bucket(Bucket="cp-e2e-fail")
    ec2_faults.inject("RunInstances", code, status)
    exit_code = cli.main(_sweep_argv("cp-e2e-fail", tmp_path / "runs")[3:])  # in-process: faster
    out, err = capsys.readouterr()
    assert exit_code != 0 and "Traceback" not in out + err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and code in errors[0], err[-2000:]
    assert len(ec2_faults.calls("RunInstances")) == 1  # no retry, no other zone
    assert list_resources() == []  # no instance, key pair or security group left


def test_sweep_with_an_illegal_bucket_name_is_one_line_and_creates_nothing(
    moto_env, tmp_path: Path, capsys
) -> None:
    from orchestrator import cli

    exit_code = cli.main(_sweep_argv("Bad_Bucket;rm", tmp_path / "runs")[3:])
    out, err = capsys.readouterr()
    assert exit_code != 0 and "Traceback" not in out + err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "invalid bucket name" in errors[0], err[-2000:]
    assert list_resources() == []


# SIGHUP and SIGQUIT on a cloud; SIGINT and SIGTERM reach an aws sweep at each phase in
# test_faults.py (and a barrage of both in test_faults_never_silent.py).
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name)
def test_signal_mid_sweep_terminates_the_instance_and_deletes_key_and_group(
    aws_vm_env, tmp_path: Path, sig: signal.Signals
) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket="cp-e2e-signal")
    proc = subprocess.Popen(
        _sweep_argv("cp-e2e-signal", tmp_path / "runs"), cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any(r.kind == "instance" for r in list_resources()):
                break
            time.sleep(0.1)
        assert any(r.kind == "instance" for r in list_resources()), "no instance was created"
        proc.send_signal(sig)  # lands while waiting, connecting, bootstrapping or in a trial
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert list_resources() == [], stdout[-2000:]  # instance, key pair and group all gone
    (sweep_json,) = (tmp_path / "runs").glob("*/sweep.json")
    assert json.loads(sweep_json.read_text())["status"] == "interrupted"
