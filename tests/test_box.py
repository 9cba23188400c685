"""cloudprof against a bare Debian 12 box (tests/fixtures/box.py) as the VM.

The box has what a cloud image has and nothing cloudprof needs: python3 without
venv, pip or numpy. So these tests see the VM side work as it does on a fresh
VM: the bootstrap installs python3-venv with apt and numpy/pyarrow/psutil from
the package index into the box, the trials run as the non-root login user, and
a Google Cloud and an AWS sweep (the fake Compute Engine, moto) hand their VM's
first-boot script to a box, which runs it for real as root. They need root (CI
is root) and the network to Debian's mirror and the package index; they skip
only without root. The image is built once per machine (minutes) and reused.

Each box costs a boot and a bootstrap (~20-40 s on a loaded 2-core machine), so
one box serves every check of one story: a bare VM bootstrapped from staged
wheels and then running a user's job is one test, not three boxes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.fixtures.box import LOGIN_USER, Box

pytestmark = [pytest.mark.box, pytest.mark.slow, pytest.mark.timeout(1200)]

TINY = ["--workers", "1,2", "--duration", "1", "--frames", "4", "--rows", "40", "--cols", "50",
        "--dim", "10"]
WORKDIR = f"/home/{LOGIN_USER}/.cloudprof"  # cloudprof's default on a host it logs in to


def _hosts_file(tmp_path: Path, box: Box) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text("\n".join([
        "[[hosts]]",
        'name = "box"',
        f'address = "{box.host}"',
        f"port = {box.port}",
        f'user = "{box.user}"',
        f'key_file = "{box.client_key}"',
        f'known_host_key = "{box.host_public}"',
        "",
    ]))  # fmt: skip
    return path


def _sweep(tmp_path: Path, box: Box, *args: str, out: str = "runs",
           env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDPROF_SSH_")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "sweep", "--no-report", "--repeats", "1",
         "--provider", "ssh",
         "--hosts", str(_hosts_file(tmp_path, box)), "--machine", "box", *args,
         "--out", str(tmp_path / out)],
        env=env, capture_output=True, text=True, timeout=1000,
    )  # fmt: skip


def _uids_under(box: Box, inside: str) -> set[int]:
    return {p.lstat().st_uid for p in box.path(inside).rglob("*")}


def _installed(box: Box, package: str) -> bool:
    status = box.exec("dpkg-query", "-W", "-f", "${Status}", package, check=False).stdout
    return status == "install ok installed"


def _login_uid(box: Box) -> int:
    return int(box.exec("id", "-u", LOGIN_USER).stdout)


def _check_a_bare_vm(box: Box) -> None:
    """What a cloud image lacks, the box lacks: cloudprof must install it."""
    assert box.exec("python3", "-c", "import numpy", check=False).returncode != 0
    assert box.exec("python3", "-m", "pip", "--version", check=False).returncode != 0
    assert not _installed(box, "python3-venv")
    # The login user is not root and has passwordless sudo, as on a cloud image.
    assert box.exec("id", "-un", user=LOGIN_USER).stdout.strip() == LOGIN_USER
    assert box.exec("sudo", "-n", "id", "-u", user=LOGIN_USER).stdout.strip() == "0"


def _check_power_off_ends_only_the_box(box: Box) -> None:
    """Its own PID namespace: PID 1 is the box's init, and kill -1 reaches only the box."""
    assert box.exec("cat", "/proc/1/cmdline").stdout.startswith("/bin/sh\0/sbin/box-init")
    outside = subprocess.Popen(["sleep", "600"])
    try:
        box.exec("sh", "-c", "kill -9 -1", check=False)
        time.sleep(0.5)
        assert outside.poll() is None and box.running()  # PID 1 ignores what it has no trap for
        box.exec("poweroff", check=False)
        box.proc.wait(120)  # the box ended...
        assert outside.poll() is None  # ...and nothing outside it did
    finally:
        outside.kill()
        outside.wait()


BLOCKED_INDEX = "http://127.0.0.1:9/simple"  # nothing listens there: pip cannot reach an index


def block_the_index(box: Box) -> None:
    """pip in the box reaches no package index: whatever it installs came staged."""
    box.path("/etc/pip.conf").write_text(f"[global]\nindex-url = {BLOCKED_INDEX}\n")
    assert box.exec("python3", "-c", "import urllib.request as u; u.urlopen('"
                    f"{BLOCKED_INDEX}', timeout=5)", check=False).returncode != 0


def _check_a_cube_sweep_from_staged_wheels(box: Box, tmp_path: Path, cache: Path) -> None:
    """Bootstrap once per sweep: this machine fetches the wheels (into ``cache``, kept on
    the machine), the box installs them with its own index blocked, so it cannot have
    fetched them from there."""
    unblocked = box.path("/etc/pip.conf").read_text()
    block_the_index(box)
    start = time.monotonic()
    result = _sweep(tmp_path, box, *TINY, out="cube", env_extra={"CLOUDPROF_CACHE": str(cache)})
    took = time.monotonic() - start
    box.path("/etc/pip.conf").write_text(unblocked)  # the index again, for what comes next
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "cube").iterdir())
    import pandas as pd

    trials = pd.read_parquet(run / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2] and set(trials["status"]) == {"ok"}
    assert (trials["units"] > 0).all()
    for trial_id in trials["trial_id"]:
        assert (run / "timeseries" / f"{trial_id}.parquet").stat().st_size > 0
    # The bootstrap installed the wheel, its dependencies and pip from the staged wheels
    # (pip run from its own staged wheel) into a venv in the login user's home: no apt,
    # no python3-venv, no ensurepip.
    log = box.path(f"{WORKDIR}/bootstrap.log").read_text().splitlines()
    assert not any(" apt " in line for line in log), log
    assert sum(" install " in line for line in log) == 1, log
    assert [line.split()[-1] for line in log if " install " in line] == ["staged"], log
    assert "installed from staged wheels" in result.stdout, result.stdout[-2000:]
    (staged,) = box.path(f"{WORKDIR}/wheelhouse").iterdir()
    assert {p.name.split("-")[0] for p in staged.glob("*.whl")} == \
        {"numpy", "pyarrow", "psutil", "pip"}
    assert not _installed(box, "python3-venv")
    (env,) = box.path(WORKDIR).glob("env-*")
    site = next((env / "lib").glob("python3*/site-packages"))
    for package in ("numpy", "pyarrow", "psutil", "pip"):
        (info,) = site.glob(f"{package}-*.dist-info")
        assert (info / "INSTALLER").read_text().strip() == "pip"
        assert not (info / "direct_url.json").exists()  # found in --find-links, not named
    where = box.exec(f"{WORKDIR}/{env.name}/bin/python", "-c",
                     "import numpy, pyarrow; print(numpy.__file__, pyarrow.__file__)",
                     user=LOGIN_USER).stdout.split()
    assert all(p.startswith(f"{WORKDIR}/{env.name}/") for p in where), where
    # Everything cloudprof left on the box, the trials' files included, is the login user's.
    assert _uids_under(box, WORKDIR) == {_login_uid(box)}
    print(f"cube sweep on a bare box, bootstrap included: {took:.0f}s")


def _check_a_command_job_with_setup_and_a_memory_profile(box: Box, tmp_path: Path) -> None:
    """A user's job: its --setup and memray from the index, run as the login user."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text(
        "import getpass, sys, time\n"
        "import tabulate\n"
        "block = bytearray(16 * 1024 * 1024)\n"
        "print('cloudprof:unit row')\n"
        "for _ in range(3):\n"
        "    print(f'cloudprof:units {int(sys.argv[1])}')\n"
        "    time.sleep(0.1)\n"
        "print(tabulate.tabulate([['ran-as', getpass.getuser()]]))\n"
    )
    result = _sweep(tmp_path, box, "--workers", "1,2", "--workdir", str(project),
                    "--setup", "pip install --quiet tabulate",
                    "--command", "python job.py {workers}", "--profile", "memory", out="job")
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "job").iterdir())
    import pandas as pd

    trials = pd.read_parquet(run / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2] and set(trials["status"]) == {"ok"}
    assert list(trials.sort_values("workers")["units"]) == [3, 6]
    for trial_id in trials["trial_id"]:
        log = (run / "logs" / f"{trial_id}.log").read_text()
        assert f"ran-as  {LOGIN_USER}" in log  # tabulate arrived; not root
    sweep = json.loads((run / "sweep.json").read_text())
    (vm,) = sweep["vms"].values()
    assert vm["setup"] == "ran"
    copy = box.path(vm["job"]["dir"])
    (info,) = (copy / ".cloudprof-site").glob("tabulate-*.dist-info")
    assert not (info / "direct_url.json").exists()  # from the index into the box
    assert {p.lstat().st_uid for p in copy.rglob("*")} == {_login_uid(box)}
    # --profile memory: memray came from the index into the trial env, and profiled
    # the job as the login user; its peak call site is the job's own line.
    log = box.path(f"{WORKDIR}/bootstrap.log").read_text()
    assert "profiler memray" in log, log
    records = [json.loads(p.read_text()) for p in (run / "profiles").glob("*/record.json")]
    assert sorted(r["workers"] for r in records) == [1, 2]
    for record in records:
        assert record["profile"]["status"] == "ok", record["profile"]
        assert record["profile"]["top_sites"][0]["site"] == "job.py:3", record["profile"]


def test_a_bare_box_bootstraps_from_staged_wheels_then_runs_a_users_job_as_its_login_user(
        box: Box, box_sweep_cache: Path, tmp_path: Path) -> None:
    """One bare box, as a fresh VM that serves one sweep and then another: it lacks what a
    cloud image lacks; an SSH sweep of the cube bootstraps it from the staged wheels with
    its index blocked (apt's python3-venv, the env, the trials as the login user); a
    command job with --setup and --profile memory then runs in that env as the login user,
    with what it installs from the index; and its power-off ends the box alone."""
    _check_a_bare_vm(box)
    _check_a_cube_sweep_from_staged_wheels(box, tmp_path, box_sweep_cache)
    _check_a_command_job_with_setup_and_a_memory_profile(box, tmp_path)
    _check_power_off_ends_only_the_box(box)


def test_a_staged_set_that_does_not_install_falls_back_to_the_index(
        venv_box: Box, tmp_path: Path) -> None:
    box = venv_box  # python3-venv comes with the image: the point here is pip's source
    from orchestrator.providers.wheelhouse import (
        LISTING,
        PROBE,
        HostPlatform,
        cache_key,
        staged_requirements,
    )

    # This machine's cache holds a broken set for the box's platform (a numpy wheel that
    # is no zip): the box's offline install fails, and it installs from the index.
    probe = box.exec("python3", "-c", PROBE).stdout.split(" ", 1)[1]
    platform = HostPlatform.parse(probe)
    assert platform is not None, probe
    broken = tmp_path / "cache" / "wheels" / cache_key(staged_requirements(), platform)
    broken.mkdir(parents=True)
    name = f"numpy-2.0.0-cp{platform.python.replace('.', '')}-none-any.whl"
    (broken / name).write_bytes(b"not a wheel")
    (broken / LISTING).write_text(json.dumps({"files": [name]}))
    result = _sweep(tmp_path, box, *TINY, env_extra={"CLOUDPROF_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    log = box.path(f"{WORKDIR}/bootstrap.log").read_text().splitlines()
    assert [line.split()[-1] for line in log if " install " in line] == ["index"], log
    assert "installed from the package index" in result.stdout, result.stdout[-2000:]


class FirstBoot:
    """Runs a VM's first-boot script in the box as root, as the guest agent (Google
    Cloud) or cloud-init (AWS) does once the instance exists."""

    def __init__(self, box: Box) -> None:
        self.box = box
        self.runs: list[subprocess.CompletedProcess[str]] = []
        self.threads: list[threading.Thread] = []

    def __call__(self, script: str) -> None:
        self.box.path("/root/startup.sh").write_text(script)
        thread = threading.Thread(target=lambda: self.runs.append(
            self.box.exec("sh", "/root/startup.sh", check=False)), daemon=True)
        thread.start()
        self.threads.append(thread)


def _cloud_sweep(box: Box, tmp_path: Path, *args: str,
                 env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CLOUDPROF_SSH_") or k == "CLOUDPROF_SSH_SOURCE_CIDR"}
    env.update(env_extra or {})
    env["CLOUDPROF_SSH_ENDPOINT"] = f"{box.host}:{box.port}"  # the VM's address is the box
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "sweep", "--no-report", "--repeats", "1", *args,
         *TINY,
         "--out", str(tmp_path / "runs")],
        env=env, capture_output=True, text=True, timeout=1000,
    )  # fmt: skip


def _check_vm_sweep(box: Box, tmp_path: Path, boot: FirstBoot,
                    result: subprocess.CompletedProcess[str]) -> None:
    """The sweep ran on the box, after the first-boot script set it up as it promises."""
    from orchestrator.engine.sweep import SSH_USER
    from orchestrator.providers.remote import STARTUP_STATE_DIR

    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    import pandas as pd

    trials = pd.read_parquet(run / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2] and set(trials["status"]) == {"ok"}
    # It ran once, as root, and did all it says: the sweep's host key and client key
    # (cloudprof logged in, verifying both), the login user, python3-venv and pip...
    for thread in boot.threads:
        thread.join(60)
    (done,) = boot.runs
    assert "cloudprof-startup: done" in done.stdout, done.stdout + done.stderr
    assert "could not" not in done.stdout, done.stdout
    assert _installed(box, "python3-venv")
    assert box.exec("python3", "-m", "pip", "--version").returncode == 0
    # ...and the self-destruct at the sweep's expiry (shutdown -h +N: whole minutes),
    # not carried out: the box ran the sweep.
    expires_at = int(box.path(f"{STARTUP_STATE_DIR}/expires_at").read_text())
    ends_at = int(box.path("/run/box-poweroff.at").read_text())
    assert expires_at <= ends_at <= expires_at + 120 and box.running()
    home = box.exec("sh", "-c", f"getent passwd {SSH_USER} | cut -d: -f6").stdout.strip()
    log = box.path(f"{home}/.cloudprof/bootstrap.log").read_text().split()
    assert log.count("install") == 1
    # The wheels came staged, through the sweep's bucket (signed URLs), not the index.
    assert log[log.index("install") + 2] == "staged", log
    assert "wheels: staged in " in result.stdout, result.stdout[-2000:]
    assert _uids_under(box, f"{home}/.cloudprof") == {int(box.exec("id", "-u", SSH_USER).stdout)}


def test_a_gce_sweep_whose_vm_is_a_box_booted_with_its_startup_script(
        box: Box, fake_gce, gcs_emulator, box_sweep_cache: Path, tmp_path: Path) -> None:
    """The fake Compute Engine hands each new instance's startup-script metadata to the
    box; the sweep waits for it, bootstraps, runs the cube and deletes the VM."""
    from google.cloud import storage

    boot = FirstBoot(box)
    fake_gce.on_insert = lambda instance: boot(next(
        item["value"] for item in instance["metadata"]["items"]
        if item["key"] == "startup-script"))
    bucket = f"cp-box-{uuid.uuid4().hex[:10]}"
    storage.Client().create_bucket(bucket)
    result = _cloud_sweep(box, tmp_path, "--provider", "gcp", "--project", "proj",
                          "--zone", "us-central1-a", "--machine", "n2-highcpu-2",
                          "--bucket", f"gs://{bucket}",
                          env_extra={"CLOUDPROF_CACHE": str(box_sweep_cache)})
    _check_vm_sweep(box, tmp_path, boot, result)
    assert fake_gce.instances == {}  # the sweep deleted its VM


def test_an_ec2_sweep_whose_vm_is_a_box_booted_with_its_user_data(
        box: Box, moto_env, box_sweep_cache: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """moto keeps each instance's user data; a watcher hands it to the box as soon as the
    instance exists, as cloud-init runs it at boot."""
    import base64

    import boto3

    monkeypatch.setenv("CLOUDPROF_AWS_IMAGE", "al2023")  # moto serves no Debian parameter
    bucket = f"cp-box-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    boot = FirstBoot(box)
    stop = threading.Event()

    def watch() -> None:
        ec2 = boto3.client("ec2")
        seen: set[str] = set()
        while not stop.wait(0.2):
            for reservation in ec2.describe_instances()["Reservations"]:
                for instance in reservation["Instances"]:
                    if instance["InstanceId"] in seen:
                        continue
                    seen.add(instance["InstanceId"])
                    data = ec2.describe_instance_attribute(
                        InstanceId=instance["InstanceId"], Attribute="userData")
                    boot(base64.b64decode(data["UserData"]["Value"]).decode())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = _cloud_sweep(box, tmp_path, "--provider", "aws", "--machine", "c6i.large",
                              "--bucket", f"s3://{bucket}",
                              env_extra={"CLOUDPROF_CACHE": str(box_sweep_cache)})
    finally:
        stop.set()
        watcher.join(10)
    _check_vm_sweep(box, tmp_path, boot, result)
    states = {i["State"]["Name"] for r in boto3.client("ec2").describe_instances()["Reservations"]
              for i in r["Instances"]}
    assert states <= {"shutting-down", "terminated"}  # the sweep terminated its VM


def test_a_gce_sweep_whose_box_never_answers_ssh_fails_it_in_bounded_time_and_deletes_it(
        box: Box, fake_gce, gcs_emulator, tmp_path: Path) -> None:
    """The VM never becomes reachable: the box's sshd is gone and its first-boot script
    never runs. The sweep gives up on that machine after CLOUDPROF_SSH_BOOT_TIMEOUT (the
    300 s default bounded to a test's wait), says so in one line naming the machine and
    what it waited for, exits non-zero and deletes the VM."""
    from google.cloud import storage

    box.exec("pkill", "-x", "sshd")
    for _ in range(50):
        if box.exec("pgrep", "-x", "sshd", check=False).returncode != 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the box's sshd did not end")
    inserted: list[str] = []
    fake_gce.on_insert = lambda instance: inserted.append(instance["name"])
    bucket = f"cp-box-{uuid.uuid4().hex[:10]}"
    storage.Client().create_bucket(bucket)
    bound = 10
    start = time.monotonic()
    result = _cloud_sweep(box, tmp_path, "--provider", "gcp", "--project", "proj",
                          "--zone", "us-central1-a", "--machine", "n2-highcpu-2",
                          "--bucket", f"gs://{bucket}",
                          env_extra={"CLOUDPROF_SSH_BOOT_TIMEOUT": str(bound)})
    took = time.monotonic() - start
    print(f"unreachable box: the sweep ended after {took:.0f}s (SSH wait bound {bound}s)")
    assert result.returncode != 0, result.stdout[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert inserted and box.running()  # a VM was made; the box was there, sshd was not
    lines = [line for line in (result.stderr + result.stdout).splitlines()
             if f"{box.host}:{box.port}" in line and "over SSH after" in line]
    assert lines, result.stderr[-3000:] + result.stdout[-2000:]
    assert "n2-highcpu-2 failed" in lines[0] and "connection refused" in lines[0], lines
    waited = int(lines[0].split("over SSH after ")[1].split("s")[0])
    assert bound <= waited <= bound + 15, lines[0]
    assert took < bound + 120  # the wait, plus making and deleting the VM
    assert fake_gce.instances == {}  # the sweep deleted its VM


def test_two_boxes_form_a_ray_cluster_installed_from_the_index(
        venv_image, box_sweep_cache: Path, tmp_path: Path) -> None:
    """Two boxes as the nodes of one machine (the second at another loopback address, so
    each node has an address of its own), started at once from the image with
    python3-venv (the bootstrap's apt step is another test's): the bootstrap installs
    Ray into each box's venv from the package index, ``ray start`` runs over SSH on
    each, and the 2-node trial runs on the cluster with a memory peak per node."""
    from tests.fixtures.box import running_boxes
    from tests.fixtures.sshd import SECOND_HOST

    with running_boxes(venv_image, tmp_path / "boxes",
                       {"box": "127.0.0.1", "box2": SECOND_HOST}) as pair:
        _check_a_ray_cluster_on(pair, tmp_path, box_sweep_cache)


def _check_a_ray_cluster_on(pair: list[Box], tmp_path: Path, cache: Path) -> None:
    from tests.fixtures.sshd import SECOND_HOST

    hosts = tmp_path / "hosts.toml"
    hosts.write_text("".join(
        "[[hosts]]\n"
        f'name = "{b.name}"\naddress = "{b.host}"\nport = {b.port}\nuser = "{b.user}"\n'
        f'key_file = "{b.client_key}"\nknown_host_key = "{b.host_public}"\n'
        'machine = "pair"\n'
        for b in pair))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDPROF_SSH_")}
    env["CLOUDPROF_CACHE"] = str(cache)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "sweep", "--no-report", "--provider", "ssh",
         "--hosts", str(hosts), "--machine", "pair", "--nodes", "1,2", "--workload",
         "sleep", "--param", "unit_ms=10", "--workers", "2", "--repeats", "1",
         "--duration", "3", "--out", str(tmp_path / "runs")],
        env=env, capture_output=True, text=True, timeout=1000)
    took = time.monotonic() - start
    print(f"two-box Ray sweep, bootstrap and Ray install included: {took:.0f}s")
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    import pandas as pd

    trials = pd.read_parquet(run / "trials.parquet").set_index("nodes")
    assert set(trials["status"]) == {"ok"}, trials["error"].tolist()
    assert json.loads(trials.loc[2, "node_addresses"])[1] == SECOND_HOST
    for each in pair:
        (venv,) = each.path(WORKDIR).glob("env-*")
        site = next((venv / "lib").glob("python3*/site-packages"))
        (info,) = site.glob("ray-*.dist-info")
        assert not (info / "direct_url.json").exists()  # from the index into the box
    from orchestrator.results.report.json_doc import report_document
    from orchestrator.results.report.model import load_run

    rows = report_document(load_run(run))["scale_out"]
    two = next(r for r in rows if r["nodes"] == 2)
    assert len(two["node_peaks"]) == 2 and all(p > 0 for p in two["node_peaks"]), two
