"""``cloudprof sweep --nodes 2`` on the clouds: two VMs, the inter-node rule, and teardown.

The real ``cloudprof sweep`` process runs against moto (aws) or the fake Compute
Engine with the GCS emulator (gcp); both "VMs" are the loopback sshd
(``tests/fixtures/sweeps.py``), so the two nodes of the Ray cluster are two
``ray start``s on this machine. What is checked is the cloud side: two
instances and one inter-node rule exist while the sweep runs, and nothing of
them is left after it, whether it succeeded, failed or was interrupted.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from orchestrator.errors import EXIT_INTERRUPTED
from orchestrator.plan.planner import slug
from orchestrator.providers.gcp import cluster_firewall_name
from tests.fixtures import sweeps
from tests.fixtures.fake_gce import PERMISSION
from tests.fixtures.sweeps import IDLE, MACHINE, CloudSweep, wait_for

cloud_sweep = sweeps.cloud_sweep


@pytest.fixture(scope="session")
def bootstrapped_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's "VM" workdir: its trial env has Ray already (test_ray_support tests
    that install)."""
    return sweeps.ray_bootstrapped_workdir(tmp_path_factory)

NODES = "2"


def _argv(sweep: CloudSweep, duration: str = "1") -> list[str]:
    """``sweep.argv`` for the sleep workload (whose per-node rate is fixed), on 2 nodes."""
    return sweep.argv("1", duration, "--nodes", NODES, job=IDLE)


def _inter_node_rules(sweep: CloudSweep) -> list[str]:
    """The sweep's inter-node rules as the cloud holds them now (quick: one region)."""
    if sweep.provider == "aws":
        ec2 = sweep.ec2()
        groups = [g["GroupId"] for g in ec2.describe_security_groups(
            Filters=[{"Name": "tag-key", "Values": ["cloudprof-sweep"]}])["SecurityGroups"]]
        if not groups:
            return []
        rules = ec2.describe_security_group_rules(
            Filters=[{"Name": "group-id", "Values": groups}])["SecurityGroupRules"]
        return [r["SecurityGroupRuleId"] for r in rules if not r["IsEgress"]
                and (r.get("ReferencedGroupInfo") or {}).get("GroupId") == r["GroupId"]]
    return [name for (_, name) in list(sweep.stand_in.firewalls)
            if name.startswith("cp-cluster-")]


def _two_nodes_and_the_rule(sweep: CloudSweep) -> bool:
    return len(sweep.live_instances()) == 2 and bool(_inter_node_rules(sweep))


def _assert_nothing_left(sweep: CloudSweep) -> None:
    assert sweep.live() == []  # instances, key pairs, groups and their rules, firewall rules
    assert _inter_node_rules(sweep) == []
    assert sweep.instances_created() == 2
    run_dir = sweep.run_dir()
    assert run_dir is not None
    assert not (run_dir / "keys").exists()


def _sweep_id(sweep: CloudSweep) -> str:
    run_dir = sweep.run_dir()
    assert run_dir is not None
    return slug(json.loads((run_dir / "sweep.json").read_text())["sweep_id"])


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws", "gcp"], indirect=True)
def test_two_node_sweep_runs_on_two_vms_with_the_rule_and_leaves_nothing(
    cloud_sweep: CloudSweep,
) -> None:
    sweep = cloud_sweep
    proc = sweep.start(_argv(sweep))
    wait_for("two nodes and the inter-node rule", lambda: _two_nodes_and_the_rule(sweep), proc,
             timeout=400)
    if sweep.provider == "gcp":
        assert _inter_node_rules(sweep) == [cluster_firewall_name(_sweep_id(sweep))]
    else:
        assert len(_inter_node_rules(sweep)) == 2  # tcp and udp, from the group itself
    out, err = sweep.finish(proc, timeout=600)

    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    assert "Traceback" not in out + err
    _assert_nothing_left(sweep)


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws", "gcp"], indirect=True)
def test_second_node_refused_after_the_rule_exists_deletes_the_first_and_the_rule(
    cloud_sweep: CloudSweep, request: pytest.FixtureRequest,
) -> None:
    """The head node runs, then the cloud refuses the second one (a permission error):
    the sweep fails, and the head and the rule made for the cluster go with it."""
    sweep = cloud_sweep
    if sweep.provider == "aws":
        faults = request.getfixturevalue("ec2_faults")  # EC2 behind a fault-injecting front
        sweep.env.update(AWS_ENDPOINT_URL_EC2=faults.endpoint, AWS_MAX_ATTEMPTS="2")
        # only the second node's launch (its Name tag ends as the planner's node_name(1))
        faults.inject("RunInstances", "UnauthorizedOperation", 403,
                      suffix=f"-{MACHINE['aws'].replace('.', '-')}-n1")
    else:
        sweep.stand_in.inject(PERMISSION, suffix=f"-{MACHINE['gcp']}-n1")
    proc = sweep.start(_argv(sweep))
    out, err = sweep.finish(proc, timeout=600)

    assert proc.returncode != 0, (out[-3000:], err[-3000:])
    assert "Traceback" not in out + err
    refusal = "UnauthorizedOperation" if sweep.provider == "aws" else "permission denied"
    assert refusal in " ".join(err.split())  # the refused create, in the one error line
    # the first node and the rule existed when the second was refused ...
    if sweep.provider == "aws":
        assert sweep.instances_created() == 1
        # a permission naming a group (EC2's wire name for UserIdGroupPairs: Groups)
        assert any(".Groups." in key for call in faults.calls("AuthorizeSecurityGroupIngress")
                   for key in call)
    else:
        assert len(sweep.stand_in.sent("POST", r"/instances$")) == 2  # the 2nd one refused
        assert any(r.body["name"].startswith("cp-cluster-")
                   for r in sweep.stand_in.sent("POST", r"/global/firewalls$"))
    # ... and neither is left
    assert sweep.live() == [] and _inter_node_rules(sweep) == []


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws", "gcp"], indirect=True)
def test_sigint_on_a_two_node_sweep_deletes_both_vms_and_the_rule(
    cloud_sweep: CloudSweep,
) -> None:
    sweep = cloud_sweep
    proc = sweep.start(_argv(sweep, duration="20"))
    wait_for("two nodes and the inter-node rule", lambda: _two_nodes_and_the_rule(sweep), proc,
             timeout=400)
    proc.send_signal(signal.SIGINT)
    out, err = sweep.finish(proc, timeout=600)

    assert proc.returncode == EXIT_INTERRUPTED, (out[-3000:], err[-3000:])
    assert "Traceback" not in out + err
    assert "tearing down" in out
    _assert_nothing_left(sweep)
