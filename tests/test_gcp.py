"""Google Cloud provider and GCS bucket against real stand-ins.

Compute Engine: google-cloud-compute's real REST transport against the fake in
``tests/fixtures/fake_gce.py`` (no unittest.mock). GCS: gcp-storage-emulator.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from google.auth import exceptions as gauth

from orchestrator.errors import (
    BucketError,
    CapacityError,
    CredentialsError,
    PermissionDeniedError,
    ProviderError,
    QuotaError,
    UsageError,
)
from orchestrator.providers import get_provider, open_bucket
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_CREATOR,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    ProviderOptions,
    VmRequest,
)
from orchestrator.providers.gcp import (
    GCE_DELETE_LEAD_S,
    GCP_PERMISSIONS,
    GcpProvider,
    delete_resources,
    firewall_name,
    label_value,
    list_resources,
    resource_name,
    sweep_tag,
)
from orchestrator.providers.gcp_storage import GcsBucket
from tests.fixtures.fake_gce import PERMISSION, QUOTA, STOCKOUT, UNAVAILABLE, FakeGce
from tests.test_sweep_local import assert_inputs_labelled

ZONE = "us-central1-a"
REPO = Path(__file__).resolve().parent.parent


def _provider(sweep: str = "s1") -> GcpProvider:
    provider = get_provider("gcp", ProviderOptions(project="proj", zone=ZONE, sweep_id=sweep))
    assert isinstance(provider, GcpProvider)
    provider.poll_interval = 0.01
    return provider


def _request(sweep: str = "s1", machine: str = "n2-highcpu-2", *, spot: bool = False,
             zone: str | None = None, image: str | None = None) -> VmRequest:
    now = int(time.time())
    return VmRequest(
        sweep_id=sweep, name=f"cp-{sweep}-{machine}", machine=machine, region=None, zone=zone,
        spot=spot,
        labels={LABEL_SWEEP: sweep, LABEL_CREATOR: "Ada.Lovelace@Example.com",
                LABEL_CREATED: str(now), LABEL_EXPIRES: str(now + 3600)},
        ssh_user="cloudprof", ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake sweep-s1",
        startup_script="#!/bin/sh\n# cloudprof first boot\nshutdown -h +90\n", image=image)


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


# ------------------------------------------------------------------ compute


def test_lifecycle_leaves_no_instance_and_no_firewall(fake_gce: FakeGce) -> None:
    provider = _provider()
    inst = provider.create(_request())
    assert inst.id == "cp-s1-n2-highcpu-2" and inst.zone == ZONE
    assert inst.facts["vcpus"] == 2
    ready = provider.wait_ready(inst, timeout=30)
    assert ready.state == "RUNNING"
    assert ready.address and ready.address.startswith("203.0.113.")
    # the zone operation was polled on the fake, not on the public endpoint
    assert fake_gce.sent("POST", r"/zones/us-central1-a/operations/[^/]+/wait$")

    listed = provider.list({LABEL_SWEEP: "s1"})
    assert [i.id for i in listed] == [inst.id]
    assert provider.list({LABEL_SWEEP: "other"}) == []
    rule = fake_gce.firewalls[("proj", firewall_name("s1"))]
    assert rule["sourceRanges"] == ["198.51.100.7/32"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert rule["targetTags"] == [sweep_tag("s1")]

    provider.delete(ready)
    assert provider.list({LABEL_SWEEP: "s1"}) == []
    assert fake_gce.instances == {} and fake_gce.firewalls == {}
    provider.delete(ready)  # idempotent: already gone is fine


def test_insert_sends_the_documented_instance(fake_gce: FakeGce) -> None:
    provider = _provider()
    req = _request()
    provider.create(req)
    (sent,) = fake_gce.sent("POST", r"/projects/proj/zones/us-central1-a/instances$")
    body = sent.body
    assert body["name"] == "cp-s1-n2-highcpu-2"
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n2-highcpu-2"
    labels = body["labels"]
    assert labels[LABEL_SWEEP] == "s1"
    assert labels[LABEL_CREATOR] == "ada-lovelace-example-com"  # sanitized to GCP's rules
    assert labels[LABEL_EXPIRES] == req.labels[LABEL_EXPIRES]
    assert labels[LABEL_CREATED] == req.labels[LABEL_CREATED]
    meta = {item["key"]: item["value"] for item in body["metadata"]["items"]}
    assert meta["startup-script"] == req.startup_script
    assert meta["ssh-keys"] == f"cloudprof:{req.ssh_public_key}"
    assert meta["block-project-ssh-keys"] == "true"
    assert meta["enable-oslogin"] == "false"  # OS Login would ignore the sweep's key
    sched = body["scheduling"]
    assert sched["instanceTerminationAction"] == "DELETE"
    assert sched["provisioningModel"] == "STANDARD"
    expiry = dt.datetime.fromisoformat(sched["terminationTime"].replace("Z", "+00:00"))
    # GCE deletes the VM before the guest powers itself off at the expiry (a stopped VM
    # would lose its termination time and linger)
    assert int(expiry.timestamp()) == int(req.labels[LABEL_EXPIRES]) - GCE_DELETE_LEAD_S
    (disk,) = body["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == (
        "projects/debian-cloud/global/images/family/debian-12")
    assert disk["initializeParams"]["diskSizeGb"] == "20"
    assert disk["initializeParams"]["labels"] == labels  # the disk is labelled too
    assert body["tags"]["items"] == [sweep_tag("s1")]
    nic = body["networkInterfaces"][0]
    assert nic["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert "serviceAccounts" not in body  # the VM holds no Google credentials
    (fw,) = fake_gce.sent("POST", r"/global/firewalls$")
    assert fw.body["targetTags"] == body["tags"]["items"]
    assert "cloudprof-expires" in fw.body["description"]


def test_spot_and_image_override(fake_gce: FakeGce) -> None:
    provider = _provider()
    provider.create(_request(spot=True, image="ubuntu-os-cloud/ubuntu-2204-lts"))
    (sent,) = fake_gce.sent("POST", r"/instances$")
    sched = sent.body["scheduling"]
    assert sched["provisioningModel"] == "SPOT"
    assert sched["instanceTerminationAction"] == "DELETE"
    assert sched["automaticRestart"] is False and sched["onHostMaintenance"] == "TERMINATE"
    assert sent.body["disks"][0]["initializeParams"]["sourceImage"] == (
        "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts")


def test_firewall_stays_until_the_last_vm_of_the_sweep_is_gone(fake_gce: FakeGce) -> None:
    provider = _provider()
    a = provider.wait_ready(provider.create(_request(machine="n2-highcpu-2")), timeout=30)
    b = provider.wait_ready(provider.create(_request(machine="n2-highcpu-8")), timeout=30)
    assert len(fake_gce.sent("POST", r"/global/firewalls$")) == 2  # second one: 409, reused
    provider.delete(a)
    assert ("proj", firewall_name("s1")) in fake_gce.firewalls
    provider.delete(b)
    assert fake_gce.firewalls == {}


def test_stockout_is_a_capacity_error_with_the_next_zone(fake_gce: FakeGce) -> None:
    provider = _provider()
    fake_gce.inject(STOCKOUT, zone=ZONE)
    inst = provider.create(_request())
    with pytest.raises(CapacityError) as err:
        provider.wait_ready(inst, timeout=30)
    text = _one_line(err)
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in text and ZONE in text
    assert err.value.zone == ZONE
    assert err.value.next_zones[0] == "us-central1-b"
    assert ZONE not in err.value.next_zones
    assert fake_gce.instances == {} and fake_gce.firewalls == {}  # nothing left behind
    # the engine's one retry, in the next zone, succeeds
    provider.delete(inst)
    retry = provider.create(_request(zone=err.value.next_zones[0]))
    ready = provider.wait_ready(retry, timeout=30)
    assert ready.zone == "us-central1-b" and ready.state == "RUNNING"


def test_quota_is_a_quota_error_and_is_not_retried(fake_gce: FakeGce) -> None:
    provider = _provider()
    fake_gce.inject(QUOTA, zone=ZONE)
    inst = provider.create(_request())
    with pytest.raises(QuotaError) as err:
        provider.wait_ready(inst, timeout=30)
    assert not isinstance(err.value, CapacityError)
    assert "QUOTA_EXCEEDED" in _one_line(err)
    assert len(fake_gce.sent("POST", r"/instances$")) == 1


def test_permission_denied_is_one_line_pointing_at_the_roles(fake_gce: FakeGce) -> None:
    provider = _provider()
    fake_gce.inject(PERMISSION)
    with pytest.raises(PermissionDeniedError) as err:
        provider.create(_request())
    text = _one_line(err)
    assert "compute.instances.create" in text and "infra/iam/gcp-roles.md" in text
    assert fake_gce.firewalls == {}  # the rule made for it went with it


def test_transient_503s_while_waiting_are_retried_a_few_times(fake_gce: FakeGce) -> None:
    provider = _provider()
    fake_gce.inject(UNAVAILABLE, call="operations.wait", times=2)
    ready = provider.wait_ready(provider.create(_request()), timeout=30)
    assert ready.state == "RUNNING"
    fake_gce.inject(UNAVAILABLE, call="operations.wait", times=10)
    with pytest.raises(ProviderError) as err:
        provider.delete(ready)
    assert "unavailable" in _one_line(err)
    assert len(fake_gce.sent("POST", r"/operations/[^/]+/wait$")) >= 2 + 1 + 4


def test_unknown_machine_type_is_one_line(fake_gce: FakeGce) -> None:
    with pytest.raises(ProviderError) as err:
        _provider().create(_request(machine="n2-nonsense-7"))
    assert "n2-nonsense-7" in _one_line(err) and ZONE in str(err.value)
    assert fake_gce.sent("POST", r"/instances$") == []  # nothing was created


def test_vm_vanishing_while_starting_is_reported(fake_gce: FakeGce) -> None:
    provider = _provider()
    inst = provider.create(_request())
    fake_gce.instances.clear()  # e.g. spot preemption with instanceTerminationAction DELETE
    with pytest.raises(ProviderError) as err:
        provider.wait_ready(inst, timeout=30)
    assert "disappeared" in _one_line(err)


def test_cleanup_listing_finds_instances_and_rules(fake_gce: FakeGce) -> None:
    provider = _provider("s2")
    provider.create(_request("s2"))
    other = _provider("s3")
    other.create(_request("s3"))
    found = provider.list_resources({LABEL_SWEEP: "s2"})
    assert sorted(r.kind for r in found) == ["firewall", "instance"]
    assert all(r.expires_at and r.expires_at > time.time() for r in found)
    assert {r.sweep_id for r in found} == {"s2"}
    assert len(provider.list_resources({})) == 4  # every cloudprof resource of the project
    delete_resources(found, project="proj")
    assert provider.list_resources({LABEL_SWEEP: "s2"}) == []
    assert len(provider.list_resources({LABEL_SWEEP: "s3"})) == 2


def test_zones_in_region(fake_gce: FakeGce) -> None:
    assert _provider().zones_in_region("europe-west1") == [
        "europe-west1-b", "europe-west1-c", "europe-west1-d"]


def test_missing_project_is_one_line(fake_gce: FakeGce, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UsageError, match="--project"):
        GcpProvider(ProviderOptions(zone=ZONE)).check_credentials()


def test_missing_adc_stops_the_sweep_with_exit_5_before_anything(tmp_path: Path) -> None:
    """A clean environment (no gcloud config, no key file, not on GCE) in a subprocess."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "NO_GCE_CHECK": "true",
           "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "PYTHONPATH": str(REPO)}
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sweep", "--repeats", "1",
         "--provider", "gcp", "--machine",
         "n2-highcpu-2", "--workers", "1", "--project", "p", "--zone", ZONE, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert "gcloud auth application-default login" in proc.stderr
    assert "--dry-run" in proc.stderr
    assert not out.exists()  # nothing made, not even the run directory


def test_iam_doc_grants_exactly_what_the_code_uses() -> None:
    doc = (REPO / "infra/iam/gcp-roles.md").read_text()
    line = next(ln for ln in doc.splitlines() if ln.strip().startswith("--permissions="))
    granted = line.strip().removeprefix("--permissions=").split(",")
    assert sorted(granted) == sorted(GCP_PERMISSIONS)
    for perm in GCP_PERMISSIONS:  # and each one is explained in the table
        assert f"| `{perm}` |" in doc


def _http_error(status: int, message: str, reason: str) -> Exception:
    from google.api_core.exceptions import from_http_status

    return from_http_status(status, message, errors=[{"reason": reason, "message": message}])


@pytest.mark.parametrize(("exc", "cls", "text"), [
    (lambda: _http_error(403, "Quota 'CPUS' exceeded. Limit: 8.0 globally.", "quotaExceeded"),
     QuotaError, "CPUS"),
    (lambda: _http_error(403, "Required 'compute.firewalls.create' permission", "forbidden"),
     PermissionDeniedError, "compute.firewalls.create"),
    (lambda: _http_error(503, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: no n2 in zone",
                         "resourcePoolExhausted"), CapacityError, "no capacity"),
    (lambda: _http_error(401, "Request had invalid authentication credentials.",
                         "authError"), CredentialsError, "application-default login"),
    (lambda: gauth.RefreshError("invalid_grant: Bad Request\nreauth"), CredentialsError,
     "application-default login"),
    (lambda: gauth.TransportError("Failed to resolve oauth2.googleapis.com"), ProviderError,
     "cannot reach Google"),
])
def test_synchronous_errors_translate_to_one_line(exc, cls, text: str) -> None:
    from orchestrator.sdk.gcp import translate_api_error

    err = translate_api_error(exc(), "n2-highcpu-2 in us-central1-a")
    assert type(err) is cls
    assert text in str(err) and "\n" not in str(err)


def test_naming_rules() -> None:
    assert label_value("Ada.Lovelace@Example.com") == "ada-lovelace-example-com"
    assert len(label_value("x" * 100)) == 63
    assert resource_name("9-Bad Name_x") == "cp-9-bad-name-x"
    assert len(resource_name("cp", "y" * 100)) == 63


# ------------------------------------------------------------------ storage


def _new_bucket(prefix: str = "") -> GcsBucket:
    from google.cloud import storage

    name = f"cp-test-{uuid.uuid4().hex[:12]}"
    storage.Client().create_bucket(name)
    bucket = open_bucket(f"gs://{name}/{prefix}" if prefix else f"gs://{name}")
    assert isinstance(bucket, GcsBucket)
    return bucket


def _tree(root: Path) -> dict[str, bytes]:
    files = {"frames/f0.parquet": os.urandom(3000), "frames/f1.parquet": os.urandom(2000),
             "manifest.json": b'{"frames": 2}'}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


@pytest.mark.parametrize("name", [
    "ab", "UpperCase", "-leading-dash", "trailing-dash-", "has space", "goog-prefixed",
    "my-google-bucket", "x" * 64, "192.168.1.1", "semi;colon",
])
def test_bucket_name_validation_is_one_line_before_any_call(name: str) -> None:
    with pytest.raises(BucketError) as err:
        open_bucket(f"gs://{name}/inputs")
    assert "invalid GCS bucket name" in _one_line(err)


def test_valid_bucket_names_pass() -> None:
    for name in ("cp-results", "a_b.c-d", "123abc"):
        assert GcsBucket(f"gs://{name}").name == name


def test_missing_bucket_is_one_line_with_a_create_hint(gcs_emulator: str) -> None:
    bucket = GcsBucket(f"gs://cp-missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(BucketError) as err:
        bucket.list("")
    assert "gcloud storage buckets create" in _one_line(err)


@pytest.mark.parametrize(("times", "status"), [(2, 503), (None, 403)])
def test_a_gcs_upload_error_is_retried_when_transient_and_else_one_line(
    gcs_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    times: int | None, status: int,
) -> None:
    """The emulator behind the tests' fault front: two 503s on the upload POSTs are waited
    out by google-cloud-storage's DEFAULT_RETRY (asked for explicitly: before release 3 an
    upload retried only under a generation precondition); a refusal is one line."""
    from tests.fixtures.moto_server import _fault_server

    name = _new_bucket().name
    server, faults = _fault_server(os.environ["STORAGE_EMULATOR_HOST"])
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", faults.endpoint)
        faults.inject("POST", "Injected", status, times=times)
        bucket = open_bucket(f"gs://{name}")
        files = _tree(tmp_path)
        if times is not None:
            assert sorted(bucket.upload_dir(tmp_path, "in")) == sorted(f"in/{k}" for k in files)
            assert not faults.faults and len(faults.calls("POST")) == len(files) + times
        else:
            with pytest.raises(BucketError) as err:
                bucket.upload_dir(tmp_path, "in")
            assert "uploading in/" in _one_line(err)
    finally:
        server.shutdown()
        server.server_close()


def test_upload_skips_objects_whose_hash_matches(gcs_emulator: str, tmp_path: Path) -> None:
    bucket = _new_bucket("sweeps")
    files = _tree(tmp_path)
    assert sorted(bucket.upload_dir(tmp_path, "in")) == sorted(f"in/{k}" for k in files)
    listed = bucket.list("in")
    assert listed == {f"in/{k}": hashlib.md5(v).hexdigest() for k, v in files.items()}
    assert bucket.upload_dir(tmp_path, "in") == []  # nothing changed, nothing sent
    (tmp_path / "manifest.json").write_bytes(b'{"frames": 3}')
    assert bucket.upload_dir(tmp_path, "in") == ["in/manifest.json"]
    # keys live under the URL's prefix in the real bucket
    from google.cloud import storage

    names = {b.name for b in storage.Client().list_blobs(bucket.name)}
    assert "sweeps/in/manifest.json" in names


def test_download_dir_round_trip(gcs_emulator: str, tmp_path: Path) -> None:
    bucket = _new_bucket()
    files = _tree(tmp_path / "src")
    bucket.upload_dir(tmp_path / "src", "inputs")
    got = bucket.download_dir("inputs", tmp_path / "dst")
    assert len(got) == len(files)
    for rel, data in files.items():
        assert (tmp_path / "dst" / rel).read_bytes() == data


def test_signed_urls_let_a_vm_get_and_put_with_plain_http(gcs_emulator: str,
                                                          tmp_path: Path) -> None:
    bucket = _new_bucket("p")
    files = _tree(tmp_path)
    bucket.upload_dir(tmp_path, "inputs")
    url = bucket.signed_url("inputs/frames/f0.parquet", "GET")
    assert "X-Goog-Signature=" in url and "/p/inputs/frames/f0.parquet" in url
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.read() == files["frames/f0.parquet"]
    payload = b'{"trial": "t1", "units": 42}'
    put = urllib.request.Request(bucket.signed_url("results/t1/summary.json", "PUT"),
                                 data=payload, method="PUT")
    with urllib.request.urlopen(put, timeout=10) as resp:
        assert resp.status == 200
    assert bucket.list("results") == {
        "results/t1/summary.json": hashlib.md5(payload).hexdigest()}
    with pytest.raises(UsageError):
        bucket.signed_url("inputs/x", "DELETE")


def test_delete_prefix(gcs_emulator: str, tmp_path: Path) -> None:
    bucket = _new_bucket()
    _tree(tmp_path)
    bucket.upload_dir(tmp_path, "a")
    bucket.upload_dir(tmp_path, "b")
    assert bucket.delete_prefix("a") == 3
    assert bucket.list("a") == {}
    assert len(bucket.list("b")) == 3


def test_signed_url_for_real_gcs_with_a_key_file_adc(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A key-file ADC signs locally: the URL is for storage.googleapis.com, no call made."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    key_file = tmp_path / "sa.json"
    key_file.write_text(json.dumps({
        "type": "service_account", "project_id": "proj", "private_key_id": "k1",
        "private_key": pem, "client_email": "signer@proj.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    url = GcsBucket("gs://cp-real/sweeps").signed_url("results/t1/summary.json", "PUT", 600)
    assert url.startswith("https://storage.googleapis.com/cp-real/sweeps/results/t1/summary.json?")
    assert "signer%40proj.iam.gserviceaccount.com" in url and "X-Goog-Expires=600" in url


def test_signed_url_without_a_signing_identity_says_how_to_get_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("CLOUDPROF_GCS_SIGNER", raising=False)
    bucket = GcsBucket("gs://cp-real")
    # credentials that cannot sign, like a user's `gcloud auth application-default login`
    bucket._local.client = storage.Client(project="proj", credentials=AnonymousCredentials())
    with pytest.raises(CredentialsError) as err:
        bucket.signed_url("inputs/a.parquet")
    assert "CLOUDPROF_GCS_SIGNER" in _one_line(err)


def test_bucket_permission_error_is_one_line() -> None:
    from google.api_core.exceptions import Forbidden

    bucket = GcsBucket("gs://cp-locked")
    exc = Forbidden("caller does not have storage.objects.list access to the Google Cloud "
                    "Storage bucket.\nPermission 'storage.objects.list' denied")
    err = bucket._error(exc, "listing")
    assert isinstance(err, BucketError)
    assert "\n" not in str(err) and "storage.objects.list" in str(err)



# ------------------------------------------------------------------ end to end


def _sweep_argv(bucket: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "sweep", "--no-report", "--repeats", "1",
            "--provider", "gcp",
            "--machine", "n2-highcpu-2", "--workers", "1,2", "--duration", "1",
            "--frames", "4", "--rows", "40", "--cols", "50", "--dim", "10",
            "--bucket", f"gs://{bucket}", "--project", "proj", "--zone", ZONE, "--out", str(out)]


def _run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_sweep_end_to_end_after_a_stockout_in_the_first_zone(
    fake_gce: FakeGce, gcs_emulator: str, sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """provision (stockout → next zone once) → stage → bootstrap → trials → collect →
    teardown, through the CLI, with the "VM" being the loopback sshd."""
    import pandas as pd

    from tests.fixtures.sshd import sshd_env

    for key, value in sshd_env(sshd).items():
        monkeypatch.setenv(key, value)
    bucket = _new_bucket()
    out = tmp_path / "runs"
    fake_gce.inject(STOCKOUT, zone=ZONE)
    proc = _run_cli(_sweep_argv(bucket.name, out), tmp_path)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in proc.stdout + proc.stderr

    # one refused insert in the first zone, one VM in the next, and nothing is left
    inserts = fake_gce.sent("POST", r"/instances$")
    assert [r.path.split("/")[6] for r in inserts] == [ZONE, "us-central1-b"]
    # a new sweep's id is new: it looks for no VM of its own to reattach before creating
    first_insert = fake_gce.requests.index(inserts[0])
    assert not [r for r in fake_gce.requests[:first_insert]
                if r.method == "GET" and r.path.endswith("/aggregated/instances")]
    sweep_label = inserts[-1].body["labels"][LABEL_SWEEP]
    assert fake_gce.instances == {} and fake_gce.firewalls == {}
    assert fake_gce.sent("DELETE", rf"/zones/us-central1-b/instances/{inserts[-1].body['name']}$")
    assert _provider().list({LABEL_SWEEP: sweep_label}) == []

    (run_dir,) = [p for p in out.iterdir() if (p / "trials.parquet").exists()]
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2]
    assert set(trials["status"]) == {"ok"} and set(trials["machine"]) == {"n2-highcpu-2"}
    assert (trials["units_per_s"] > 0).all()
    # the "VM" fetched the staged inputs and put its results through signed URLs (the
    # engine says so when a PUT fails); the results prefix is emptied after collection
    keys = bucket.list("")
    assert sum(k.endswith(".parquet") and k.startswith("inputs/") for k in keys) == 4, keys
    assert "not copied to the bucket" not in proc.stdout + proc.stderr
    assert not any(k.startswith("results/") for k in keys), keys
    # the inputs prefix is labelled for `cloudprof cleanup`, in the marker's body and metadata
    assert_inputs_labelled(bucket, run_dir)
    (marker,) = [k for k in keys if k.startswith(".cloudprof-labels/inputs/")]
    metadata = bucket._client().bucket(bucket.name).get_blob(marker).metadata
    assert metadata[LABEL_SWEEP] == sweep_label, metadata
    # signed URLs are bearer tokens: none in the results store or the output
    assert "X-Goog-Signature" not in proc.stdout + proc.stderr
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"X-Goog-Signature" not in path.read_bytes(), path


@pytest.mark.parametrize(("fault", "text"), [(QUOTA, "QUOTA_EXCEEDED"),
                                             (PERMISSION, "compute.instances.create")])
def test_sweep_with_quota_or_permission_error_is_one_line_and_leaves_nothing(
    fake_gce: FakeGce, gcs_emulator: str, tmp_path: Path, fault: str, text: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator import cli

    bucket = _new_bucket()
    fake_gce.inject(fault, zone=ZONE)
    code = cli.main(_sweep_argv(bucket.name, tmp_path / "runs")[3:])  # in-process: faster
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in err + out
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and text in errors[0], err[-2000:]
    assert len(fake_gce.sent("POST", r"/instances$")) == 1  # not retried elsewhere
    assert fake_gce.instances == {} and fake_gce.firewalls == {}


def _start_sweep_until_its_vm_exists(fake_gce: FakeGce, argv: list[str],
                                     cwd: Path) -> subprocess.Popen[str]:
    """Start ``cloudprof sweep`` and return once the fake holds its VM (still booting)."""
    fake_gce.gets_until_running = 10**9  # the VM never comes up until the test says so
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not fake_gce.instances and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if not fake_gce.instances:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the sweep never created its VM: {err[-2000:]}")
    return proc


@pytest.mark.slow
def test_signal_while_provisioning_deletes_the_vm_and_its_firewall(
    fake_gce: FakeGce, gcs_emulator: str, tmp_path: Path,
) -> None:
    """SIGTERM while the VM boots; SIGINT there is test_faults.py's gcp-provisioning case."""
    sig = signal.SIGTERM
    bucket = _new_bucket()
    proc = _start_sweep_until_its_vm_exists(fake_gce, _sweep_argv(bucket.name, tmp_path / "runs"),
                                            tmp_path)
    proc.send_signal(sig)  # lands while the engine waits for the VM to boot
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert fake_gce.instances == {} and fake_gce.firewalls == {}


@pytest.mark.slow
def test_sigkill_mid_sweep_leaves_labelled_resources_that_cleanup_finds(
    fake_gce: FakeGce, gcs_emulator: str, tmp_path: Path,
) -> None:
    """A killed laptop: the VM and its rule stay, findable by label and deletable."""
    bucket = _new_bucket()
    proc = _start_sweep_until_its_vm_exists(fake_gce, _sweep_argv(bucket.name, tmp_path / "runs"),
                                            tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    (inst,) = fake_gce.instances.values()
    sweep = inst["labels"][LABEL_SWEEP]
    # the VM deletes itself at its termination time even if nobody runs cleanup
    assert inst["scheduling"]["instanceTerminationAction"] == "DELETE"
    found = list_resources({LABEL_SWEEP: sweep}, project="proj")
    assert sorted(r.kind for r in found) == ["firewall", "instance"]
    assert all(r.sweep_id == sweep and r.expires_at for r in found)
    delete_resources(found, project="proj")
    assert fake_gce.instances == {} and fake_gce.firewalls == {}


@pytest.mark.slow
def test_resume_after_sigkill_reattaches_to_the_same_vm(
    fake_gce: FakeGce, gcs_emulator: str, sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pandas as pd

    from tests.fixtures.sshd import sshd_env

    for key, value in sshd_env(sshd).items():
        monkeypatch.setenv(key, value)
    bucket = _new_bucket()
    out = tmp_path / "runs"
    proc = _start_sweep_until_its_vm_exists(fake_gce, _sweep_argv(bucket.name, out), tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    (run_dir,) = list(out.iterdir())
    fake_gce.gets_until_running = 0  # the VM finishes booting after the laptop died

    resumed = _run_cli([sys.executable, "-m", "orchestrator", "sweep", "--resume",
                        str(run_dir)], tmp_path)
    assert resumed.returncode == 0, (resumed.stdout[-3000:], resumed.stderr[-3000:])
    assert len(fake_gce.sent("POST", r"/instances$")) == 1  # reattached, not created again
    assert fake_gce.sent("GET", r"/aggregated/instances$")  # --resume looked for its VM
    assert fake_gce.instances == {} and fake_gce.firewalls == {}
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2] and set(trials["status"]) == {"ok"}


def test_arm64_machines_boot_the_arm64_build_of_the_default_image(fake_gce: FakeGce) -> None:
    provider = _provider()
    provider.create(_request(machine="t2a-standard-4"))
    (sent,) = fake_gce.sent("POST", r"/zones/us-central1-a/instances$")
    assert sent.body["disks"][0]["initializeParams"]["sourceImage"] == (
        "projects/debian-cloud/global/images/family/debian-12-arm64")
    body = provider.instance_body(_request(machine="c4a-standard-8"), "us-central1-a")
    assert body.disks[0].initialize_params.source_image.endswith("/debian-12-arm64")
    body = provider.instance_body(_request(machine="n2d-standard-8"), "us-central1-a")
    assert body.disks[0].initialize_params.source_image.endswith("/debian-12")
