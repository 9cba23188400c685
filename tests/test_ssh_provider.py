"""The ssh provider: hosts files, --host specs, and a real sshd on loopback as "the user's host"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import HostKeyError, UnreachableError, UsageError
from orchestrator.providers import get_provider
from orchestrator.providers.base import ProviderOptions, VmRequest
from orchestrator.providers.ssh import SshProvider, load_hosts_file, parse_host_spec
from tests.fixtures.sshd import free_port
from tests.fixtures.workloads_env import seed_workloads_env


def _req(machine: str) -> VmRequest:
    return VmRequest(sweep_id="s1", name=f"cp-s1-{machine}", machine=machine, region=None,
                     zone=None, spot=False, labels={"cloudprof-sweep": "s1"}, ssh_user="x",
                     ssh_public_key="", startup_script="")


def _hosts_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def _loopback_hosts(tmp_path: Path, sshd, **extra: object) -> Path:
    lines = [
        "[[hosts]]",
        'name = "box"',
        f'address = "{sshd.host}"',
        f"port = {sshd.port}",
        f'user = "{sshd.user}"',
        f'key_file = "{sshd.client_key}"',
        f'known_host_key = "{sshd.host_public}"',
    ]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extra.items()]
    return _hosts_file(tmp_path, "\n".join(lines) + "\n")


# ------------------------------------------------------------------ parsing


def test_hosts_file_full_schema(tmp_path, sshd):
    path = _hosts_file(tmp_path, f"""
[[hosts]]
name = "big-box"
address = "10.0.0.5"
port = 2222
user = "alice"
key_file = "keys/id_ed25519"
price_per_hour = 1.25
known_host_key = "{sshd.host_public}"
python = "/opt/py/bin/python3"

[[hosts]]
address = "gpu.example.org"
""")
    first, second = load_hosts_file(path)
    assert (first.name, first.address, first.port, first.user) == ("big-box", "10.0.0.5", 2222,
                                                                   "alice")
    assert first.key_file == tmp_path / "keys" / "id_ed25519"  # relative to the file
    assert first.price_per_hour == 1.25 and first.python == "/opt/py/bin/python3"
    assert first.known_host_key.startswith("ssh-ed25519 ")
    assert (second.name, second.port, second.user, second.price_per_hour) == (
        "gpu.example.org", 22, None, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[hosts]]\naddress = "a"\ncolour = "red"\n', "unknown key(s) colour"),
        ('[[hosts]]\nname = "x"\n', "address is required"),
        ('[[hosts]]\naddress = "a"\nport = 0\n', "port must be an integer"),
        ('[[hosts]]\naddress = "a"\nport = "22"\n', "port must be an integer"),
        ('[[hosts]]\naddress = "a;rm -rf /"\n', "invalid address"),
        ('[[hosts]]\naddress = "a"\nname = "$(id)"\n', "invalid host name"),
        ('[[hosts]]\naddress = "a"\nuser = "bob smith"\n', "invalid user"),
        ('[[hosts]]\naddress = "a"\nprice_per_hour = -1\n', "price_per_hour must be"),
        ('[[hosts]]\naddress = "a"\nknown_host_key = "hello"\n', "known_host_key must be"),
        ('[[hosts]]\naddress = "a"\nknown_host_key = "ssh-ed25519 AAAAC3Nz host"\n',
         "known_host_key: invalid host public key"),
        ("[[hosts]\naddress = \n", "not valid TOML"),
        ('title = "x"\n', "unknown key(s) title"),
        ("", "no [[hosts]] entries"),
    ],
)
def test_hosts_file_errors_are_one_line(tmp_path, text, message):
    with pytest.raises(UsageError) as err:
        load_hosts_file(_hosts_file(tmp_path, text))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_hosts_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read hosts file"):
        load_hosts_file(tmp_path / "nope.toml")


def test_host_specs():
    host = parse_host_spec("alice@10.0.0.7:2200")
    assert (host.user, host.address, host.port, host.name) == ("alice", "10.0.0.7", 2200,
                                                               "10.0.0.7-2200")
    assert parse_host_spec("box.lan").name == "box.lan"
    assert parse_host_spec("bob@[::1]:22").address == "::1"
    for bad in ("alice@", "a@b@c", "x@host:99999", "x@ho st", "x@$(id)"):
        with pytest.raises(UsageError):
            parse_host_spec(bad)


def test_duplicate_names_and_unknown_machine(tmp_path):
    path = _hosts_file(tmp_path, '[[hosts]]\naddress = "a"\n[[hosts]]\naddress = "a"\n')
    with pytest.raises(UsageError, match="given twice"):
        SshProvider(ProviderOptions(hosts_file=path))
    provider = SshProvider(ProviderOptions(hosts=["u@one", "u@two:2022"]))
    assert provider.machines() == ["one", "two-2022"]
    with pytest.raises(UsageError, match="unknown SSH host 'three'; hosts: one, two-2022"):
        provider.create(_req("three"))
    with pytest.raises(UsageError, match="needs hosts"):
        SshProvider(ProviderOptions()).check_credentials()


def test_machine_type_carries_the_files_price(tmp_path):
    path = _hosts_file(tmp_path, '[[hosts]]\nname = "a"\naddress = "a"\nprice_per_hour = 0.75\n'
                                 '[[hosts]]\nname = "b"\naddress = "b"\n')
    provider = SshProvider(ProviderOptions(hosts_file=path))
    priced, unpriced = provider.machine_type("a"), provider.machine_type("b")
    assert (priced.provider, priced.name, priced.price(False)) == ("ssh", "a", 0.75)
    assert priced.price_source == "hosts file" and priced.vcpus == 0  # size: read on connect
    assert unpriced.price(False) is None


# ------------------------------------------------------------------ against the loopback sshd


def test_create_wait_ready_reads_facts_and_runs(sshd, tmp_path):
    provider = get_provider("ssh", ProviderOptions(hosts_file=_loopback_hosts(
        tmp_path, sshd, price_per_hour=0.5)))
    assert provider.name == "ssh" and provider.creates_machines is False
    provider.check_credentials()
    inst = provider.create(_req("box"))
    assert (inst.address, inst.port, inst.user, inst.state) == (sshd.host, sshd.port, sshd.user,
                                                                "running")
    inst = provider.wait_ready(inst, timeout=20)
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    assert inst.facts["vcpus"] == nproc
    assert inst.facts["memory_gib"] > 0
    assert inst.facts["price_per_hour"] == 0.5
    ex = provider.connect(inst)
    assert ex.run(["echo", "hi"]).stdout_tail == "hi"
    assert provider.list({"cloudprof-sweep": "s1"}) == []
    provider.delete(inst)  # closes the connection, deletes nothing
    assert not ex.is_connected()
    assert provider.connect(inst).run(["true"]).exit_code == 0  # reconnects
    provider.delete(inst)


def test_closed_port_is_one_line_unreachable_quickly(tmp_path, sshd):
    port = free_port()
    path = _hosts_file(tmp_path, f'[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\n'
                                 f'port = {port}\nkey_file = "{sshd.client_key}"\n')
    provider = SshProvider(ProviderOptions(hosts_file=path))
    inst = provider.create(_req("gone"))
    start = time.monotonic()
    with pytest.raises(UnreachableError) as err:
        provider.wait_ready(inst, timeout=600)
    assert time.monotonic() - start < 8
    assert str(err.value).startswith(f"cannot reach {inst.user}@127.0.0.1:{port} over SSH after")
    assert str(err.value).endswith("connection refused")


def test_unknown_host_key_is_refused_not_accepted(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # empty ~/.ssh/known_hosts
    provider = SshProvider(ProviderOptions(hosts=[f"{sshd.user}@{sshd.host}:{sshd.port}"],
                                           ssh_key=sshd.client_key))
    inst = provider.create(_req(provider.machines()[0]))
    with pytest.raises(HostKeyError, match="is not known: check it, then add it"):
        provider.wait_ready(inst, timeout=10)
    assert not (tmp_path / ".ssh" / "known_hosts").exists()  # nothing was written


def test_wrong_known_host_key_is_refused(sshd, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    path = _loopback_hosts(tmp_path, sshd)
    text = path.read_text().replace(sshd.host_public,
                                    Path(f"{other}.pub").read_text().strip())
    path.write_text(text)
    provider = SshProvider(ProviderOptions(hosts_file=path))
    with pytest.raises(HostKeyError, match="does not match"):
        provider.wait_ready(provider.create(_req("box")), timeout=10)


def test_unreadable_key_file_is_a_usage_error(tmp_path):
    path = _hosts_file(tmp_path, '[[hosts]]\naddress = "a"\nkey_file = "/nonexistent/key"\n')
    with pytest.raises(UsageError, match="not readable"):
        SshProvider(ProviderOptions(hosts_file=path)).check_credentials()
    assert not os.path.exists("/nonexistent/key")


# ------------------------------------------------------------------ end to end through the CLI


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env,
                          capture_output=True, text=True, timeout=240)


TINY = ["--workers", "1,2", "--duration", "1", "--frames", "4", "--rows", "40", "--cols", "50",
        "--dim", "10"]


@pytest.mark.slow
def test_sweep_end_to_end_on_an_ssh_host(sshd, tmp_path):
    """`cloudprof sweep --provider ssh` against the loopback sshd: bootstrap, trials, store."""
    hosts = _loopback_hosts(tmp_path, sshd, price_per_hour=0.1, python=sys.executable)
    workdir = tmp_path / "host-workdir"
    env = {**os.environ, "CLOUDPROF_SSH_WORKDIR": str(workdir)}
    for key in ("CLOUDPROF_SSH_ENDPOINT", "CLOUDPROF_SSH_KEY", "CLOUDPROF_SSH_HOST_KEY"):
        env.pop(key, None)
    out = tmp_path / "runs"
    result = _cli("sweep", "--repeats", "1", "--provider", "ssh", "--hosts", str(hosts),
                  "--machine", "box", *TINY, "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    (run,) = list(out.iterdir())
    import pandas as pd

    trials = pd.read_parquet(run / "trials.parquet")
    assert sorted(trials["workers"]) == [1, 2]
    assert set(trials["status"]) == {"ok"} and set(trials["provider"]) == {"ssh"}
    assert (trials["units"] > 0).all()
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    assert set(trials["vcpus"]) == {nproc}  # read from the host, not from a catalog
    for trial_id in trials["trial_id"]:
        assert (run / "timeseries" / f"{trial_id}.parquet").stat().st_size > 0
    # The trials ran in the bootstrapped env on the host, installed once.
    log = (workdir / "bootstrap.log").read_text().split()
    assert log.count("install") == 1 and "reuse" not in log
    assert not (run / "keys").exists()  # nothing made for a host cloudprof does not own


@pytest.mark.slow
def test_sweep_on_a_closed_port_is_one_line_error(tmp_path):
    hosts = _hosts_file(tmp_path, f'[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\n'
                                  f"port = {free_port()}\n")
    result = _cli("sweep", "--provider", "ssh", "--hosts", str(hosts), "--machine", "gone",
                  *TINY, "--out", str(tmp_path / "runs"), env=dict(os.environ))
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "cannot reach" in errors[0] and "connection refused" in errors[0]
    assert "Traceback" not in result.stderr


def _runner_pids(workdir: Path) -> set[int]:
    """Pids of trial runners (a fresh one or a warm runner's client) running from ``workdir``."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True,
                        text=True).stdout
    found = set()
    for line in ps.splitlines():
        pid, args = line.split(None, 1)
        if (("workloads.run" in args or ("workloads.warm" in args and " run " in args))
                and str(workdir) in args and "python" in args.split()[0]):  # not a shell
            found.add(int(pid))
    return found


@pytest.mark.slow
def test_sweep_survives_a_dropped_ssh_session(private_sshd, tmp_path, tmp_path_factory):
    """The SSH connection drops mid-trial: the runner, detached on the host, runs on; the
    engine reconnects, reattaches to it and records its result — the trial runs once."""
    hosts = _loopback_hosts(tmp_path, private_sshd, python=sys.executable)
    workdir = tmp_path / "host-workdir"
    seed_workloads_env(workdir, tmp_path_factory)  # the build is not what this tests
    env = {**os.environ, "CLOUDPROF_SSH_WORKDIR": str(workdir)}
    for key in ("CLOUDPROF_SSH_ENDPOINT", "CLOUDPROF_SSH_KEY", "CLOUDPROF_SSH_HOST_KEY"):
        env.pop(key, None)
    args = [sys.executable, "-m", "orchestrator.cli", "sweep", "--no-report", "--repeats", "1",
            "--provider", "ssh", "--hosts",
            str(hosts), "--machine", "box", "--workers", "1", "--duration", "4", "--frames",
            "4", "--rows", "40", "--cols", "50", "--dim", "10", "--out", str(tmp_path / "runs")]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while not (runners := _runner_pids(workdir)):  # until the trial runs on the "host"
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the trial never started"
            time.sleep(0.1)
        time.sleep(1.0)
        assert private_sshd.kill_sessions() >= 1
        time.sleep(0.5)
        assert _runner_pids(workdir) & runners, "the runner died with the SSH session"
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:] + out[-2000:]
    assert "reattached to the trial" in out + err
    assert "retrying on the same machine" not in out + err
    import pandas as pd

    (run,) = list((tmp_path / "runs").iterdir())
    trials = pd.read_parquet(run / "trials.parquet")
    assert list(trials["status"]) == ["ok"] and trials["units"].iloc[0] > 0
    assert trials["seconds"].iloc[0] >= 3.5  # the whole measured phase, not a cut one
    (trial_id,) = trials["trial_id"]
    assert (run / "timeseries" / f"{trial_id}.parquet").stat().st_size > 0
    # One run of the trial on the host: its first attempt's directory, no second one.
    ran = sorted(p.name for p in (workdir / "trials").iterdir() if p.name.startswith(trial_id))
    assert len(ran) == 2 and ran[0].endswith("-0") and ran[1] == ran[0] + ".session", ran
    assert (workdir / "trials" / ran[1] / "status").read_text().strip() == "0"
