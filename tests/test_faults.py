"""Issue 5's fault tests: signals at each phase, a dying sshd, SIGKILL + resume, secrets.

Every cloud test drives the real ``cloudprof sweep`` process against moto (aws)
or the fake Compute Engine with the GCS emulator (gcp), with a loopback sshd as
the VM (``tests/fixtures/sweeps.py``). The phase a signal lands in is chosen by
watching the cloud, the files the "VM" received and its processes, not by
sleeping.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.errors import EXIT_INTERRUPTED
from orchestrator.plan.planner import slug
from orchestrator.providers import open_bucket
from tests.fixtures import sweeps
from tests.fixtures.sweeps import IDLE, CloudSweep, processes_with, trials_of, wait_for

# The fixtures of tests/fixtures/sweeps.py, for this module.
cloud_sweep = sweeps.cloud_sweep
bootstrapped_workdir = sweeps.bootstrapped_workdir

PRIVATE_KEY_RE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)


def _trials(run_dir: Path) -> pd.DataFrame:
    path = run_dir / "trials.parquet"
    return trials_of(run_dir) if path.is_file() or (run_dir / "trials.parts").is_dir() \
        else pd.DataFrame(columns=["trial_id",
                                                                              "status"])


def _assert_torn_down(sweep: CloudSweep, run_dir: Path) -> None:
    """Nothing of the sweep is left: cloud resources, the key pair, the results prefix in
    the bucket (and its label marker), processes on the VM."""
    assert sweep.live() == []  # instances, key pairs, security groups, firewall rules
    assert not (run_dir / "keys").exists()  # the per-sweep SSH key pair is gone too
    results = _results_prefix(run_dir)
    bucket = open_bucket(sweep.bucket)
    assert bucket.list(results) == {} and bucket.prefix_labels(results) is None
    wait_for("the VM's processes of the sweep to end",
             lambda: not [p for p in processes_with(str(sweep.workdir))
                          if "workloads" in p or "pip" in p], timeout=60)


def _results_prefix(run_dir: Path) -> str:
    return f"results/{slug(json.loads((run_dir / 'sweep.json').read_text())['sweep_id'])}/"


# ---------------------------------------------------------------- signals at each phase


def _reach(sweep: CloudSweep, phase: str, proc: subprocess.Popen) -> None:
    if phase == "provisioning":  # the VM exists, its sshd is not up yet
        wait_for("the VM to be created", sweep.live_instances, proc)
    elif phase == "bootstrap":  # the wheel is on the VM and the venv is being built
        wait_for("the bootstrap", lambda: list(sweep.workdir.glob("wheels/*.whl")), proc)
    else:  # one trial recorded and the next one running
        wait_for("a finished trial and a running one",
                 lambda: sweep.trials_done() >= 1 and sweep.runners(), proc)


# Each cloud at each phase, and each phase under both signals (on the other cloud): the
# teardown differs by cloud and phase, while SIGINT and SIGTERM take the same path
# (engine/signals.py; both on the local provider in test_sweep_local.py). aws at the
# trial phase under SIGINT is test_a_second_ctrl_c_while_tearing_down_... below.
@pytest.mark.slow
@pytest.mark.parametrize(("cloud_sweep", "phase", "sig"), [
    ("aws", "provisioning", signal.SIGTERM), ("gcp", "provisioning", signal.SIGINT),
    ("aws", "bootstrap", signal.SIGINT), ("gcp", "bootstrap", signal.SIGTERM),
    ("aws", "trial", signal.SIGTERM), ("gcp", "trial", signal.SIGINT),
], indirect=["cloud_sweep"], ids=lambda v: getattr(v, "name", str(v)))
def test_signal_at_each_phase_tears_everything_down_and_keeps_finished_trials(
    cloud_sweep: CloudSweep, tmp_path: Path, phase: str, sig: signal.Signals,
) -> None:
    sweep = cloud_sweep
    if phase == "provisioning":
        sweep.sshd.stop()  # the VM is still booting: SSH refused
    if phase == "bootstrap":  # a fresh VM: the venv has to be built
        sweep.workdir = tmp_path / "fresh-vm"
        sweep.env["CLOUDPROF_SSH_WORKDIR"] = str(sweep.workdir)
    proc = sweep.start(sweep.argv("1,2,3", "1.5", job=IDLE))
    _reach(sweep, phase, proc)
    done_before = sweep.trials_done()
    proc.send_signal(sig)
    out, err = sweep.finish(proc)

    assert proc.returncode == EXIT_INTERRUPTED, (out[-2000:], err[-2000:])
    assert "Traceback" not in out + err
    assert "tearing down" in out and "--resume" in err
    run_dir = sweep.run_dir()
    assert run_dir is not None
    _assert_torn_down(sweep, run_dir)
    assert json.loads((run_dir / "sweep.json").read_text())["status"] == "interrupted"
    trials = _trials(run_dir)
    ok = trials[trials["status"] == "ok"]
    assert len(ok) >= done_before  # every trial finished before the signal is in the store
    if phase == "trial":
        assert done_before >= 1 and len(ok) >= 1
    else:  # the signal really landed before any trial ran
        assert len(trials) == 0 and sweep.instances_created() == 1


# ---------------------------------------------------------------- the VM's sshd dies


# gcp: the reconnect is the engine's; aws reconnects in the two tests after this one.
@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["gcp"], indirect=True)
def test_sshd_killed_during_a_trial_is_retried_and_the_vm_still_torn_down(
    cloud_sweep: CloudSweep,
) -> None:
    sweep = cloud_sweep
    proc = sweep.start(sweep.argv("1", "3", job=IDLE))
    wait_for("the trial to run", sweep.runners, proc)
    sweep.sshd.stop()  # the daemon and every session die, the VM stays
    wait_for("the engine to notice and reconnect",  # to the trial, which runs on detached
             lambda: "reconnecting to the trial" in sweep.output(),
             proc, timeout=60)
    sweep.sshd.start()  # the host's sshd is back
    out, err = sweep.finish(proc)

    assert "Traceback" not in out + err
    run_dir = sweep.run_dir()
    assert run_dir is not None
    trials = _trials(run_dir)
    assert len(trials) == 1
    row = trials.iloc[0]
    if row["status"] == "ok":  # retried (or its result collected) on the same VM
        assert proc.returncode == 0, err[-2000:]
        assert row["units"] > 0
    else:  # recorded as failed, with why
        assert row["status"] == "failed" and "connection" in str(row["error"])
    assert "connection lost" in out
    assert sweep.instances_created() == 1  # the same VM, not a new one


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws"], indirect=True)
def test_a_vm_unreachable_for_good_still_gives_the_result_its_runner_put(
    cloud_sweep: CloudSweep,
) -> None:
    """SSH to the VM dies mid-trial and never comes back: the runner, detached there, ends
    and puts its result in the bucket, where the sweep collects it once reconnecting has
    failed for its budget (twice: reattaching, then retrying the trial)."""
    sweep = cloud_sweep
    # the reconnect budget: the 3 s trial ends well within twice 10 s (+ a 2 s backoff),
    # also on a loaded host (with 6 s, a run beside a CPU hog found no result yet)
    sweep.env["CLOUDPROF_SSH_BOOT_TIMEOUT"] = "10"
    proc = sweep.start(sweep.argv("1", "3", "--trial-timeout", "20", job=IDLE))
    wait_for("the runner itself to run (not the shell starting it)",
             lambda: [p for p in sweep.runners() if "python" in p.split()[0]], proc)
    sweep.sshd.stop()  # for good: the daemon and every session die, the VM stays
    out, err = sweep.finish(proc)

    assert "Traceback" not in out + err
    assert "reconnecting to the trial" in " ".join(out.split())
    assert "result fetched from the bucket" in " ".join(out.split()), out[-3000:]
    run_dir = sweep.run_dir()
    assert run_dir is not None
    trials = _trials(run_dir)
    assert list(trials["status"]) == ["ok"] and trials["units"].iloc[0] > 0
    _assert_torn_down(sweep, run_dir)


# ---------------------------------------------------------------- SIGKILL, then resume


# aws: a gcp resume reattaches to its VM in test_gcp.py (test_resume_after_sigkill_...).
@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws"], indirect=True)
def test_sigkill_then_resume_runs_each_missing_trial_once_and_no_trial_twice(
    cloud_sweep: CloudSweep,
) -> None:
    sweep = cloud_sweep
    before = set(sweep.workdir.glob("trials/*"))
    proc = sweep.start(sweep.argv("1,2,3", "1", job=IDLE))
    wait_for("a finished trial and a running one",
             lambda: sweep.trials_done() >= 1 and sweep.runners(), proc)
    proc.kill()  # the laptop dies: no teardown at all
    proc.wait(30)
    run_dir = sweep.run_dir()
    assert run_dir is not None
    done = set(_trials(run_dir).query("status == 'ok'")["trial_id"])
    assert done and len(sweep.live_instances()) == 1  # the VM outlived the sweep
    # so did the results prefix, labelled before the VM put anything in it: cleanup finds it
    results = _results_prefix(run_dir)
    labelled = open_bucket(sweep.bucket).prefix_labels(results)
    assert labelled is not None and f"results/{labelled.sweep_id}/" == results
    assert any(k.endswith("/summary.json") for k in open_bucket(sweep.bucket).list(results))

    code, out, err = sweep.run([sys.executable, "-m", "orchestrator", "sweep", "--resume",
                                str(run_dir)], log="resume")
    assert code == 0, (out[-2000:], err[-2000:])
    assert f"{len(done)} trial(s) already done" in out
    trials = _trials(run_dir)
    assert sorted(trials["workers"]) == [1, 2, 3] and set(trials["status"]) == {"ok"}
    assert sweep.instances_created() == 1  # reattached to the VM, not a second one
    _assert_torn_down(sweep, run_dir)
    ran = [p.name for p in set(sweep.workdir.glob("trials/*")) - before
           if not p.name.endswith(".session")]  # a detached run's pid, output and status
    for trial_id in trials["trial_id"]:
        attempts = [name for name in ran if name.startswith(f"{trial_id}-")]
        # a trial done before the kill never runs again; the one in flight ran twice at most
        assert len(attempts) == (1 if trial_id in done else len(attempts)) and attempts
        assert len(attempts) <= 2


# ---------------------------------------------------------------- no credential leaves the laptop

SECRET = "cpDECOYsecretKey0wJalrXUtnFEMIk7MDENGbPxRfiCYzzz"
TOKEN = "cpDECOYsessionToken0IQoJb3JpZ2luX2VjEJr0DoNotLeak"


def _startup_script(sweep: CloudSweep, request: pytest.FixtureRequest) -> str:
    """The startup script the cloud was asked to give the VM (user data / metadata)."""
    if sweep.provider == "aws":
        (call,) = request.getfixturevalue("ec2_faults").calls("RunInstances")
        return base64.b64decode(call["UserData"]).decode()
    (insert,) = sweep.stand_in.sent("POST", r"/instances$")
    items = {i["key"]: i["value"] for i in insert.body["metadata"]["items"]}
    return items["startup-script"]


def _vm_process_environments(sweep: CloudSweep) -> list[bytes]:
    import psutil

    envs = []
    for proc in psutil.process_iter(["cmdline", "pid"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if str(sweep.workdir) in cmd and "workloads" in cmd:
            with contextlib.suppress(OSError):
                envs.append(Path(f"/proc/{proc.info['pid']}/environ").read_bytes())
    return envs


def written_by_cloudprof(path: Path) -> bool:
    """Not a third-party package that pip put into the VM's venv (pyarrow's libarrow_s3.so
    holds the bytes "X-Amz-Signature"); cloudprof's own wheel there is checked."""
    parts = path.parts
    if "site-packages" not in parts:
        return True
    below = parts[parts.index("site-packages") + 1:]
    return bool(below) and below[0].startswith(("workloads", "cloudprof_workloads"))


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws", "gcp"], indirect=True)
def test_no_user_credential_reaches_the_vm_the_output_or_the_store(
    cloud_sweep: CloudSweep, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    sweep = cloud_sweep
    if sweep.provider == "aws":  # record what EC2 was sent, the user data included
        request.getfixturevalue("ec2_faults")
        for key in ("AWS_ENDPOINT_URL_EC2", "AWS_MAX_ATTEMPTS"):
            sweep.env[key] = os.environ[key]
        sweep.env.update(AWS_SECRET_ACCESS_KEY=SECRET, AWS_SESSION_TOKEN=TOKEN)
    else:
        adc = tmp_path / "adc.json"
        adc.write_text(json.dumps({
            "type": "authorized_user", "client_id": "decoy.apps.googleusercontent.com",
            "client_secret": SECRET, "refresh_token": TOKEN}))
        sweep.env.update(GOOGLE_APPLICATION_CREDENTIALS=str(adc),
                         CLOUDSDK_AUTH_ACCESS_TOKEN=TOKEN)
    # The user's own SSH key, where ssh and paramiko look for one: it must stay here.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "users-own-key",
                    "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    users_key = (home / ".ssh" / "id_ed25519").read_text().strip()
    sweep.env["HOME"] = str(home)

    proc = sweep.start(sweep.argv("1,2", "1"))
    wait_for("a trial on the VM", lambda: _vm_process_environments(sweep), proc)
    environments = _vm_process_environments(sweep)
    out, err = sweep.finish(proc)
    assert proc.returncode == 0, (out[-2000:], err[-2000:])
    run_dir = sweep.run_dir()
    assert run_dir is not None

    # (the key's first base64 line is a header every unencrypted ed25519 key shares)
    secrets = [SECRET.encode(), TOKEN.encode(), users_key.encode(),
               *(line.encode() for line in users_key.splitlines()[2:-1])]
    places: dict[str, bytes] = {"stdout": out.encode(), "stderr": err.encode()}
    places.update({f"vm env {i}": env for i, env in enumerate(environments)})
    for root in (run_dir, sweep.workdir):  # the results store, and every file the VM got
        places.update({str(p): p.read_bytes() for p in root.rglob("*")
                       if p.is_file() and written_by_cloudprof(p)})
    assert len(places) > 10 and any("trials.parquet" in name for name in places)
    assert any(f"site-packages{os.sep}workloads{os.sep}" in name for name in places)  # ours
    signed = b"X-Amz-Security-Token=" + TOKEN.encode()
    for name, data in places.items():
        if name.startswith(str(sweep.workdir / "manifests")):
            # AWS puts a session token in every URL presigned with temporary credentials;
            # without the secret key it signs nothing, and it reaches only the VM, only there.
            data = data.replace(signed, b"")
        else:  # signed URLs are bearer tokens: never in the store or the output
            assert b"X-Amz-Signature" not in data and b"X-Goog-Signature" not in data, name
        for secret in secrets:
            assert secret not in data, f"a credential leaked into {name}"
        assert b"PRIVATE KEY-----" not in data, f"private key material in {name}"

    # The startup script carries the sweep's host key to the VM (by design) and no other.
    script = _startup_script(sweep, request)
    assert all(s.decode() not in script for s in secrets)
    keys_sent = [k.strip() for k in PRIVATE_KEY_RE.findall(script)]
    assert keys_sent == [sweep.sshd.host_key.read_text().strip()]

    # The VM trusts the sweep's own client key, never the user's; port 22 is open to the
    # caller's address only; key pair, group and rule went at teardown (checked above).
    users_public = (home / ".ssh" / "id_ed25519.pub").read_text().split()[1]
    sweep_comment = f"cloudprof-{run_dir.name}"
    if sweep.provider == "aws":
        faults = request.getfixturevalue("ec2_faults")
        (imported,) = faults.calls("ImportKeyPair")
        public = base64.b64decode(imported["PublicKeyMaterial"]).decode()
        (rule,) = faults.calls("AuthorizeSecurityGroupIngress")
        opened = {k: v for k, v in rule.items()
                  if k.startswith("IpPermissions.") and not k.endswith(".Description")}
        assert opened == {"IpPermissions.1.IpProtocol": "tcp", "IpPermissions.1.FromPort": "22",
                          "IpPermissions.1.ToPort": "22",
                          "IpPermissions.1.IpRanges.1.CidrIp": "203.0.113.7/32"}
        assert faults.calls("DeleteKeyPair") and faults.calls("DeleteSecurityGroup")
    else:
        (insert,) = sweep.stand_in.sent("POST", r"/instances$")
        public = json.dumps(insert.body["metadata"])
        (rule,) = sweep.stand_in.sent("POST", r"/global/firewalls$")
        assert rule.body["sourceRanges"] == ["198.51.100.7/32"]
        assert rule.body["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
        assert sweep.stand_in.sent("DELETE", r"/global/firewalls/")
    assert "ssh-ed25519 " in public and sweep_comment in public
    assert users_public not in public


# ---------------------------------------------------------------- bad input leaves nothing

FAKE_KEY_ID = "AKIAZZZZDECOY0000000"  # the shape of an AWS access key id


@pytest.mark.parametrize(("case", "expected"), [
    ("malformed toml", "invalid TOML"),
    ("unknown key", "unknown key 'provder'; did you mean 'provider'?"),
    ("illegal bucket", "invalid bucket name"),
    ("worker count 0", "must be 1 or more, got 0"),
    ("shell metacharacters", "invalid machine type"),
    ("command substitution", "invalid machine type"),
    ("key id as --project", "--project: the value looks like a credential"),
    ("key id in sweep.toml", "project: the value looks like a credential"),
    ("private key in sweep.toml", "bucket: the value looks like a credential"),
    ("key id as --param", "workload parameter 'x' looks like a credential"),
    ("bad SSH boot timeout", "CLOUDPROF_SSH_BOOT_TIMEOUT='soon': give a number of seconds"),
])
def test_bad_input_is_one_line_and_leaves_no_run_dir_and_no_instance(
    moto_env, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator import cli
    from orchestrator.errors import EXIT_USAGE, BucketError
    from orchestrator.providers.aws import list_resources

    out = tmp_path / "runs"
    marker = tmp_path / "pwned"  # what a machine name run by a shell would create
    config = tmp_path / "sweep.toml"
    base = ["sweep", "--repeats", "1", "--provider", "aws", "--out", str(out), "--duration", "1"]
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXk\\n"
    argv = {
        "malformed toml": ["--config", str(config)],
        "unknown key": ["--config", str(config)],
        "illegal bucket": ["-m", "c6i.large", "--bucket", "s3://Bad_Bucket;rm"],
        "worker count 0": ["-m", "c6i.large", "--workers", "0"],
        "shell metacharacters": ["-m", f"c6i.large;touch {marker}"],
        "command substitution": ["-m", f"$(touch {marker})"],
        "key id as --project": ["-m", "c6i.large", "--project", FAKE_KEY_ID],
        "key id in sweep.toml": ["--config", str(config)],
        "private key in sweep.toml": ["--config", str(config)],
        "key id as --param": ["-m", "c6i.large", "--workload", "m:W", "--param",
                              f"x={FAKE_KEY_ID}"],
        "bad SSH boot timeout": ["-m", "c6i.large"],
    }[case]
    if case == "bad SSH boot timeout":
        monkeypatch.setenv("CLOUDPROF_SSH_BOOT_TIMEOUT", "soon")
    config.write_text({
        "malformed toml": 'machines = ["c6i.large"]\nworkers = [1, 2\n',
        "unknown key": 'machines = ["c6i.large"]\nprovder = "aws"\n',
        "key id in sweep.toml": f'machines = ["n2-highcpu-2"]\nproject = "{FAKE_KEY_ID}"\n',
        "private key in sweep.toml": f'machines = ["c6i.large"]\nbucket = "{pem}"\n',
    }.get(case, ""))
    code = cli.main([*base, *argv])
    stdout, stderr = capsys.readouterr()

    assert code in (EXIT_USAGE, BucketError.exit_code), stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], stderr
    assert "Traceback" not in stdout + stderr
    assert FAKE_KEY_ID not in stdout + stderr and "b3BlbnNzaC1rZXk" not in stdout + stderr
    assert not out.exists()  # no run directory
    assert not marker.exists()  # nothing went through a shell
    assert list_resources() == []  # no instance, key pair or security group


@pytest.mark.slow
def test_hosts_file_pointing_at_a_closed_port_is_one_line_and_touches_nothing(
    tmp_path: Path,
) -> None:
    """The host is never reached, so nothing is left on it; the store records why."""
    from tests.fixtures.sshd import free_port

    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\nport = {free_port()}\n')
    workdir = tmp_path / "host-workdir"
    env = {**os.environ, "CLOUDPROF_SSH_WORKDIR": str(workdir)}
    for key in ("CLOUDPROF_SSH_ENDPOINT", "CLOUDPROF_SSH_KEY", "CLOUDPROF_SSH_HOST_KEY"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "sweep", "--repeats", "1",
         "--provider", "ssh", "--hosts",
         str(hosts), "--machine", "gone", "--workers", "1", "--duration", "1", "--frames", "4",
         "--rows", "40", "--cols", "50", "--dim", "10", "--out", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    errors = proc.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr
    assert "connection refused" in errors[0]
    assert not workdir.exists()  # nothing was copied to or run on the host
    (run_dir,) = (tmp_path / "runs").iterdir()
    sweep = json.loads((run_dir / "sweep.json").read_text())
    assert sweep["machines"]["gone"]["status"] == "failed"
    assert "connection refused" in sweep["machines"]["gone"]["error"]
    assert [vm["state"] for vm in sweep["vms"].values()] == ["released"]
    assert _trials(run_dir).empty and not (run_dir / "keys").exists()


@pytest.mark.slow
@pytest.mark.parametrize("cloud_sweep", ["aws"], indirect=True)
def test_a_second_ctrl_c_while_tearing_down_does_not_stop_the_teardown(
    cloud_sweep: CloudSweep,
) -> None:
    """The impatient user presses Ctrl-C again as soon as 'tearing down' shows."""
    sweep = cloud_sweep
    proc = sweep.start(sweep.argv("1,2", "1.5", job=IDLE))
    _reach(sweep, "trial", proc)
    proc.send_signal(signal.SIGINT)
    wait_for("the teardown message", lambda: "tearing down" in sweep.output(), proc, 60)
    proc.send_signal(signal.SIGINT)
    out, err = sweep.finish(proc)
    assert proc.returncode == EXIT_INTERRUPTED, (out[-2000:], err[-2000:])
    assert "Traceback" not in out + err
    run_dir = sweep.run_dir()
    assert run_dir is not None
    _assert_torn_down(sweep, run_dir)
    assert len(_trials(run_dir).query("status == 'ok'")) >= 1


def test_an_interrupt_that_lands_in_a_finalizer_is_delivered_again_not_lost() -> None:
    """Ctrl-C while garbage collection runs a finalizer: Python can only print the
    KeyboardInterrupt there ("Exception ignored in"), and the sweep would go on with every
    later signal only warning. The sweep's handler delivers it again instead, silently."""
    script = (
        "import signal, time, weakref\n"
        "from orchestrator.engine.signals import sweep_signals\n"
        "class Held: pass\n"
        "with sweep_signals() as signals:\n"
        "    held = Held()\n"
        "    weakref.finalize(held, signals.handle, signal.SIGINT, None)\n"
        "    try:\n"
        "        del held  # the finalizer runs here and the signal 'lands' inside it\n"
        "        deadline = time.monotonic() + 10\n"
        "        while time.monotonic() < deadline:\n"
        "            time.sleep(0.01)\n"
        "        print('lost')\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted', signals.raised)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(sweeps.REPO)})
    assert proc.stdout.strip() == "interrupted True", (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
