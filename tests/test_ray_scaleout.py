"""Scale out on Ray: the node dimension from spec to report, on a real local Ray cluster.

The end-to-end test forms a real two-node cluster on this machine through
``--dry-run`` (the path a cloud sweep takes, with subprocesses for SSH): Ray
starts slowly on a shared 2-core machine (~30 s), so one sweep serves every
check of the cluster path.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest
from rich.console import Console

from orchestrator.catalog.machines import lookup
from orchestrator.engine.ray_cluster import (
    WORKER_PORTS_BASE,
    ClusterPlan,
    node_address,
    plan_cluster,
    start_command,
    stop_command,
)
from orchestrator.engine.sweep import run_sweep
from orchestrator.errors import UsageError
from orchestrator.plan.planner import make_plan
from orchestrator.providers.base import Instance
from orchestrator.spec.config import build_spec
from orchestrator.spec.spec import SweepSpec
from tests.fixtures.once import built_once


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_nodes_multiply_the_trials_keep_ids_unique_and_price_every_node() -> None:
    machine = lookup("n2-highcpu-4")
    one = make_plan(SweepSpec(machines=[machine.name], workers=[1, 2], workload="sleep",
                              repeats=2), "s1", [machine])
    two = make_plan(SweepSpec(machines=[machine.name], workers=[1, 2], workload="sleep",
                              nodes=[1, 2, 4], repeats=2), "s1", [machine])
    vm = two.vms[0]
    ids = [t.trial_id for t in vm.trials]
    assert len(ids) == len(set(ids)) == 3 * 2 * 2
    assert {t.trial_id for t in one.vms[0].trials} <= set(ids)  # one node: ids as before
    assert "n2-highcpu-4-n4-w2-r1" in ids
    assert vm.nodes == 4 and vm.node_name(3).endswith("-n3") and vm.node_name(0) == vm.name
    assert vm.estimate.price_per_hour == pytest.approx(4 * machine.price(False))
    four = [t for t in vm.trials if t.nodes == 4]
    assert all(t.request.ray_nodes == 4 and t.request.argv()[-2:] == ["--ray-nodes", "4"]
               for t in four)
    assert all("--ray-nodes" not in t.request.argv() for t in vm.trials if t.nodes == 1)


def test_nodes_are_read_from_the_command_line_and_toml_and_bad_ones_are_one_line(
        tmp_path: Path) -> None:
    base = {"machines": ["n2-highcpu-4"], "workload": "sleep", "out": str(tmp_path)}
    assert build_spec({**base, "nodes": "1,2,4"}).nodes == [1, 2, 4]
    config = tmp_path / "sweep.toml"
    config.write_text('machines = ["n2-highcpu-4"]\nworkload = "sleep"\nnodes = [1, 2]\n')
    assert build_spec({}, config).nodes == [1, 2]
    with pytest.raises(UsageError, match="node counts must be 1 or more"):
        build_spec({**base, "nodes": "0,2"})
    with pytest.raises(UsageError, match="--adaptive"):
        build_spec({**base, "nodes": "1,2", "adaptive": True})


def test_nodes_above_one_without_ray_is_one_line_and_exit_2_before_anything_runs(
        tmp_path: Path) -> None:
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['cloudprof', 'sweep', "
            "'--machine', 'n2-highcpu-4', '--workload', 'sleep', '--nodes', '1,2', "
            f"'--dry-run', '--out', {str(tmp_path / 'runs')!r}]\n"
            "from orchestrator.cli import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["error: --nodes 2 needs Ray: pip install 'cloudprof[ray]'"]
    assert not (tmp_path / "runs").exists()


def test_cluster_commands_pin_each_node_and_keep_nodes_on_one_host_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUDPROF_SSH_ENDPOINT", raising=False)
    plan = plan_cluster("20260101-000000-abcd", "m", "10.0.0.5", "gcp", True)
    assert plan.head_address == "10.0.0.5:6379"
    # every "VM" sent to one loopback sshd (the tests): a shared host, so not Ray's default
    monkeypatch.setenv("CLOUDPROF_SSH_ENDPOINT", "127.0.0.1:2222")
    assert plan_cluster("20260101-000000-abcd", "m", "127.0.0.1", "gcp", True).port != 6379
    monkeypatch.delenv("CLOUDPROF_SSH_ENDPOINT")
    shared = plan_cluster("20260101-000000-abcd", "m", "127.0.0.1", "local", False)
    assert shared.port != 6379 and shared.local
    head = start_command("/venv/bin/ray", shared, 0)
    worker = start_command("/venv/bin/ray", shared, 1)
    assert "--head" in head and f"--address={shared.head_address}" in worker
    assert '--resources={"cloudprof_node_1": 1}' in worker
    assert f"--min-worker-port={WORKER_PORTS_BASE}" in head
    assert f"--min-worker-port={WORKER_PORTS_BASE + 400}" in worker
    assert all(f"--temp-dir={shared.temp_dir}" in argv for argv in (head, worker))
    assert all("--include-log-monitor=false" in argv for argv in (head, worker))
    assert len(shared.temp_dir) < 30  # Ray's socket paths below it must stay under 108 bytes
    assert stop_command("/venv/bin/python", shared)[-2:] == ["stop", shared.temp_dir]
    inst = Instance(provider="aws", id="i-1", name="n", machine="m", address="3.3.3.3",
                    private_address="10.0.0.7")
    assert node_address(inst, "aws") == "10.0.0.7"
    assert isinstance(plan, ClusterPlan)


NODE_RUN = """
import json, sys, time
from workloads.ray_trial import _NodeRun
run = _NodeRun("memory-steady", {"mb": sys.argv[1], "unit_ms": "5"}, None, 20.0)
run.prepare()
run.start(1)
time.sleep(1.0)
print(json.dumps(run.finish()))
"""


def _node_run(mib: int, env: dict[str, str], cgroup: object = None) -> dict:
    """One node's actor logic (``_NodeRun``) without Ray, in a process of its own: this
    test process stands in for its raylet (the parent whose tree the agent samples)."""
    proc = subprocess.run([sys.executable, "-c", NODE_RUN, str(mib)], capture_output=True,
                          text=True, timeout=120, env=env,
                          preexec_fn=getattr(cgroup, "join_in_child", None))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_node_in_its_cgroup_reports_the_kernels_peak_with_the_sampled_one_beside_it(
        ) -> None:
    from workloads.cgroup import CgroupUnavailable, TrialCgroup
    from workloads.protocol import NODE_KEYS

    env = {k: v for k, v in os.environ.items() if k != "CLOUDPROF_NO_CGROUP"}
    try:
        cgroup = TrialCgroup.create(f"cloudprof-node-unit-{os.getpid()}")
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup here: {exc}")
    try:
        node = _node_run(150, env, cgroup)
    finally:
        assert cgroup.remove() is None
    assert set(node) == set(NODE_KEYS) - {"node", "hostname", "node_params"}
    assert node["peak_rss_source"] == cgroup.version and node["peak_rss_scope"] == "trial"
    assert node["cgroup"] == str(cgroup.path) and node["peak_rss_note"] is None
    assert node["peak_rss_bytes"] >= 150 * 2**20  # the block, held from prepare() on
    assert node["peak_rss_upper_bound_bytes"] >= node["peak_rss_sampled_bytes"] > 0
    assert node["agent"]["samples"] >= 5 and node["units"] > 0
    assert len(node["samples"]) == node["agent"]["samples"]
    assert node["samples"][-1][3] == node["units"]  # the sampler recorded the node's units


def test_a_node_without_a_cgroup_reports_its_sampled_peak_and_says_why() -> None:
    node = _node_run(20, {**os.environ, "CLOUDPROF_NO_CGROUP": "1"})
    assert node["peak_rss_source"] == "sampled_tree" and node["cgroup"] is None
    assert node["peak_rss_bytes"] == node["peak_rss_sampled_bytes"] > 0
    assert node["peak_rss_note"] == "CLOUDPROF_NO_CGROUP is set"


def test_the_clusters_totals_add_up_its_nodes_and_name_every_peak_source() -> None:
    from workloads.ray_trial import cluster_totals

    nodes = [{"units": 10, "units_per_s": 5.0, "peak_rss_bytes": 300,
              "peak_rss_source": "cgroup-v1", "cpu_seconds": 1.5},
             {"units": 30, "units_per_s": 15.0, "peak_rss_bytes": 900,
              "peak_rss_source": "sampled_tree", "cpu_seconds": 0.5}]
    assert cluster_totals(nodes) == {
        "nodes": 2, "units": 40, "units_per_s": 20.0, "peak_rss_bytes_sum": 1200,
        "peak_rss_bytes_max_node": 900, "peak_rss_sources": ["cgroup-v1", "sampled_tree"],
        "cpu_seconds": 2.0}


def _node_cgroups_left(temp_dir: str, nodes: int = 2) -> list[str]:
    """The nodes' memory cgroups of the cluster under ``temp_dir`` still on this host."""
    from workloads.cgroup import CgroupUnavailable, node_cgroup_name, own_memory_cgroup

    try:
        _version, parent = own_memory_cgroup(Path("/proc/self/cgroup").read_text(),
                                             Path("/proc/self/mountinfo").read_text())
    except CgroupUnavailable:
        return []
    names = [node_cgroup_name(temp_dir, i) for i in range(nodes)]
    return [name for name in names if (parent / name).exists()]


def _cluster_processes(temp_dir: str) -> list[int]:
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(temp_dir in part for part in cmdline):
            out.append(proc.pid)
    return out


def _ray_temp_dirs() -> list[str]:
    """The cloudprof Ray temp dirs that running processes name (another test's too)."""
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        for part in proc.info["cmdline"] or []:
            found.update(re.findall(r"/tmp/cpray-[0-9a-f]+", part))
    return sorted(found)


HOLD_MIB = 800  # what node 1 (only) holds in the shared sweep: an unbalanced cluster
HOLDING = "tests.fixtures.ray_workloads:SleepHoldingOnOneNode"


@pytest.fixture(scope="module")
def two_node_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One --dry-run sweep of a sleep-bound workload at 1 and 2 nodes (a real Ray cluster),
    where node 1 alone holds HOLD_MIB MiB for the whole trial. Built once for the session's
    workers (its tests only read the store)."""
    with built_once(tmp_path_factory, "ray-two-node-sweep") as (out, build):
        if build:
            spec = SweepSpec(machines=["n2-highcpu-4"], workers=[2], nodes=[1, 2],
                             workload=HOLDING,
                             workload_params={"unit_ms": "10", "hold_mib": str(HOLD_MIB)},
                             duration_s=3.0, repeats=1, dry_run=True, provider="local",
                             out=out)
            with pytest.MonkeyPatch.context() as env:
                # A host where Ray has a token (anyone's who ran ray.init() on Ray >= 2.59):
                # Ray's head alone would turn token auth on and refuse node 1.
                env.setenv("RAY_AUTH_TOKEN", "a" * 64)
                run_sweep(spec, console=quiet())
        (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
        return run_dir


@pytest.mark.slow
def test_a_sleep_bound_workload_runs_about_twice_as_fast_on_two_nodes(
        two_node_sweep: Path) -> None:
    frame = pd.read_parquet(two_node_sweep / "trials.parquet").set_index("nodes")
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    ratio = frame.loc[2, "units_per_s"] / frame.loc[1, "units_per_s"]
    assert 1.6 <= ratio <= 2.4
    assert 0.8 <= frame.loc[2, "scaleout_efficiency"] <= 1.2
    # two VMs bill: the 2-node trial's price is twice the 1-node trial's
    assert frame.loc[2, "price_per_hour"] == pytest.approx(2 * frame.loc[1, "price_per_hour"])
    peaks = json.loads(frame.loc[2, "node_peak_rss_bytes"])
    assert len(peaks) == 2 and all(p > 10 * 2**20 for p in peaks)


@pytest.mark.slow
def test_every_node_reports_its_own_rate_memory_and_cpu_and_the_cluster_its_totals(
        two_node_sweep: Path) -> None:
    sweep = json.loads((two_node_sweep / "sweep.json").read_text())
    head = next(v for v in sweep["vms"].values() if "ray" in v)
    assert head["ray"]["nodes"] == 2 and head["ray"]["start_s"] > 0
    node_vms = head["ray"]["node_vms"]
    assert all(sweep["vms"][name]["state"] == "released" for name in node_vms)
    frame = pd.read_parquet(two_node_sweep / "trials.parquet")
    rates = json.loads(frame[frame["nodes"] == 2]["node_units_per_s"].iloc[0])
    assert len(rates) == 2 and min(rates) > 0.3 * max(rates)
    assert abs(sum(rates) - frame[frame["nodes"] == 2]["units_per_s"].iloc[0]) \
        < 0.25 * sum(rates)


def _per_node(sweep: Path, column: str, nodes: int = 2) -> list:
    frame = pd.read_parquet(sweep / "trials.parquet")
    return json.loads(frame[frame["nodes"] == nodes][column].iloc[0])


@pytest.mark.slow
def test_each_node_peaks_in_its_own_cgroup_so_the_node_that_holds_memory_stands_out(
        two_node_sweep: Path) -> None:
    assert _per_node(two_node_sweep, "node_peak_rss_source") == ["cgroup-v1", "cgroup-v1"]
    node0, node1 = _per_node(two_node_sweep, "node_peak_rss_bytes")
    assert node1 >= HOLD_MIB * 2**20  # the kernel saw the whole block on node 1
    assert node1 - node0 >= HOLD_MIB * 2**20 / 2, (node0, node1)  # and node 0 well below
    # The sampled tree agrees (its RSS sum counts pages the processes share, such as the
    # object store, once per process: the cgroup counts each page once).
    sampled0, sampled1 = _per_node(two_node_sweep, "node_peak_rss_sampled_bytes")
    assert sampled1 - sampled0 >= HOLD_MIB * 2**20 / 2


@pytest.mark.slow
def test_the_nodes_memory_cgroups_are_gone_after_the_sweep(two_node_sweep: Path) -> None:
    sweep = json.loads((two_node_sweep / "sweep.json").read_text())
    head = next(v for v in sweep["vms"].values() if "ray" in v)
    assert _node_cgroups_left(head["ray"]["temp_dir"]) == []
    assert head["ray"]["notes"] == []  # every node had its cgroup: nothing to say


@pytest.mark.slow
def test_without_cgroups_a_node_says_its_peak_is_sampled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDPROF_NO_CGROUP", "1")
    spec = SweepSpec(machines=["n2-highcpu-4"], workers=[1], nodes=[2], workload="sleep",
                     duration_s=1.0, repeats=1, dry_run=True, provider="local",
                     out=tmp_path)
    sweep = run_sweep(spec, console=quiet())
    frame = pd.read_parquet(sweep / "trials.parquet")
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    assert _per_node(sweep, "node_peak_rss_source") == ["sampled_tree", "sampled_tree"]
    assert _per_node(sweep, "node_peak_rss_bytes") == \
        _per_node(sweep, "node_peak_rss_sampled_bytes")
    head = next(v for v in json.loads((sweep / "sweep.json").read_text())["vms"].values()
                if "ray" in v)
    assert sorted(head["ray"]["notes"]) == [
        f"note: node {i} has no memory cgroup (CLOUDPROF_NO_CGROUP is set): its peaks are "
        "sampled" for i in range(2)]


@pytest.mark.slow
def test_no_ray_process_of_the_sweep_outlives_it(two_node_sweep: Path) -> None:
    sweep = json.loads((two_node_sweep / "sweep.json").read_text())
    head = next(v for v in sweep["vms"].values() if "ray" in v)
    port = head["ray"]["address"].rsplit(":", 1)[1]
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if any(f"--gcs_server_port={port}" in part or f"--port={port}" in part
                   for part in (p.info["cmdline"] or []))]
    assert left == []
    assert os.path.isdir(two_node_sweep)
    assert head["ray"]["temp_dir"].startswith("/tmp/cpray-")
    assert not os.path.exists(head["ray"]["temp_dir"])  # its logs and sockets went too


@pytest.mark.slow
def test_the_report_shows_scale_up_and_scale_out_side_by_side_with_per_node_memory(
        two_node_sweep: Path) -> None:
    from orchestrator.results.report.json_doc import report_document
    from orchestrator.results.report.model import load_run, summarise

    run = load_run(two_node_sweep)
    rows = report_document(run)["scale_out"]
    assert [(r["nodes"], r["workers"]) for r in rows] == [(1, 2), (2, 2)]
    two = rows[1]
    assert len(two["node_peaks"]) == 2
    assert two["imbalance"] >= 1.5  # node 1 holds HOLD_MIB more: the unbalanced node shows
    assert two["node_peak_source"] == "cgroup-v1"
    assert two["cost_per_million_units"] > 0
    assert list(summarise(run.trials)["workers"]) == [2]  # scale-up tables: one VM only
    html = (two_node_sweep / "report.html").read_text()
    assert "Scale out: throughput, cost and memory per node count" in html
    assert "peak RSS per node" in html
    # a hyphenated cell is kept on one line by a span (html.py)
    assert re.search(r'<td>(<span class="nw">)?cgroup-v1(</span>)?</td>', html)


def test_a_command_job_on_a_cluster_runs_as_the_driver_with_ray_address_set(
        tmp_path: Path) -> None:
    out = tmp_path / "trial"
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--command", "--job", "--ray-nodes", "2",
         "--ray-address", "10.1.2.3:6379", "--out", str(out), "--", sys.executable, "-c",
         "import os; print('address', os.environ['RAY_ADDRESS'])"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "address 10.1.2.3:6379" in (out / "output.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params"]["ray"] == {"nodes": 2, "address": "10.1.2.3:6379"}


def test_a_ray_trial_without_an_address_is_one_usage_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--workload", "sleep", "--ray-nodes", "2",
         "--duration", "1", "--out", str(tmp_path / "t")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "error: --ray-nodes needs --ray-address HOST:PORT"


@pytest.mark.slow
def test_ctrl_c_while_the_cluster_starts_leaves_no_ray_process_behind(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "sweep", "--dry-run", "--machine",
         "n2-highcpu-4", "--workload", "sleep", "--nodes", "2", "--workers", "1", "--repeats", "1",
         "--duration", "30", "--out", str(out)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    temp_dir = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and temp_dir is None:
            time.sleep(0.2)
            for sweep_json in out.glob("*/sweep.json"):
                data = json.loads(sweep_json.read_text() or "{}")
                if any(v.get("node_of") and v.get("state") == "ready"
                       for v in (data.get("vms") or {}).values()):
                    temp_dir = plan_cluster(data["sweep_id"], "n2-highcpu-4", "127.0.0.1",
                                            "local", False).temp_dir
        assert temp_dir is not None, "the second node never became ready"
        # until `ray start` runs on the head, the cluster's first process (a fixed 3 s
        # wait could end before it, or after it, on a loaded machine)
        while not _cluster_processes(temp_dir) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _cluster_processes(temp_dir):  # why, rather than a wait to the deadline
            proc.kill()
            pytest.fail(f"ray start never ran under {temp_dir} (Ray's temp dirs running: "
                        f"{_ray_temp_dirs()}); the sweep said:\n{proc.communicate()[1][-3000:]}")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert _cluster_processes(temp_dir) == []
    assert _node_cgroups_left(temp_dir) == []
