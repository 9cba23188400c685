"""The inter-node rule of a multi-node sweep (``VmRequest.cluster``), on both clouds.

Provisioning goes through the real providers: EC2 through boto3 against moto's
server, Compute Engine through google-cloud-compute's REST transport against
``tests/fixtures/fake_gce.py``. Nodes are created in parallel, as the engine
does; the rule must be made once, admit the sweep's own VMs only, and go with
the sweep's last VM: on delete, when a create fails, and through
``cloudprof cleanup`` when a sweep died without its ``finally``.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.errors import CapacityError, PermissionDeniedError, ProviderError
from orchestrator.providers import aws, gcp
from orchestrator.providers.base import LABEL_CREATED, LABEL_EXPIRES, LABEL_SWEEP, Instance
from orchestrator.providers.gcp import cluster_firewall_name, firewall_name, sweep_tag
from orchestrator.providers.remote import SshKeys
from tests.fixtures.fake_gce import PERMISSION, STOCKOUT, FakeGce
from tests.test_aws import ec2, live_instances, make_request, sweep_groups, sweep_keys
from tests.test_aws import provider as aws_provider
from tests.test_gcp import ZONE
from tests.test_gcp import _provider as gcp_provider
from tests.test_gcp import _request as gcp_request

NODES = 3
HOUR = 3600


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SshKeys:
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    return SshKeys.for_sweep(tmp_path / "sweep-keys")


def _in_parallel(create, requests: list) -> list[Instance]:
    """Create every request at once, as the engine creates a sweep's nodes."""
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(create, requests))


def _expired(labels: dict[str, str]) -> dict[str, str]:
    """``labels`` of a sweep that died three hours ago and expired an hour ago."""
    now = time.time()
    return {**labels, LABEL_CREATED: str(int(now - 3 * HOUR)),
            LABEL_EXPIRES: str(int(now - HOUR))}


def _cleanup(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["cleanup", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out + err


# ------------------------------------------------------------------ gcp


def _gcp_nodes(sweep: str, n: int = NODES, **changes: object) -> list:
    base = gcp_request(sweep)
    return [dataclasses.replace(base, name=f"{base.name}-node{i}", cluster=True, **changes)
            for i in range(n)]


def _gcp_rules(fake: FakeGce) -> dict[str, dict]:
    return {name: rule for (_, name), rule in fake.firewalls.items()}


def test_gcp_nodes_made_in_parallel_share_one_rule_that_admits_only_the_sweeps_vms(
    fake_gce: FakeGce,
) -> None:
    provider = gcp_provider("s1")
    made = _in_parallel(provider.create, _gcp_nodes("s1"))
    other = gcp_provider("s2").create(gcp_request("s2"))  # another sweep, single-node

    inserts = [r.body for r in fake_gce.sent("POST", r"/global/firewalls$")
               if r.body["name"] == cluster_firewall_name("s1")]
    assert len(inserts) == NODES  # every node asked; GCE's 409 made it once
    rules = _gcp_rules(fake_gce)
    assert set(rules) == {firewall_name("s1"), cluster_firewall_name("s1"), firewall_name("s2")}
    rule = rules[cluster_firewall_name("s1")]
    # Every TCP and UDP port, from the sweep's tagged VMs to the sweep's tagged VMs, and
    # from nowhere else: no address range at all (a source tag matches internal traffic).
    assert sorted(a["IPProtocol"] for a in rule["allowed"]) == ["tcp", "udp"]
    assert all("ports" not in a for a in rule["allowed"])
    assert rule["sourceTags"] == rule["targetTags"] == [sweep_tag("s1")]
    assert "sourceRanges" not in rule and rule["direction"] == "INGRESS"
    assert rule["description"].startswith(gcp.CLUSTER_DESCRIPTION)
    assert '"cloudprof-sweep": "s1"' in rule["description"]
    # The tag is on the sweep's nodes, and on no VM of another sweep.
    tags = {name: inst["tags"]["items"] for (_, _, name), inst in fake_gce.instances.items()}
    assert {tags[i.id][0] for i in made} == {sweep_tag("s1")}
    assert sweep_tag("s1") not in tags[other.id]

    ready = [provider.wait_ready(i, timeout=30) for i in made]
    private = [i.private_address for i in ready]
    assert all(private) and len(set(private)) == NODES  # where the nodes reach each other
    assert not set(private) & {i.address for i in ready}


def test_gcp_rule_goes_with_the_sweeps_last_vm(fake_gce: FakeGce) -> None:
    provider = gcp_provider("s1")
    made = _in_parallel(provider.create, _gcp_nodes("s1"))
    _in_parallel(provider.delete, made[:-1])
    assert cluster_firewall_name("s1") in _gcp_rules(fake_gce)  # the last node still uses it

    provider.delete(made[-1])
    assert fake_gce.instances == {} and fake_gce.firewalls == {}


def test_a_single_node_sweep_gets_no_inter_node_rule(fake_gce: FakeGce) -> None:
    gcp_provider("s1").create(gcp_request("s1"))
    assert set(_gcp_rules(fake_gce)) == {firewall_name("s1")}


def test_gcp_failed_creates_after_the_rule_exists_remove_it(fake_gce: FakeGce) -> None:
    provider = gcp_provider("s1")
    first, second = _gcp_nodes("s1", 2)
    # refused at the call, after both rules were made for it
    fake_gce.inject(PERMISSION)
    with pytest.raises(PermissionDeniedError):
        provider.create(first)
    assert fake_gce.sent("POST", r"/global/firewalls$")
    assert fake_gce.firewalls == {}
    # accepted, then a stockout reported by the operation
    fake_gce.inject(STOCKOUT, zone=ZONE)
    inst = provider.create(second)
    assert cluster_firewall_name("s1") in _gcp_rules(fake_gce)
    with pytest.raises(CapacityError):
        provider.wait_ready(inst, timeout=30)
    assert fake_gce.instances == {} and fake_gce.firewalls == {}


def test_gcp_a_failed_node_leaves_the_rule_to_the_nodes_that_run(fake_gce: FakeGce) -> None:
    provider = gcp_provider("s1")
    running = provider.create(_gcp_nodes("s1", 1)[0])
    fake_gce.inject(PERMISSION)
    with pytest.raises(PermissionDeniedError):
        provider.create(_gcp_nodes("s1", 2)[1])
    assert cluster_firewall_name("s1") in _gcp_rules(fake_gce)
    provider.delete(running)
    assert fake_gce.firewalls == {}


def test_cleanup_lists_and_deletes_a_left_gcp_inter_node_rule(
    fake_gce: FakeGce, monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path
) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.chdir(tmp_path)
    node = _gcp_nodes("s-dead", 1)[0]
    gcp_provider("s-dead").create(dataclasses.replace(node, labels=_expired(node.labels)))
    fake_gce.instances.clear()  # the VM deleted itself at its expiry; the rules stay
    found = gcp.list_resources({LABEL_SWEEP: "s-dead"}, project="proj")
    assert sorted(r.id for r in found) == sorted([firewall_name("s-dead"),
                                                  cluster_firewall_name("s-dead")])
    assert all(r.kind == "firewall" and r.sweep_id == "s-dead" for r in found)

    code, out = _cleanup(capsys, "--provider", "gcp")
    assert code == 0 and cluster_firewall_name("s-dead") in out and "nothing was deleted" in out
    assert cluster_firewall_name("s-dead") in _gcp_rules(fake_gce)

    code, out = _cleanup(capsys, "--provider", "gcp", "--yes")
    assert code == 0, out
    assert f"deleted gcp firewall {cluster_firewall_name('s-dead')}" in out
    assert fake_gce.firewalls == {}


# ------------------------------------------------------------------ aws


def _aws_nodes(keys: SshKeys, sweep: str, n: int = NODES, **changes: object) -> list:
    base = make_request(keys, sweep=sweep, **changes)
    return [dataclasses.replace(base, name=f"{base.name}-node{i}", cluster=True)
            for i in range(n)]


def _self_rules(group_id: str) -> list[dict]:
    """The group's ingress rules that reference the group itself."""
    rules = ec2().describe_security_group_rules(
        Filters=[{"Name": "group-id", "Values": [group_id]}])["SecurityGroupRules"]
    return [r for r in rules if not r["IsEgress"]
            and (r.get("ReferencedGroupInfo") or {}).get("GroupId") == group_id]


def test_aws_nodes_made_in_parallel_share_one_self_referencing_rule(
    moto_env, keys: SshKeys
) -> None:
    prov = aws_provider()
    made = _in_parallel(prov.create, _aws_nodes(keys, "s-c1"))
    prov.create(make_request(keys, sweep="s-other"))  # another sweep, single-node

    (group,) = sweep_groups("s-c1")
    gid = group["GroupId"]
    rules = _self_rules(gid)
    assert sorted((r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in rules) == [
        ("tcp", 0, 65535), ("udp", 0, 65535)]  # once, though three nodes asked at once
    # Every permission of the group: SSH from the caller, the rest from the group only.
    for perm in group["IpPermissions"]:
        if perm["FromPort"] == 22 and perm["ToPort"] == 22 and perm["IpRanges"]:
            continue
        assert perm["IpRanges"] == [] and perm.get("Ipv6Ranges", []) == []
        assert [p["GroupId"] for p in perm["UserIdGroupPairs"]] == [gid]
    # Every node is in the group; the other sweep's VM is not, and its group admits
    # nothing from this one (nor has an inter-node rule: it did not ask).
    described = {i["InstanceId"]: i for i in live_instances("s-c1")}
    assert sorted(described) == sorted(i.id for i in made)
    assert all([g["GroupId"] for g in i["SecurityGroups"]] == [gid] for i in described.values())
    (other,) = sweep_groups("s-other")
    assert _self_rules(other["GroupId"]) == []
    assert all(not p["UserIdGroupPairs"] for p in other["IpPermissions"])

    ready = [prov.wait_ready(i, timeout=30) for i in made]
    private = [i.private_address for i in ready]
    assert all(private) and len(set(private)) == NODES
    assert not set(private) & {i.address for i in ready}


def test_aws_rule_and_group_go_with_the_sweeps_last_vm(moto_env, keys: SshKeys) -> None:
    prov = aws_provider()
    made = _in_parallel(prov.create, _aws_nodes(keys, "s-c1"))
    _in_parallel(prov.delete, made[:-1])
    (group,) = sweep_groups("s-c1")
    assert len(_self_rules(group["GroupId"])) == 2  # the last node still uses them

    prov.delete(made[-1])
    assert live_instances("s-c1") == []
    assert sweep_groups("s-c1") == [] and sweep_keys("s-c1") == []
    assert aws.list_resources({LABEL_SWEEP: "s-c1"}) == []


def test_aws_failed_create_after_the_rule_exists_removes_it(moto_env, keys: SshKeys) -> None:
    prov = aws_provider()
    running = prov.create(_aws_nodes(keys, "s-c1", 1)[0])
    (broken,) = _aws_nodes(keys, "s-c1", 1, machine="c6i.enormous")  # refused by EC2
    with pytest.raises(ProviderError):
        prov.create(broken)
    (group,) = sweep_groups("s-c1")  # the running node keeps the group and its rule
    assert len(_self_rules(group["GroupId"])) == 2

    prov.delete(running)
    with pytest.raises(ProviderError):  # now the rule exists and no other node does
        prov.create(broken)
    assert live_instances("s-c1") == []
    assert sweep_groups("s-c1") == [] and sweep_keys("s-c1") == []


def test_cleanup_lists_and_deletes_a_left_aws_inter_node_rule(
    moto_env, keys: SshKeys, monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.chdir(tmp_path)
    node = _aws_nodes(keys, "s-dead", 1)[0]
    aws_provider().create(dataclasses.replace(node, labels=_expired(node.labels)))
    found = aws.list_resources({LABEL_SWEEP: "s-dead"})
    assert sorted(r.kind for r in found) == [
        "instance", "key-pair", "security-group", "security-group-rule", "security-group-rule"]
    rules = [r for r in found if r.kind == "security-group-rule"]
    (group,) = sweep_groups("s-dead")
    assert {r.group_id for r in rules} == {group["GroupId"]}
    assert all(r.sweep_id == "s-dead" and r.expires_at < time.time() for r in rules)

    code, out = _cleanup(capsys, "--provider", "aws")
    assert code == 0 and "security-group-rule" in out and "nothing was deleted" in out
    assert len(_self_rules(group["GroupId"])) == 2

    code, out = _cleanup(capsys, "--provider", "aws", "--yes")
    assert code == 0, out
    assert "deleted 5 of 5 resources" in out
    assert aws.list_resources({LABEL_SWEEP: "s-dead"}) == []
    assert sweep_groups("s-dead") == []
