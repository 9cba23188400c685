"""``cloudprof cleanup`` through the real CLI, against moto (EC2, S3), the fake Compute
Engine and the GCS emulator.

Resources are made by the providers themselves (so they carry exactly the
labels a sweep gives them) with creation and expiry labels set in the past or
the future; bucket prefixes are labelled by ``Bucket.label_prefix``, as a sweep
does, and left as a crash leaves them (marker and objects, no ``finally``); the
last test leaves everything the hard way, by SIGKILLing a real sweep.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator import cli
from orchestrator.engine import cleanup
from orchestrator.providers import aws, gcp
from orchestrator.providers.aws_storage import S3Bucket
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    Bucket,
    marker_key,
)
from orchestrator.providers.local import LocalBucket
from orchestrator.providers.remote import SshKeys
from tests.fixtures.fake_gce import FakeGce
from tests.test_aws import (
    REPO,
    _sweep_argv,
    aws_vm_env,  # noqa: F401 - fixture: moto for the cloud, the loopback sshd for the VM
    live_instances,
    make_request,
    sweep_groups,
    sweep_keys,
)
from tests.test_aws import provider as aws_provider
from tests.test_gcp import _new_bucket as new_gcs_bucket
from tests.test_gcp import _provider as gcp_provider
from tests.test_gcp import _request as gcp_request

HOUR = 3600


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where no ``runs/`` directory points cleanup at buckets the test did not make."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def clouds(moto_env, fake_gce: FakeGce, monkeypatch: pytest.MonkeyPatch) -> FakeGce:
    """Both clouds reachable with credentials; wide output so table rows stay on one line."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setenv("COLUMNS", "300")
    return fake_gce


@pytest.fixture
def keys(tmp_path: Path) -> SshKeys:
    return SshKeys.for_sweep(tmp_path / "sweep-keys")


def _times(created_ago: float, expires_in: float) -> dict[str, str]:
    now = time.time()
    return {LABEL_CREATED: str(int(now - created_ago)), LABEL_EXPIRES: str(int(now + expires_in))}


def make_aws(keys: SshKeys, sweep: str, *, created_ago: float, expires_in: float) -> str:
    """An EC2 instance of ``sweep`` (plus the sweep's key pair and group); its id."""
    req = make_request(keys, sweep=sweep)
    req.labels.update(_times(created_ago, expires_in))
    return aws_provider().create(req).id


def make_gcp(sweep: str, *, created_ago: float, expires_in: float) -> str:
    """A GCE instance of ``sweep`` (plus the sweep's firewall rule); its name."""
    req = gcp_request(sweep)
    req = dataclasses.replace(req, labels={**req.labels, **_times(created_ago, expires_in)})
    return gcp_provider(sweep).create(req).id


def aws_left(sweep: str) -> list[str]:
    return sorted(r.kind for r in aws.list_resources({LABEL_SWEEP: sweep}))


def gcp_left(fake: FakeGce, sweep: str) -> list[str]:
    instances = [k for k, v in fake.instances.items() if v["labels"][LABEL_SWEEP] == sweep]
    rules = [k for k in fake.firewalls if k[1] == gcp.firewall_name(sweep)]
    return ["firewall"] * len(rules) + ["instance"] * len(instances)


def s3_bucket(name: str) -> S3Bucket:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return S3Bucket(f"s3://{name}")


def crashed(bucket: Bucket, prefix: str, sweep: str, *, expires_in: float) -> None:
    """What a sweep SIGKILLed before its ``finally`` leaves: the marker and an object."""
    bucket.label_prefix(prefix, sweep, time.time() + expires_in, 0)
    bucket.put_bytes(f"{prefix}t1/summary.json", b"{}")


def prefixes_left(bucket: Bucket) -> list[str]:
    """Labelled prefixes that still hold objects (a deleted one has neither)."""
    return sorted(p.id for p in bucket.labelled_prefixes() if bucket.list(p.id))


def table_rows(out: str) -> set[str]:
    return {" ".join(cell.strip() for cell in ln.split("│")[1:4])
            for ln in out.splitlines() if ln.count("│") > 5}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["cleanup", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_without_yes_it_lists_and_deletes_nothing(clouds: FakeGce, keys, capsys) -> None:
    iid = make_aws(keys, "s-old", created_ago=3 * HOUR, expires_in=-HOUR)
    name = make_gcp("s-gold", created_ago=3 * HOUR, expires_in=-60)

    code, out, _ = run(capsys)

    assert code == 0
    rows = {ln.split("│")[1].strip() + " " + ln.split("│")[2].strip()
            for ln in out.splitlines() if ln.count("│") > 5}
    assert rows == {"aws instance", "aws key-pair", "aws security-group", "gcp instance",
                    "gcp firewall"}, out
    assert iid in out and name in out and "us-east-1" in out and "us-central1-a" in out
    assert "ago)" in out  # created and expired in the past
    assert "nothing was deleted" in out and "cloudprof cleanup --yes" in out
    assert aws_left("s-old") == ["instance", "key-pair", "security-group"]
    assert gcp_left(clouds, "s-gold") == ["firewall", "instance"]


def test_yes_deletes_expired_and_keeps_other_sweeps(clouds: FakeGce, keys, capsys) -> None:
    make_aws(keys, "s-old", created_ago=3 * HOUR, expires_in=-HOUR)
    make_aws(keys, "s-new", created_ago=60, expires_in=HOUR)
    make_gcp("s-gold", created_ago=3 * HOUR, expires_in=-60)
    make_gcp("s-gnew", created_ago=60, expires_in=HOUR)

    code, out, err = run(capsys, "--yes")

    assert code == 0, err
    assert aws_left("s-old") == [] and gcp_left(clouds, "s-gold") == []
    assert aws_left("s-new") == ["instance", "key-pair", "security-group"]
    assert gcp_left(clouds, "s-gnew") == ["firewall", "instance"]
    assert "deleted 5 of 5 resources" in out
    assert "left alone: 5 resources not due" in out
    # instances went before the key pair and group they used
    lines = [ln for ln in out.splitlines() if ln.startswith("deleted aws")]
    assert "instance" in lines[0] and len(lines) == 3, out


def test_sweep_deletes_all_of_it_regardless_of_expiry(
    clouds: FakeGce, keys, capsys, tmp_path: Path
) -> None:
    make_aws(keys, "s-a", created_ago=60, expires_in=HOUR)
    make_aws(keys, "s-b", created_ago=60, expires_in=HOUR)
    make_gcp("s-a", created_ago=60, expires_in=HOUR)
    run_dir = tmp_path / "runs" / "whatever"
    run_dir.mkdir(parents=True)
    (run_dir / "sweep.json").write_text(json.dumps({"sweep_id": "s-a"}))

    code, out, err = run(capsys, "--sweep", str(run_dir), "--yes")

    assert code == 0, err
    assert aws_left("s-a") == [] and gcp_left(clouds, "s-a") == []
    assert aws_left("s-b") == ["instance", "key-pair", "security-group"]
    assert "of sweep s-a" in out


def test_older_than_picks_by_creation_time(clouds: FakeGce, keys, capsys) -> None:
    make_aws(keys, "s-3h", created_ago=3 * HOUR, expires_in=HOUR)  # old but not expired
    make_aws(keys, "s-10m", created_ago=600, expires_in=-60)  # young but expired

    code, out, err = run(capsys, "--provider", "aws", "--older-than", "2h", "--yes")

    assert code == 0, err
    assert aws_left("s-3h") == []
    assert aws_left("s-10m") == ["instance", "key-pair", "security-group"]
    assert "created more than 2h ago" in out and "gcp" not in out


def test_per_sweep_resources_stay_while_an_instance_of_the_sweep_is_kept(
    clouds: FakeGce, keys, capsys
) -> None:
    """An expired key pair and group are not deleted under a younger instance of their sweep."""
    make_aws(keys, "s-mixed", created_ago=3 * HOUR, expires_in=-HOUR)  # makes key + group
    young = make_request(keys, sweep="s-mixed", name="cp-s-mixed-c6i-xlarge",
                         machine="c6i.xlarge")
    young.labels.update(_times(60, HOUR))
    aws_provider().create(young)

    code, out, err = run(capsys, "--provider", "aws", "--yes")

    assert code == 0, err
    assert aws_left("s-mixed") == ["instance", "key-pair", "security-group"]
    assert "deleted 1 of 1 resource" in out
    assert "2 still used by an instance of their sweep" in out


def test_nothing_to_clean_is_one_clear_line(clouds: FakeGce, keys, capsys) -> None:
    make_aws(keys, "s-live", created_ago=60, expires_in=HOUR)
    code, out, err = run(capsys, "--yes")
    assert code == 0 and err == ""
    assert "nothing to clean up: no cloudprof resources past their expiry in aws, gcp" in out
    assert "│" not in out  # no table
    assert aws_left("s-live") == ["instance", "key-pair", "security-group"]


def _sweep_process(run_dir: Path, sweep: str) -> subprocess.Popen[str]:
    """A process that holds ``run_dir``'s lock as a sweep does (``RunStore.running``),
    with a sweep.json that says ``running``; returns once the lock is held."""
    run_dir.mkdir(parents=True)
    (run_dir / "sweep.json").write_text(json.dumps({"sweep_id": sweep, "status": "running"}))
    code = ("import sys, time; from pathlib import Path; "
            "from orchestrator.results.store import RunStore\n"
            "with RunStore(Path(sys.argv[1])).running():\n"
            "    print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_plain_cleanup_takes_a_killed_sweeps_resources_and_spares_a_running_one(
    clouds: FakeGce, keys, capsys, tmp_path: Path
) -> None:
    """Neither sweep is past its expiry: what tells them apart is whether a process still
    runs the sweep (holds its run directory's lock), whatever sweep.json says."""
    make_aws(keys, "s-killed", created_ago=60, expires_in=HOUR)
    make_gcp("s-killed", created_ago=60, expires_in=HOUR)
    make_aws(keys, "s-running", created_ago=3 * HOUR, expires_in=-HOUR)  # even past expiry
    make_gcp("s-running", created_ago=60, expires_in=HOUR)
    make_aws(keys, "s-elsewhere", created_ago=60, expires_in=HOUR)  # no run directory here
    killed = _sweep_process(tmp_path / "runs" / "s-killed", "s-killed")
    os.kill(killed.pid, signal.SIGKILL)  # no finally: sweep.json still says running
    killed.wait(30)
    running = _sweep_process(tmp_path / "runs" / "s-running", "s-running")
    try:
        code, listed, err = run(capsys)
        assert code == 0, err
        rows = [[c.strip() for c in ln.split("│")[1:]] for ln in listed.splitlines()
                if ln.count("│") > 5]
        assert sorted((r[0], r[1], r[4]) for r in rows) == [
            ("aws", "instance", "s-killed"), ("aws", "key-pair", "s-killed"),
            ("aws", "security-group", "s-killed"), ("gcp", "firewall", "s-killed"),
            ("gcp", "instance", "s-killed")], listed
        assert "or of a sweep no longer running" in listed and "nothing was deleted" in listed
        assert aws_left("s-killed") == ["instance", "key-pair", "security-group"]

        code, out, err = run(capsys, "--yes")
    finally:
        running.kill()
        running.wait(30)

    assert code == 0, err
    assert json.loads((tmp_path / "runs" / "s-killed" / "sweep.json").read_text())[
        "status"] == "running"
    assert aws_left("s-killed") == [] and gcp_left(clouds, "s-killed") == []
    assert aws_left("s-running") == ["instance", "key-pair", "security-group"]
    assert gcp_left(clouds, "s-running") == ["firewall", "instance"]
    assert aws_left("s-elsewhere") == ["instance", "key-pair", "security-group"]
    assert "deleted 5 of 5 resources" in out, out
    assert "left alone: 8 resources not due" in out, out


def _no_google_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("CLOUDPROF_GCE_ENDPOINT", "GOOGLE_APPLICATION_CREDENTIALS",
                "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # not on GCE: don't probe the metadata server


def test_a_cloud_without_credentials_is_skipped_unless_named(
    moto_env, keys, capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_google_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    make_aws(keys, "s-old", created_ago=3 * HOUR, expires_in=-HOUR)

    code, out, err = run(capsys, "--yes")
    assert code == 0, err
    skipped = [ln for ln in out.splitlines() if ln.startswith("gcp: skipped")]
    assert len(skipped) == 1 and "gcloud auth application-default login" in skipped[0]
    assert aws_left("s-old") == []

    code, out, err = run(capsys, "--provider", "gcp")
    errors = err.strip().splitlines()
    assert code == 5 and len(errors) == 1 and errors[0].startswith("error: ")


def test_a_failed_deletion_is_one_line_and_the_rest_still_go(
    clouds: FakeGce, ec2_faults, keys, capsys
) -> None:
    make_aws(keys, "s-old", created_ago=3 * HOUR, expires_in=-HOUR)
    make_gcp("s-gold", created_ago=3 * HOUR, expires_in=-60)
    ec2_faults.inject("DeleteSecurityGroup", "UnauthorizedOperation", 403)

    code, out, err = run(capsys, "--yes")

    assert code == 1
    failed = [ln for ln in out.splitlines() if ln.startswith("could not delete")]
    assert len(failed) == 1 and "security-group" in failed[0]
    assert "UnauthorizedOperation" in failed[0]
    assert aws_left("s-old") == ["security-group"]  # instance and key pair went
    assert gcp_left(clouds, "s-gold") == []
    assert "deleted 4 of 5 resources; 1 failed" in out
    (line,) = err.strip().splitlines()
    assert line.startswith("error: cleanup: 1 problem") and "--yes` again" in line


def test_a_results_prefix_left_by_a_crash_is_listed_and_deleted_only_with_yes(
    clouds: FakeGce, keys, capsys
) -> None:
    bucket = s3_bucket("cp-left")
    crashed(bucket, "results/s-dead/", "s-dead", expires_in=-HOUR)
    crashed(bucket, "results/s-live/", "s-live", expires_in=HOUR)
    crashed(bucket, "results/s-run/", "s-run", expires_in=-HOUR)  # expired, but ...
    make_aws(keys, "s-run", created_ago=60, expires_in=HOUR)  # ... its instance still runs
    bucket.label_prefix("inputs/h1/", "s-dead", time.time() - HOUR, 0)
    bucket.put_bytes("inputs/h1/a.parquet", b"x")
    bucket.label_prefix("inputs/h1/", "s-live", time.time() + HOUR, 0)  # reused: not due
    everything = ["inputs/h1/", "results/s-dead/", "results/s-live/", "results/s-run/"]

    code, out, err = run(capsys, "--provider", "aws", "--bucket", "s3://cp-left")

    assert code == 0, err
    assert table_rows(out) == {"aws bucket-prefix results/s-dead/"}, out
    assert "s3://cp-left" in out and "nothing was deleted" in out
    assert "cloudprof cleanup --provider aws --bucket s3://cp-left --yes" in out
    assert prefixes_left(bucket) == everything

    code, out, err = run(capsys, "--provider", "aws", "--bucket", "s3://cp-left", "--yes")

    assert code == 0, err
    assert prefixes_left(bucket) == ["inputs/h1/", "results/s-live/", "results/s-run/"]
    assert bucket.list("results/s-dead/") == {}
    assert bucket.get_bytes(marker_key("results/s-dead/")) is None  # the marker went too
    assert "deleted aws bucket-prefix results/s-dead/ in s3://cp-left (1 object)" in out
    assert "deleted 1 of 1 resource" in out and aws_left("s-run") != []
    assert "bucket prefix(es) still used by a sweep that has not expired" in out


def test_sweep_takes_its_prefixes_but_not_inputs_another_live_sweep_uses(
    clouds: FakeGce, capsys
) -> None:
    bucket = s3_bucket("cp-sel")
    crashed(bucket, "results/s-a/", "s-a", expires_in=HOUR)
    crashed(bucket, "results/s-b/", "s-b", expires_in=HOUR)
    for prefix, users in (("inputs/mine/", ["s-a"]), ("inputs/shared/", ["s-b", "s-a"])):
        for sweep in users:
            bucket.label_prefix(prefix, sweep, time.time() + HOUR, 7 * 86400)
        bucket.put_bytes(f"{prefix}a.parquet", b"x")

    code, out, err = run(capsys, "--bucket", "s3://cp-sel", "--sweep", "s-a", "--yes")

    assert code == 0, err
    assert prefixes_left(bucket) == ["inputs/shared/", "results/s-b/"]
    assert "deleted 2 of 2 resources" in out and "of sweep s-a" in out


def test_buckets_of_run_directories_and_config_are_searched_and_unreachable_is_one_line(
    clouds: FakeGce, capsys, tmp_path: Path
) -> None:
    found, configured = s3_bucket("cp-found"), s3_bucket("cp-conf")
    crashed(found, "results/s-dead/", "s-dead", expires_in=-HOUR)
    crashed(configured, "results/s-old/", "s-old", expires_in=-HOUR)
    for run_id, url in (("r1", "s3://cp-found"), ("r2", "s3://cp-gone")):
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / "sweep.json").write_text(
            json.dumps({"sweep_id": run_id, "bucket": url}))
    (tmp_path / "sweep.toml").write_text('bucket = "s3://cp-conf"\n')

    code, out, err = run(capsys, "--provider", "aws", "--config", "sweep.toml", "--yes")

    assert code == 0 and err == "", err
    assert prefixes_left(found) == [] and prefixes_left(configured) == []
    (skipped,) = [ln for ln in out.splitlines() if ln.startswith("bucket s3://cp-gone")]
    assert "does not exist" in skipped and skipped.endswith("; skipped")
    assert "deleted 2 of 2 resources" in out

    code, out, err = run(capsys, "--provider", "gcp")  # s3 buckets are not GCP's
    assert code == 0 and "cp-gone" not in out

    code, out, err = run(capsys, "--provider", "aws", "--bucket", "s3://cp-gone")
    (line,) = err.strip().splitlines()
    assert code != 0 and line.startswith("error: cleanup: bucket s3://cp-gone: cannot list")


def _aged(bucket: Bucket, prefix: str, created_ago: float) -> None:
    """Move the prefix's creation label into the past (as if staged that long ago)."""
    body = json.loads(bucket.get_bytes(marker_key(prefix)) or b"")
    body["labels"][LABEL_CREATED] = str(int(time.time() - created_ago))
    bucket.put_bytes(marker_key(prefix), json.dumps(body).encode())


def test_older_than_in_a_dry_runs_local_bucket_spares_inputs_a_live_sweep_uses(
    clouds: FakeGce, capsys, tmp_path: Path
) -> None:
    bucket = LocalBucket(tmp_path / "dry-run-bucket")
    crashed(bucket, "results/s-old/", "s-old", expires_in=-HOUR)
    _aged(bucket, "results/s-old/", 3 * HOUR)
    crashed(bucket, "results/s-young/", "s-young", expires_in=-HOUR)  # created just now
    crashed(bucket, "inputs/h/", "s-live", expires_in=HOUR)
    _aged(bucket, "inputs/h/", 3 * HOUR)  # staged long ago, still used by s-live
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "sweep.json").write_text(json.dumps({"bucket": bucket.url}))

    code, out, err = run(capsys, "--older-than", "2h", "--yes")

    assert code == 0, err
    assert prefixes_left(bucket) == ["inputs/h/", "results/s-young/"]
    assert "deleted local bucket-prefix results/s-old/" in out
    assert "1 bucket prefix(es) still used by a sweep that has not expired" in out


def test_a_prefix_relabelled_after_it_was_listed_is_kept(tmp_path: Path) -> None:
    """A sweep that starts using the inputs cache while cleanup runs keeps it."""
    bucket = LocalBucket(tmp_path / "bucket")
    crashed(bucket, "inputs/h/", "s-old", expires_in=-HOUR)
    (listed,) = bucket.labelled_prefixes()
    bucket.label_prefix("inputs/h/", "s-new", time.time() + HOUR, 0)
    console = Console(file=io.StringIO(), width=200)

    deleted, failures = cleanup.delete([cleanup.Leftover("local", listed, bucket)], console)

    assert deleted == 0 and failures == [] and prefixes_left(bucket) == ["inputs/h/"]
    assert "a sweep relabelled it just now" in console.file.getvalue()  # type: ignore[attr-defined]


def test_a_labelled_gcs_prefix_is_cleaned_up(clouds: FakeGce, gcs_emulator: str, capsys) -> None:
    bucket = new_gcs_bucket()
    crashed(bucket, "results/s-gdead/", "s-gdead", expires_in=-HOUR)
    crashed(bucket, "results/s-glive/", "s-glive", expires_in=HOUR)
    assert prefixes_left(bucket) == ["results/s-gdead/", "results/s-glive/"]

    code, out, err = run(capsys, "--provider", "gcp", "--bucket", bucket.url, "--yes")

    assert code == 0, err
    assert prefixes_left(bucket) == ["results/s-glive/"]
    assert sorted(bucket.list("")) == [marker_key("results/s-glive/"),
                                       "results/s-glive/t1/summary.json"]
    assert f"deleted gcp bucket-prefix results/s-gdead/ in {bucket.url}" in out


@pytest.mark.slow
@pytest.mark.usefixtures("aws_vm_env")
def test_cleanup_after_a_sigkilled_sweep_leaves_nothing_of_it(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    _no_google_credentials(monkeypatch, tmp_path)  # only AWS is set up: GCP is skipped
    boto3.client("s3").create_bucket(Bucket="cp-e2e-kill")
    out_dir = tmp_path / "runs"
    proc = subprocess.Popen(
        _sweep_argv("cp-e2e-kill", out_dir), cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any(r.kind == "instance" for r in aws.list_resources()):
                break
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # no finally, no teardown: a dead laptop
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (run_dir,) = [p for p in out_dir.iterdir() if (p / "sweep.json").exists()]
    sweep_id = json.loads((run_dir / "sweep.json").read_text())["sweep_id"]
    assert len(live_instances(sweep_id)) == 1, "the killed sweep left no instance to clean up"
    assert sweep_groups(sweep_id) and sweep_keys(sweep_id)
    bucket = S3Bucket("s3://cp-e2e-kill")  # labelled before anything was put in it
    labelled = {p.id: p.sweep_id for p in bucket.labelled_prefixes()}
    assert labelled.pop(f"results/{sweep_id}/") == sweep_id
    ((inputs, user),) = labelled.items()
    assert inputs.startswith("inputs/") and user == sweep_id and bucket.list(inputs)

    code, out, err = run(capsys, "--sweep", str(run_dir), "--yes")

    assert code == 0, err
    assert live_instances(sweep_id) == []
    assert sweep_groups(sweep_id) == [] and sweep_keys(sweep_id) == []
    assert aws.list_resources({LABEL_SWEEP: sweep_id}) == []
    assert bucket.list("") == {}  # its results and inputs prefixes went, markers last
    assert "deleted 5 of 5 resources" in out
    assert any(ln.startswith("gcp: skipped") for ln in out.splitlines())
