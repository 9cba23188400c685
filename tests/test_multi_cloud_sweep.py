"""One ``cloudprof sweep`` across GCP, AWS and an SSH host: one plan, one store, one report.

The real sweep process runs against the fake Compute Engine (GCP), moto (AWS) and
a real loopback sshd that is every "VM" and the user's SSH host at once. What is
checked: each machine ran on its own provider, the store and ``report --json``
compare all three, each cloud is left empty; the plan needs no credentials; a
missing credential of one cloud is refused before anything exists in the other.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from orchestrator.catalog.machines import lookup
from orchestrator.errors import EXIT_CREDENTIALS, EXIT_TEARDOWN
from orchestrator.plan.planner import default_workers, trial_id
from orchestrator.spec.spec import SweepSpec
from tests.fixtures import sweeps
from tests.fixtures.fake_gce import UNAVAILABLE, FakeGce
from tests.fixtures.moto_server import Ec2Faults, MotoServer
from tests.fixtures.sshd import Sshd, sshd_env
from tests.fixtures.sweeps import MACHINE, REPO, TINY, CloudSweep, wait_for

bootstrapped_workdir = sweeps.bootstrapped_workdir


def _host_env(tmp_path: Path, sshd: Sshd, workdir: Path) -> dict[str, str]:
    """Both clouds' "VMs" and the SSH host are ``sshd``; the host's key is in the user's
    ~/.ssh/known_hosts, as it would be for a machine of their own."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(f"[{sshd.host}]:{sshd.port} {sshd.host_public}\n")
    return {**os.environ, **sshd_env(sshd), "HOME": str(home), "PYTHONPATH": str(REPO),
            "CLOUDPROF_SSH_WORKDIR": str(workdir), "COLUMNS": "1000",
            "CLOUDPROF_AWS_IMAGE": "al2023",  # moto serves no Debian parameter
            "CLOUDPROF_DELETE_BACKOFF_S": "0.25"}


def _cloudprof(*args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args],
                          env=env or {**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)


def _sweep(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "sweep", "--machine", MACHINE["gcp"],
            "--machine", MACHINE["aws"], "--project", "proj", *args]


@pytest.mark.slow
def test_one_sweep_on_gce_ec2_and_an_ssh_host_stores_and_reports_all_three(
    tmp_path: Path, moto_env: MotoServer, fake_gce: FakeGce, gcs_emulator: str,
    private_sshd: Sshd, bootstrapped_workdir: Path,
) -> None:
    import boto3
    import pyarrow.parquet as pq

    bucket = f"cp-mixed-{uuid.uuid4().hex[:10]}"  # an s3 bucket: the AWS VM's alone
    boto3.client("s3").create_bucket(Bucket=bucket)
    host = f"{private_sshd.user}@{private_sshd.host}:{private_sshd.port}"
    out = tmp_path / "runs"
    started = time.time()
    proc = subprocess.run(
        _sweep("--host", host, "--workers", "1", "--repeats", "1", "--duration", "1", *TINY,
               "--bucket", f"s3://{bucket}", "--out", str(out)),
        env=_host_env(tmp_path, private_sshd, bootstrapped_workdir), cwd=tmp_path,
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert f"Bucket s3://{bucket}: the aws VMs use it; the gcp, ssh hosts get" in said

    (run_dir,) = out.iterdir()
    ssh_name = f"{private_sshd.host}-{private_sshd.port}"
    trials = pq.read_table(run_dir / "trials.parquet").to_pylist()
    by_machine = {row["machine"]: row for row in trials}
    assert len(trials) == 3 and {r["status"] for r in trials} == {"ok"}
    assert {m: r["provider"] for m, r in by_machine.items()} == {
        MACHINE["gcp"]: "gcp", MACHINE["aws"]: "aws", ssh_name: "ssh"}
    for cloud in ("gcp", "aws"):  # each VM priced from its own cloud's catalog row
        row = lookup(MACHINE[cloud], cloud)
        assert by_machine[MACHINE[cloud]]["price_per_hour"] == row.price_on_demand
        assert by_machine[MACHINE[cloud]]["ran_on"] == MACHINE[cloud]
    assert by_machine[ssh_name]["price_per_hour"] is None  # --host gives no price
    assert by_machine[ssh_name]["ran_on"] == ssh_name

    report = _cloudprof("report", str(run_dir), "--json")
    assert report.returncode == 0, report.stderr[-3000:]
    doc = json.loads(report.stdout)
    machines = {m["machine"]: m for m in doc["machines"]}
    assert set(machines) == {MACHINE["gcp"], MACHINE["aws"], ssh_name}
    assert all(m["best_units_per_s"] > 0 for m in machines.values())  # one measure, all three
    assert {vm["machine"]: vm["provider"] for vm in doc["plan"]["vms"]} == {
        MACHINE["gcp"]: "gcp", MACHINE["aws"]: "aws", ssh_name: "ssh"}
    text = _cloudprof("report", str(run_dir))
    assert text.returncode == 0 and all(m in text.stdout for m in machines), text.stderr

    # one VM in each cloud, in its catalog region, and nothing of them left
    gcp = CloudSweep("gcp", tmp_path, private_sshd, "", bootstrapped_workdir, fake_gce)
    aws = CloudSweep("aws", tmp_path, private_sshd, "", bootstrapped_workdir, moto_env)
    assert gcp.instances_created() == 1 and aws.instances_created() == 1
    assert gcp.live() == [] and aws.live() == []
    zones = {vm["provider"]: vm["zone"]
             for vm in json.loads((run_dir / "sweep.json").read_text())["plan"]["vms"]}
    assert zones == {"gcp": "us-central1-a", "aws": "us-east-1a", "ssh": None}
    # the bucket served the AWS VM alone (its inputs stay there as a labelled cache): only
    # its trial was given signed PUT URLs for its results, the other two came back over SSH
    keys = boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])
    assert any(k["Key"].startswith("inputs/") for k in keys)
    puts = {p.name for p in (bootstrapped_workdir / "manifests").glob("put-*.json")
            if p.stat().st_mtime >= started}
    assert puts == {f"put-{trial_id(MACHINE['aws'], 1, 0)}.json"}


def test_the_plan_of_a_sweep_across_providers_needs_no_credentials(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO), "COLUMNS": "1000", "NO_GCE_CHECK": "true",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sweep", "--machine", "n2-highcpu-8",
         "--machine", "c6i.2xlarge", "--host", "me@box", "--plan", "--out",
         str(tmp_path / "runs")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())
    assert "VM 1/3 to create: gcp n2-highcpu-8" in said
    assert "VM 2/3 to create: aws c6i.2xlarge" in said
    assert "Host 3/3 to use: ssh box" in said
    # the host, of unknown size, runs the catalog machines' worker counts: as many trials
    counts = re.findall(r"(\d+) trials · estimated", said)
    assert len(counts) == 3 and len(set(counts)) == 1
    assert int(counts[0]) == SweepSpec.repeats * len(default_workers(8))  # the default
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("missing", ["gcp", "aws"])
def test_a_missing_credential_of_one_cloud_is_refused_before_the_other_creates_anything(
    tmp_path: Path, moto_env: MotoServer, fake_gce: FakeGce, private_sshd: Sshd,
    bootstrapped_workdir: Path, missing: str,
) -> None:
    env = _host_env(tmp_path, private_sshd, bootstrapped_workdir)
    if missing == "gcp":  # no endpoint: the real Google client, with no credentials to find
        env.pop("CLOUDPROF_GCE_ENDPOINT")
        env["NO_GCE_CHECK"] = "true"
    else:
        env.pop("AWS_ACCESS_KEY_ID")
        env.pop("AWS_SECRET_ACCESS_KEY")
    host = f"{private_sshd.user}@{private_sshd.host}:{private_sshd.port}"
    out = tmp_path / "runs"
    proc = subprocess.run(_sweep("--host", host, "--workers", "1", "--out", str(out)), env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_CREDENTIALS, (proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    named = {"gcp": "no Google Cloud credentials", "aws": "no AWS credentials"}[missing]
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
    assert not out.exists()
    gcp = CloudSweep("gcp", tmp_path, private_sshd, "", bootstrapped_workdir, fake_gce)
    aws = CloudSweep("aws", tmp_path, private_sshd, "", bootstrapped_workdir, moto_env)
    if missing == "gcp":
        import boto3

        assert aws.instances_created() == 0 and aws.live() == []
        assert boto3.client("ec2").describe_key_pairs()["KeyPairs"] == []
    else:
        assert gcp.instances_created() == 0 and gcp.live() == []


@pytest.mark.slow
def test_vms_that_cannot_be_deleted_in_both_clouds_are_each_named_with_their_cloud(
    tmp_path: Path, ec2_faults: Ec2Faults, fake_gce: FakeGce, gcs_emulator: str,
    private_sshd: Sshd, bootstrapped_workdir: Path,
) -> None:
    """Both clouds refuse the deletion: the one error line names each cloud's leftovers (one
    failure never hides the other's), and its cleanup command deletes them all."""
    ec2_faults.inject("TerminateInstances", "InternalError", 500)
    fake_gce.inject(UNAVAILABLE, call="instances.delete", times=1000)
    env = _host_env(tmp_path, private_sshd, bootstrapped_workdir)
    host = f"{private_sshd.user}@{private_sshd.host}:{private_sshd.port}"
    out = tmp_path / "runs"
    proc = subprocess.run(
        _sweep("--host", host, "--workers", "1", "--repeats", "1", "--duration", "1", *TINY,
               "--out", str(out)),
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == EXIT_TEARDOWN, (proc.stdout[-3000:], proc.stderr[-3000:])
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: COULD NOT DELETE") and "may still be billing" in line
    assert "gcp instance " in line and "aws instance " in line and "aws key-pair " in line
    (run_dir,) = out.iterdir()
    sweep = json.loads((run_dir / "sweep.json").read_text())
    states = {vm["provider"]: vm["state"] for vm in sweep["vms"].values()}
    assert states == {"gcp": "delete_failed", "aws": "delete_failed", "ssh": "released"}
    assert (run_dir / "report.html").is_file()  # the three machines' results still count

    ec2_faults.faults.clear()
    fake_gce.faults.clear()
    command = shlex.split(line.split("Delete them now with: ", 1)[1])
    while "=" in command[0]:  # GOOGLE_CLOUD_PROJECT=proj, the sweep's --project
        key, _, value = command.pop(0).partition("=")
        env[key] = value
    assert command[0] == "cloudprof"
    cleanup = _cloudprof(*command[1:], env=env)
    assert cleanup.returncode == 0, (cleanup.stdout[-2000:], cleanup.stderr[-2000:])
    gcp = CloudSweep("gcp", tmp_path, private_sshd, "", bootstrapped_workdir, fake_gce)
    aws = CloudSweep("aws", tmp_path, private_sshd, "", bootstrapped_workdir, ec2_faults)
    wait_for("both clouds to be empty", lambda: gcp.live() == [] and aws.live() == [],
             timeout=120)
