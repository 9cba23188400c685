"""``--provider ssh`` with several hosts as the nodes of one machine (hosts file ``machine``).

The hosts are the session's real sshd at two loopback addresses (127.0.0.1 and
127.0.0.2: Linux routes 127.0.0.0/8 to lo), so a two-node sweep logs in to two
"hosts", bootstraps each, and forms a real Ray cluster whose head registers at
127.0.0.1 and whose second node joins it from 127.0.0.2. Ray starts slowly on a
shared 2-core machine (~40 s), so one sweep serves every check of the success
path; the bad-input checks start nothing and run in a second or two.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import psutil
import pytest

from orchestrator.engine.ray_cluster import node_address, plan_cluster, start_command
from orchestrator.errors import EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from orchestrator.providers.base import Instance, ProviderOptions, VmRequest
from orchestrator.providers.ssh import SshProvider, nodes_alike
from tests.fixtures.once import built_once
from tests.fixtures.sshd import FEWER_CORES_HOST, SECOND_HOST, Sshd

SLEEP = ["--workload", "sleep", "--param", "unit_ms=10", "--workers", "2", "--repeats", "1"]


def _hosts_file(path: Path, entries: list[dict[str, object]]) -> Path:
    """A hosts file of ``entries`` (TOML written by hand: values are strings and numbers)."""
    lines = []
    for entry in entries:
        lines.append("[[hosts]]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in entry.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _loopback(sshd: Sshd, name: str, address: str, **extra: object) -> dict[str, object]:
    """A host entry for the session's sshd at ``address`` (one of its listen addresses)."""
    return {"name": name, "address": address, "port": sshd.port, "user": sshd.user,
            "key_file": str(sshd.client_key), "known_host_key": sshd.host_public,
            "python": sys.executable, **extra}


def _env(workdir: Path) -> dict[str, str]:
    """The sweep's environment: a bootstrapped workdir on the "hosts" (their venv is
    reused), and none of the settings that redirect a cloud's SSH."""
    env = {**os.environ, "CLOUDPROF_SSH_WORKDIR": str(workdir)}
    for key in ("CLOUDPROF_SSH_ENDPOINT", "CLOUDPROF_SSH_KEY", "CLOUDPROF_SSH_HOST_KEY",
                "CLOUDPROF_SSH_USER"):
        env.pop(key, None)
    return env


def _sweep(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "sweep", "--no-report", "--provider", "ssh",
            *args]


def _cluster_processes(word: str) -> list[int]:
    """Pids of processes with ``word`` in their command line: the cluster's under its temp
    dir, on either "host" (both are this machine)."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(word in part for part in proc.info["cmdline"] or []):
            out.append(proc.pid)
    return out


def _ray_record(run_dir: Path) -> dict[str, object]:
    sweep = json.loads((run_dir / "sweep.json").read_text())
    return next(v["ray"] for v in sweep["vms"].values() if v.get("ray"))


# ------------------------------------------------------------------ hosts file and provider


def test_hosts_sharing_a_machine_name_are_its_nodes_in_file_order(tmp_path: Path) -> None:
    path = _hosts_file(tmp_path / "hosts.toml", [
        {"name": "a", "address": "10.0.0.1", "machine": "pair", "price_per_hour": 0.5},
        {"name": "solo", "address": "10.0.0.9"},
        {"name": "b", "address": "10.0.0.2", "machine": "pair", "price_per_hour": 0.5},
    ])
    provider = SshProvider(ProviderOptions(hosts_file=path))
    assert provider.machines() == ["pair", "solo"]  # a group's hosts only through it

    def node(machine: str, index: int) -> tuple[str, str | None, str]:
        inst = provider.create(VmRequest(
            sweep_id="s1", name=f"cp-s1-{machine}-{index}", machine=machine, region=None,
            zone=None, spot=False, labels={}, ssh_user="x", ssh_public_key="",
            startup_script="", node=index))
        return inst.name, inst.address, inst.machine

    assert node("pair", 0) == ("a", "10.0.0.1", "pair")
    assert node("pair", 1) == ("b", "10.0.0.2", "pair")
    assert node("solo", 0) == ("solo", "10.0.0.9", "solo")
    with pytest.raises(UsageError, match="has 2 SSH host"):
        node("pair", 2)
    with pytest.raises(UsageError, match="is one SSH host"):
        node("solo", 1)
    row = provider.machine_type("pair")
    assert (row.name, row.price_on_demand) == ("pair", 0.5)  # one node's price


@pytest.mark.parametrize(("entries", "message"), [
    ([{"name": "pair", "address": "a"}, {"name": "x", "address": "b", "machine": "pair"}],
     "machine 'pair' is also the name of a host"),
    ([{"name": "a", "address": "a", "machine": "pair", "price_per_hour": 1.0},
      {"name": "b", "address": "b", "machine": "pair", "price_per_hour": 2.0}],
     "differ in price_per_hour (1.0, 2.0)"),
    ([{"name": "a", "address": "a", "machine": "$(id)"}], "invalid machine name"),
    ([{"name": "a", "address": "a", "machine": 3}], "machine must be a string"),
])
def test_a_bad_machine_group_in_the_hosts_file_is_one_line(
        tmp_path: Path, entries: list[dict[str, object]], message: str) -> None:
    path = _hosts_file(tmp_path / "hosts.toml", entries)
    with pytest.raises(UsageError) as err:
        SshProvider(ProviderOptions(hosts_file=path))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("facts", "outcome"), [
    ({"a": {"vcpus": 8, "memory_gib": 31.3}, "b": {"vcpus": 8, "memory_gib": 31.1}}, []),
    ({"a": {"vcpus": 8, "memory_gib": 32.0}, "b": {"vcpus": 8, "memory_gib": 64.0}},
     ["the hosts of machine 'm' differ in memory (a 32, b 64 GiB); its per-node peaks show "
      "each host's"]),
    ({"a": {"vcpus": 8, "memory_gib": 32.0}, "b": {"vcpus": 4, "memory_gib": 32.0}},
     "differ in cores (a 8, b 4 vCPUs)"),
])
def test_nodes_must_have_the_same_cores_and_memory_apart_is_a_warning(
        facts: dict[str, dict[str, object]], outcome: list[str] | str) -> None:
    if isinstance(outcome, str):
        with pytest.raises(UsageError, match=outcome.replace("(", r"\(").replace(")", r"\)")):
            nodes_alike("m", facts)
    else:
        assert nodes_alike("m", facts) == outcome


def test_each_node_starts_ray_at_its_own_address_and_ssh_hosts_are_never_redirected(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_cluster("20260101-000000-abcd", "pair", "10.0.0.1", "ssh", False)
    assert plan.head_address.startswith("10.0.0.1:") and plan.port != 6379  # a shared host
    head = start_command("/venv/bin/ray", plan, 0, "10.0.0.1")
    worker = start_command("/venv/bin/ray", plan, 1, "10.0.0.2")
    assert "--node-ip-address=10.0.0.1" in head and "--head" in head
    assert "--node-ip-address=10.0.0.2" in worker
    assert f"--address={plan.head_address}" in worker
    # CLOUDPROF_SSH_ENDPOINT sends a cloud's VMs to a test sshd; an ssh host is where it is
    monkeypatch.setenv("CLOUDPROF_SSH_ENDPOINT", "127.0.0.1:2222")
    inst = Instance(provider="ssh", id="b", name="b", machine="pair", address="10.0.0.2")
    assert node_address(inst, "ssh") == "10.0.0.2"
    assert node_address(inst, "gcp") == "127.0.0.1"


# ------------------------------------------------------------------ bad input through the CLI


@pytest.mark.parametrize(("entries", "args", "message"), [
    ([{"name": "a", "address": "10.9.0.1", "machine": "pair"},
      {"name": "b", "address": "10.9.0.2", "machine": "pair"}],
     ["--machine", "pair", "--nodes", "1,3"],
     "--nodes 3: machine 'pair' has 2 SSH host(s) in the hosts file; add hosts to it or "
     "lower --nodes"),
    ([{"name": "a", "address": "10.9.0.1"}], ["--machine", "a", "--nodes", "2"],
     "--nodes 2: 'a' is one SSH host and a machine's nodes are separate hosts: give 2 hosts "
     'the same machine = "NAME" in the hosts file'),
    ([{"name": "a", "address": "10.9.0.1", "machine": "pair"}], ["--machine", "a"],
     "SSH host 'a' is a node of machine 'pair' (hosts file): use --machine pair"),
    ([{"name": "pair", "address": "10.9.0.1"},
      {"name": "b", "address": "10.9.0.2", "machine": "pair"}], ["--nodes", "2"],
     "hosts file: machine 'pair' is also the name of a host; rename one of them"),
])
def test_bad_node_groups_are_one_line_exit_2_and_nothing_is_started(
        tmp_path: Path, entries: list[dict[str, object]], args: list[str],
        message: str) -> None:
    """The hosts' addresses lead nowhere: a login attempt would show as a timeout."""
    hosts = _hosts_file(tmp_path / "hosts.toml", entries)
    out = tmp_path / "runs"
    proc = subprocess.run(_sweep("--hosts", str(hosts), *args, *SLEEP, "--out", str(out)),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [f"error: {message}"]
    assert not out.exists()


def test_a_command_line_host_is_one_machine_never_a_group(tmp_path: Path) -> None:
    """Several --host flags are several machines: --nodes 2 on one of them is refused."""
    out = tmp_path / "runs"
    proc = subprocess.run(
        _sweep("--host", "u@10.9.0.1", "--host", "u@10.9.0.2", "--nodes", "2", *SLEEP,
               "--out", str(out)), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.strip().startswith("error: --nodes 2: '10.9.0.1' is one SSH host")
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_hosts_with_other_cores_are_refused_after_one_login_each_before_anything_runs(
        sshd: Sshd, tmp_path: Path) -> None:
    """127.0.0.3 is the same sshd, but its logins see ``nproc`` = 1 (see the fixture)."""
    hosts = _hosts_file(tmp_path / "hosts.toml", [
        _loopback(sshd, "h1", "127.0.0.1", machine="pair"),
        _loopback(sshd, "h3", FEWER_CORES_HOST, machine="pair"),
    ])
    out = tmp_path / "runs"
    proc = subprocess.run(_sweep("--hosts", str(hosts), "--machine", "pair", "--nodes", "1,2",
                                 *SLEEP, "--duration", "1", "--out", str(out)),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env(sshd.directory / "remote-workdir"))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    nproc = os.cpu_count()
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [
        f"error: the hosts of machine 'pair' differ in cores (h1 {nproc}, h3 1 vCPUs): a "
        "machine's nodes must be alike; group alike hosts"]
    assert not out.exists()  # no run directory: nothing was bootstrapped or run


# ------------------------------------------------------------------ a real two-host cluster


@pytest.fixture(scope="session")
def ray_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The "hosts"' workdir for a cluster: its trial env has Ray already, once for all the
    workers (test_ray_support tests that install into a fresh env)."""
    from tests.fixtures.sweeps import ray_bootstrapped_workdir

    return ray_bootstrapped_workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def ssh_two_node_sweep(sshd: Sshd, ray_workdir: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sweep at 1 and 2 nodes of a sleep-bound workload on two loopback "hosts",
    built once for the session's workers (its tests only read the store)."""
    with built_once(tmp_path_factory, "ssh-two-node-sweep") as (tmp, build):
        out = tmp / "runs"
        if build:
            hosts = _hosts_file(tmp / "hosts.toml", [
                _loopback(sshd, "h1", "127.0.0.1", machine="pair", price_per_hour=0.5),
                _loopback(sshd, "h2", SECOND_HOST, machine="pair", price_per_hour=0.5),
            ])
            proc = subprocess.run(_sweep("--hosts", str(hosts), "--machine", "pair",
                                         "--nodes", "1,2", *SLEEP, "--duration", "3",
                                         "--out", str(out)),
                                  capture_output=True, text=True, timeout=600, cwd=tmp,
                                  env=_env(ray_workdir))
            assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
            assert "Traceback" not in proc.stderr
        (run_dir,) = out.iterdir()
        return run_dir


@pytest.mark.slow
def test_an_ssh_sweep_puts_node_i_on_the_groups_ith_host(ssh_two_node_sweep: Path) -> None:
    sweep = json.loads((ssh_two_node_sweep / "sweep.json").read_text())
    ray = _ray_record(ssh_two_node_sweep)
    assert ray["node_addresses"] == ["127.0.0.1", SECOND_HOST]
    assert ray["address"].startswith("127.0.0.1:")  # the head is node 0's host
    assert [sweep["vms"][name]["address"] for name in ray["node_vms"]] == \
        ["127.0.0.1", SECOND_HOST]
    frame = pd.read_parquet(ssh_two_node_sweep / "trials.parquet").set_index("nodes")
    # Where Ray itself placed each node's actor: at the address that node registered.
    # Ray registers a node given 127.0.0.1 at the machine's own address (it resolves
    # localhost), so node 0's is this machine's; node 1's is the second host's.
    head, second = json.loads(frame.loc[2, "node_addresses"])
    assert second == SECOND_HOST and head not in (None, SECOND_HOST)
    assert set(frame["ran_on"]) == {"h1"} and set(frame["machine"]) == {"pair"}


@pytest.mark.slow
def test_a_sleep_bound_workload_runs_about_twice_as_fast_on_two_ssh_hosts(
        ssh_two_node_sweep: Path) -> None:
    frame = pd.read_parquet(ssh_two_node_sweep / "trials.parquet").set_index("nodes")
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    ratio = frame.loc[2, "units_per_s"] / frame.loc[1, "units_per_s"]
    assert 1.6 <= ratio <= 2.4  # the tolerance of the local cluster's check
    # the hosts file's price, for each node the trial ran on
    assert frame.loc[1, "price_per_hour"] == pytest.approx(0.5)
    assert frame.loc[2, "price_per_hour"] == pytest.approx(1.0)


@pytest.mark.slow
def test_the_cluster_is_stopped_and_its_temp_dir_removed_on_every_host_after_success(
        ssh_two_node_sweep: Path) -> None:
    ray = _ray_record(ssh_two_node_sweep)
    temp_dir = str(ray["temp_dir"])
    assert temp_dir.startswith("/tmp/cpray-")
    assert _cluster_processes(temp_dir) == []  # both hosts are this machine
    assert not os.path.exists(temp_dir)


def _wait_for(out: Path, proc: subprocess.Popen[str], ready: Callable[[dict], bool],
              timeout: float = 400) -> Path:
    """The run directory once its sweep.json's machines satisfy ``ready``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for sweep_json in out.glob("*/sweep.json"):
            try:
                data = json.loads(sweep_json.read_text() or "{}")
            except ValueError:
                continue  # read while written
            if ready(data.get("vms") or {}):
                return sweep_json.parent
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended first: {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    raise AssertionError("the sweep never got there")


@pytest.mark.slow
def test_sigint_while_ray_starts_on_two_hosts_stops_it_on_both(
        sshd: Sshd, ray_workdir: Path, tmp_path: Path) -> None:
    """The harder moment: ``ray start`` runs on the hosts when the signal lands, so the
    teardown waits for it and then stops what it left on each host."""
    hosts = _hosts_file(tmp_path / "hosts.toml", [
        _loopback(sshd, "h1", "127.0.0.1", machine="pair"),
        _loopback(sshd, "h2", SECOND_HOST, machine="pair"),
    ])
    out = tmp_path / "runs"
    proc = subprocess.Popen(_sweep("--hosts", str(hosts), "--machine", "pair", "--nodes", "2",
                                   *SLEEP, "--duration", "60", "--out", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=_env(ray_workdir))
    try:
        run_dir = _wait_for(out, proc, lambda vms: any(
            v.get("node_of") and v.get("state") == "ready" for v in vms.values()))
        sweep = json.loads((run_dir / "sweep.json").read_text())
        temp_dir = plan_cluster(sweep["sweep_id"], "pair", "127.0.0.1", "ssh", False).temp_dir
        # until `ray start` runs on the head: the cluster's first process (its --temp-dir
        # alone could be missed between two looks on a loaded machine, once it has run)
        deadline = time.monotonic() + 300
        while not _cluster_processes(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _cluster_processes(temp_dir), "ray start never ran"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert "Traceback" not in stdout + stderr
    assert _cluster_processes(temp_dir) == []
    assert not os.path.exists(temp_dir)


@pytest.mark.slow
def test_a_workload_failing_on_the_cluster_fails_the_sweep_and_stops_ray_on_both_hosts(
        sshd: Sshd, ray_workdir: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "boom.py").write_text(
        "from workloads.base import Workload\n\n\n"
        "class Boom(Workload):\n"
        "    name = 'boom'\n"
        "    unit = 'boom'\n\n"
        "    def prepare(self):\n"
        "        pass\n\n"
        "    def run(self, workers, stop, counter):\n"
        "        raise RuntimeError('boom on this node')\n")
    hosts = _hosts_file(tmp_path / "hosts.toml", [
        _loopback(sshd, "h1", "127.0.0.1", machine="pair"),
        _loopback(sshd, "h2", SECOND_HOST, machine="pair"),
    ])
    out = tmp_path / "runs"
    proc = subprocess.run(_sweep("--hosts", str(hosts), "--machine", "pair", "--nodes", "2",
                                 "--workload", "boom:Boom", "--workdir", str(job),
                                 "--workers", "1", "--repeats", "1", "--duration", "1",
                                 "--out", str(out)),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=_env(ray_workdir))
    assert proc.returncode not in (0, EXIT_INTERRUPTED), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    frame = pd.read_parquet(run_dir / "trials.parquet")
    assert list(frame["status"]) == ["failed"] and "boom on this node" in frame["error"].iloc[0]
    temp_dir = str(_ray_record(run_dir)["temp_dir"])
    assert _cluster_processes(temp_dir) == []
    assert not os.path.exists(temp_dir)
