"""One trial on a Ray cluster: the workload runs as one actor per node, W threads in each.

``python -m workloads.run --ray-nodes N --ray-address HOST:PORT`` wraps the workload
class it was asked for (the cube, a synthetic one, a user's ``module:Class``) in
:class:`RayWorkload`, which is itself a :class:`~workloads.base.Workload`: the
runner's warm-up, agent, duration and result files stay exactly as for one VM.
Each actor builds its own instance of the workload from its node's own copy of
the inputs (``--ray-node-param``) and runs the existing strategies inside; the
driver sums the actors' unit counts into the trial's counter a few times a
second, so the time series shows the cluster's units live.

Every node is pinned by a custom resource, ``cloudprof_node_<i>``, that the
engine gives its ``ray start``: actor i runs on node i, so "a trial at n nodes
uses the first n nodes" holds exactly. While it runs, each actor runs the
profiling agent's sampler process over its node's Ray processes as a tree (its
raylet and every descendant: the worker processes) for the per-node time series,
CPU and peak memory in summary.json — the peak from the node's memory cgroup
(the kernel's high-water mark) where ``ray start`` could be put in one.

``import ray`` happens only here and only when a trial asks for nodes: the data
plane's required dependencies stay numpy, pyarrow and psutil.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from workloads.base import UnitCounter, Workload, WorkloadInputError, load_workload

NODE_RESOURCE = "cloudprof_node_{}"  # the custom resource that pins actor i to node i
POLL_S = 0.2  # how often the driver sums the actors' units (the agent samples the sum)
CONNECT_TIMEOUT_S = 60.0  # nodes that joined the cluster are listed within this


def node_resource(index: int) -> str:
    return NODE_RESOURCE.format(index)


class _NodeRun:
    """What runs inside one actor: the workload on this node, under the node's agent.

    The agent is the runner's own (``workloads.agent.Agent``): a sampler *process*,
    one per run, started by this actor ahead of the run (in ``prepare``, then after
    each run: a Python start-up must not delay one node's work), that samples the
    node's Ray processes as a tree — the raylet (this actor's parent) and its
    descendants, the worker processes — from /proc, so that no sampling code runs
    in this process or takes its GIL from the workload's threads. Started here
    rather than beside ``ray start`` because the actor is what knows when a trial
    begins and ends, and its parent is the raylet: no pid has to be found or passed
    between processes.

    The node's peak comes from the kernel where it can: the memory cgroup its
    ``ray start`` ran in (``start_node``), whose high-water mark is reset when the
    trial starts. The sampled peak of the tree and the sum of its processes' own
    peaks (an upper bound: they need not coincide) stay beside it.
    """

    def __init__(self, target: str, params: dict[str, str], chdir: str | None,
                 sample_hz: float) -> None:
        if chdir:  # a user's job copy on this node: importable, and the working directory
            sys.path.insert(0, chdir)
            os.chdir(chdir)
        self.workload = load_workload(target)(**params)
        self.sample_hz = sample_hz
        self.counter = UnitCounter()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.agent: Any = None  # workloads.agent.Agent while a run is timed
        # the next run's (agent, counter), its sampler process already started
        self.next_agent: tuple[Any, UnitCounter] | None = None
        self.spawner: threading.Thread | None = None  # starting it after a run, off its clock
        self.window: Any = None  # workloads.cgroup.PeakWindow: the node's kernel peak
        self.cgroup_note: str | None = None  # why the node's peak is sampled
        self.error: str | None = None
        self.t0 = 0.0

    def prepare(self) -> dict[str, Any]:
        self.workload.prepare()
        self.next_agent = self._agent()  # untimed: the first run starts at once
        import platform

        import ray

        # Inside the actor Ray is connected. Outside one (a test running the node's logic
        # alone) asking for the runtime context would start a local Ray instance, ~15 s.
        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"unit": self.workload.unit, "describe": self.workload.describe(),
                "hostname": platform.node(), "pid": os.getpid(), "node_id": node_id}

    def _agent(self) -> tuple[Any, UnitCounter]:
        """A new agent over the node's Ray tree, its sampler process started (the run that
        uses it does not wait for a Python start-up while the other nodes work), and the
        counter it records with every sample. gpu=False: a node's tree is profiled for
        memory and CPU; NVML need not start on every node."""
        from workloads.agent import Agent

        counter = UnitCounter()
        return Agent(os.getppid(), include_children=True, sample_hz=self.sample_hz,
                     units=counter, gpu=False).spawn(), counter

    def _agent_ahead(self) -> None:
        """The next run's agent, started in the background: a run (a warm-up's) has just
        ended, and the driver's clock runs until this actor's ``finish`` returns."""
        def spawn() -> None:
            self.next_agent = self._agent()

        self.spawner = threading.Thread(target=spawn, name="agent-ahead", daemon=True)
        self.spawner.start()

    def start(self, workers: int) -> None:
        if self.spawner is not None:
            self.spawner.join()
        (self.agent, self.counter), self.next_agent = self.next_agent or self._agent(), None
        self.stop_event = threading.Event()
        self.error = None
        self.window, self.cgroup_note = _open_peak_window()
        if self.window is not None:
            self.window.reset()
        self.agent.start()
        self.t0 = time.monotonic()

        def run() -> None:
            try:
                self.workload.run(workers, self.stop_event, self.counter)
            except BaseException as exc:  # reported to the driver, which fails the trial
                self.error = f"{type(exc).__name__}: {exc}"
                self.stop_event.set()

        self.thread = threading.Thread(target=run, name="workload", daemon=True)
        self.thread.start()

    def units(self) -> tuple[int, str | None]:
        return self.counter.value, self.error

    def finish(self) -> dict[str, Any]:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()
        seconds = time.monotonic() - self.t0
        kernel_peak = self.window.read() if self.window is not None else None
        rep = self.agent.stop()
        processes = 1 + len(_descendants(os.getppid()))
        if self.window is not None:
            self.window.close()
        units = self.counter.value
        self._agent_ahead()  # a warm-up's run is followed by the timed one
        return {
            "units": units,
            "seconds": round(seconds, 6),
            "units_per_s": units / seconds if seconds > 0 else 0.0,
            **node_peak(rep.peak_rss_sampled_bytes, rep.peak_rss_upper_bound_bytes,
                        kernel_peak, self.window, self.cgroup_note),
            "processes": processes,
            "cgroup": str(self.window.path) if self.window is not None else None,
            **_cpu(rep.column("cpu_user_s"), rep.column("cpu_system_s"), seconds),
            "agent": rep.agent_summary(),
            # the node's time series: [t, tree RSS bytes, tree CPU seconds, units]
            "samples": [[round(r[0], 4), r[1], round(r[2] + r[3], 4), r[11]]
                        for r in rep.rows],
            "error": self.error,
        }


def _open_peak_window() -> tuple[Any, str | None]:
    """The node's cgroup peak window, or None and the one-line reason there is none."""
    from workloads.cgroup import CgroupUnavailable, PeakWindow, this_node_cgroup

    try:
        version, path = this_node_cgroup()
        return PeakWindow(version, path), None
    except CgroupUnavailable as exc:  # the reason ``ray start`` met, where it said one
        return None, os.environ.get(CGROUP_NOTE_ENV) or str(exc)
    except OSError as exc:
        return None, f"cannot read the node's memory cgroup: {exc.strerror or exc}"


def node_peak(sampled: int, upper: int | None, kernel: int | None, window: Any,
              note: str | None) -> dict[str, Any]:
    """A node's peak memory and where it comes from: the kernel's high-water mark of the
    node's cgroup where there is one (``scope``: since the trial began, or since the
    node started where the kernel cannot reset it), else the sampled tree's maximum."""
    if kernel is not None and window is not None:
        peak, source, scope = kernel, window.version, window.scope
    else:
        peak, source, scope = sampled, "sampled_tree", "trial"
    return {
        "peak_rss_bytes": peak,
        "peak_rss_source": source,  # cgroup-v1 | cgroup-v2 | sampled_tree (protocol's names)
        "peak_rss_scope": scope,
        "peak_rss_sampled_bytes": sampled,
        # the tree's processes' own kernel peaks added up: an upper bound of the tree's
        # (each may have peaked at another time, and the raylet's is its lifetime's)
        "peak_rss_upper_bound_bytes": upper,
        "peak_rss_note": note if source == "sampled_tree" else None,
    }


def _cpu(user: list[float], system: list[float], seconds: float) -> dict[str, Any]:
    """CPU the node's tree used during the run (the sampled counters' difference)."""
    if len(user) < 2:
        return {"cpu_seconds": None, "cpu_percent_mean": None}
    used = (user[-1] + system[-1]) - (user[0] + system[0])
    return {"cpu_seconds": round(used, 3),
            "cpu_percent_mean": round(100.0 * used / seconds, 2) if seconds > 0 else None}


def _descendants(pid: int) -> list[int]:
    from workloads.procfs import descendants

    return descendants(pid)


class RayWorkload(Workload):
    """The workload ``target`` as one actor per node of a running Ray cluster."""

    name = "ray"

    def __init__(self, target: str, params: dict[str, str], *, nodes: int, address: str,
                 node_params: dict[int, dict[str, str]] | None = None,
                 node_chdirs: dict[int, str] | None = None, sample_hz: float = 10.0) -> None:
        super().__init__(**params)
        cls = load_workload(target)  # fails here, not on the nodes, when it is wrong
        self.unit = cls.unit  # type: ignore[misc]
        self.target, self.nodes, self.address = target, nodes, address
        self.node_params = node_params or {}
        self.node_chdirs = node_chdirs or {}
        self.sample_hz = sample_hz
        self.actors: list[Any] = []
        self.prepared: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []

    def prepare(self) -> None:
        import ray

        if not ray.is_initialized():
            os.environ.update(RAY_ENV)  # read when ray.init connects
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        self._wait_for_nodes()
        actor = ray.remote(num_cpus=0)(_NodeRun)
        self.actors = [
            actor.options(resources={node_resource(i): 1}).remote(
                self.target, {**self.params, **self.node_params.get(i, {})},
                self.node_chdirs.get(i), self.sample_hz)
            for i in range(self.nodes)
        ]
        self.prepared = _get(ray, [a.prepare.remote() for a in self.actors])
        # The address each node registered (--node-ip-address): the hostname alone does not
        # tell apart two nodes on one machine, nor hosts that share a name.
        addresses = {n.get("NodeID"): n.get("NodeManagerAddress") for n in ray.nodes()}
        for prepared in self.prepared:
            prepared["address"] = addresses.get(prepared.get("node_id"))

    def _wait_for_nodes(self) -> None:
        import ray

        wanted = {node_resource(i) for i in range(self.nodes)}
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            have = {k for n in ray.nodes() if n.get("Alive") for k in n.get("Resources", {})}
            if wanted <= have:
                return
            if time.monotonic() > deadline:
                missing = sorted(wanted - have)
                raise WorkloadInputError(f"the Ray cluster at {self.address} lacks node(s) "
                                         f"{', '.join(missing)}")
            time.sleep(0.5)

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        import ray

        _get(ray, [a.start.remote(workers) for a in self.actors])
        added = 0
        while not stop.wait(POLL_S):
            added = self._add_units(ray, counter, added)
        self.reports = _get(ray, [a.finish.remote() for a in self.actors])
        total = sum(int(r["units"]) for r in self.reports)
        if total > added:
            counter.add(total - added)
        errors = [f"node {i}: {r['error']}" for i, r in enumerate(self.reports) if r["error"]]
        if errors:
            raise RuntimeError("; ".join(errors))

    def _add_units(self, ray: Any, counter: UnitCounter, added: int) -> int:
        states = _get(ray, [a.units.remote() for a in self.actors])
        errors = [f"node {i}: {err}" for i, (_, err) in enumerate(states) if err]
        if errors:
            raise RuntimeError("; ".join(errors))
        total = sum(units for units, _ in states)
        if total > added:
            counter.add(total - added)
        return max(total, added)

    def describe(self) -> dict[str, Any]:
        inner = self.prepared[0]["describe"] if self.prepared else {}
        return {**inner, "ray": {"nodes": self.nodes, "address": self.address,
                                 "actor_hosts": [p["hostname"] for p in self.prepared],
                                 "actor_addresses": [p.get("address") for p in self.prepared]}}

    def node_summaries(self) -> list[dict[str, Any]]:
        """One entry per node (summary.json's ``nodes``), from the last timed run."""
        out = []
        for i, report in enumerate(self.reports):
            prepared = self.prepared[i] if i < len(self.prepared) else {}
            out.append({"node": i, "hostname": prepared.get("hostname"),
                        "address": prepared.get("address"),
                        "node_params": self.node_params.get(i, {}),  # its own inputs' path
                        **report})
        return out


def cluster_totals(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The cluster's figures from its nodes' (summary.json's ``cluster``). The sum of the
    nodes' peaks is what the cluster must hold at most (the nodes need not peak together);
    the largest node's peak is what each VM of it must hold."""
    peaks = [n["peak_rss_bytes"] for n in nodes if n.get("peak_rss_bytes") is not None]
    cpu = [n["cpu_seconds"] for n in nodes if n.get("cpu_seconds") is not None]
    return {
        "nodes": len(nodes),
        "units": sum(int(n.get("units") or 0) for n in nodes),
        "units_per_s": sum(float(n.get("units_per_s") or 0.0) for n in nodes),
        "peak_rss_bytes_sum": sum(peaks) if peaks else None,
        "peak_rss_bytes_max_node": max(peaks) if peaks else None,
        "peak_rss_sources": sorted({str(n.get("peak_rss_source")) for n in nodes
                                    if n.get("peak_rss_source")}),
        "cpu_seconds": round(sum(cpu), 3) if cpu else None,
    }


def _get(ray: Any, refs: list[Any]) -> list[Any]:
    """``ray.get``, with an actor's own error as one line (the runner prints one line)."""
    try:
        return list(ray.get(refs))
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, WorkloadInputError):
            raise WorkloadInputError(str(cause)) from None
        raise RuntimeError(f"on a Ray node: {type(cause).__name__}: {cause}") from None


# The head's GCS server and its autoscaler monitor go last, and are killed: signalled with
# the rest (Ray 2.60, measured), the GCS and its monitor were still running 8 s later, and
# the raylets, whose shutdown waits on a GCS that is itself shutting down, 5 s later, so
# every stop waited out the whole grace period. The GCS holds only this cluster's state,
# in memory; the raylets and agents, signalled alone, shut down cleanly in about a second.
_KILLED_LAST = ("gcs_server", "autoscaler/_private/monitor.py")


def stop_cluster_processes(temp_dir: str, grace_s: float = 5.0) -> int:
    """Stop this user's processes of the Ray cluster under ``temp_dir`` (``ray start`` was
    given it on every node): SIGTERM, then SIGKILL after ``grace_s`` (the GCS and its
    monitor as soon as the rest has gone, see ``_KILLED_LAST``). Unlike ``ray stop``, the
    user's other Ray clusters on a shared host live on. Returns how many were found."""
    import psutil

    me, uid = os.getpid(), os.getuid()
    found = []
    for proc in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.pid != me and proc.info["uids"].real == uid and not any(
                    "workloads.ray_trial" in part for part in cmdline) and any(
                    temp_dir in part for part in cmdline):
                found.append(proc)
        except (psutil.Error, AttributeError, TypeError):
            continue
    victims = []  # the raylets' and GCS's worker processes die with them: take them too
    for proc in found:
        try:
            victims += [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
    last, rest = [], []
    for proc in victims:
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        (last if any(name in cmdline for name in _KILLED_LAST) else rest).append(proc)
    for proc in rest:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _gone, alive = psutil.wait_procs(rest, timeout=grace_s)
    killed = [*alive, *last]
    for proc in killed:
        try:
            proc.kill()
        except psutil.Error:
            continue
    return len(found)


# Every process of a sweep's cluster (the nodes' daemons, the driver, a --command job) runs
# with Ray's token authentication off, explicitly: since Ray 2.59 `ray start --head` turns it
# on by itself when the host has a token (~/.ray/auth_token, which any local `ray.init()`
# writes), while `ray start --address` does not, so on such a host node 1 was refused by its
# own head ("InvalidAuthToken"). Off is what `ray start --head` gives on a host without a
# token; the cluster's ports are open only between the sweep's own VMs
# (docs/tutorials/scale-out.md).
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}
# A node's raylet starts no idle Python workers ahead of need (by default one per CPU when
# the driver connects): the trial's actors (num_cpus=0) start their own, and idle workers
# only cost start-up CPU and memory inside the node's cgroup, i.e. in its measured peak.
NODE_ENV = {"RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}
CGROUP_MARK = "cloudprof-node-{}.cgroup"  # in the cluster's temp dir: where node i's cgroup is
CGROUP_NOTE_ENV = "CLOUDPROF_NODE_CGROUP_NOTE"  # why a node has no cgroup (its actors read it)


def start_node(temp_dir: str, index: int, argv: list[str]) -> int:
    """Run ``ray start ARGV`` for node ``index`` inside a memory cgroup of its own (where one
    can be made), with its output in a file: the daemons it leaves behind inherit both —
    the cgroup, whose high-water mark is then the node's exact peak (the trial's actors read
    it, ``workloads.cgroup.PeakWindow``), and the file, not the caller's pipe (an SSH
    session or the engine's subprocess would otherwise wait for them to exit).

    The cgroup's path is written to the temp dir before Ray starts, so that ``stop`` finds
    and removes it even when this command is cut short. Where none can be made (not root,
    a v2 parent without the memory controller delegated, ``CLOUDPROF_NO_CGROUP=1``) the node
    starts anyway and its peaks are sampled; a line starting "note:" says why. Prints the
    output's tail; returns ray's exit code."""
    import subprocess
    import tempfile

    from workloads.cgroup import CgroupUnavailable, TrialCgroup, node_cgroup_name

    env = {**os.environ, **RAY_ENV, **NODE_ENV}
    cgroup: TrialCgroup | None = None
    note = None
    try:
        cgroup = TrialCgroup.create(node_cgroup_name(temp_dir, index))
        os.makedirs(temp_dir, exist_ok=True)
        with open(os.path.join(temp_dir, CGROUP_MARK.format(index)), "w") as mark:
            mark.write(str(cgroup.path))
    except CgroupUnavailable as exc:
        env[CGROUP_NOTE_ENV] = str(exc)
        note = f"note: node {index} has no memory cgroup ({exc}): its peaks are sampled"
    try:
        with tempfile.TemporaryFile("w+") as log:
            code = subprocess.call(argv, stdin=subprocess.DEVNULL, stdout=log, env=env,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=cgroup.join_in_child if cgroup else None)
            log.seek(0)
            tail = log.read().strip().splitlines()[-15:]
    finally:
        if cgroup is not None:
            os.close(cgroup.join_fd)  # the cgroup stays: the node's daemons live in it
    if note:  # first: a failed start's last line is Ray's error, the one the engine shows
        print(note, flush=True)
    print("\n".join(tail), file=sys.stderr if code else sys.stdout)
    return code


def remove_node_cgroups(temp_dir: str) -> list[str]:
    """Remove the memory cgroups of the cluster's nodes on this host (what is still in one
    is killed first); the one-line problems of those that stay."""
    from pathlib import Path

    from workloads.cgroup import remove_cgroup

    problems = []
    for mark in sorted(Path(temp_dir).glob(CGROUP_MARK.format("*"))):
        try:
            path = Path(mark.read_text().strip())
        except OSError:
            continue
        if path.name.startswith("cloudprof-node-"):  # never anything the mark did not make
            problem = remove_cgroup(path)
            if problem:
                problems.append(problem)
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m workloads.ray_trial stop TEMP_DIR`` / ``start TEMP_DIR INDEX RAY ARGS...``:
    what the engine runs on every node (orchestrator.engine.ray_cluster builds the
    arguments)."""
    args = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m workloads.ray_trial stop /tmp/<cluster temp dir> | "
             "start /tmp/<cluster temp dir> NODE-INDEX RAY START-ARGS...")
    if len(args) > 3 and args[0] == "start" and args[1].startswith("/tmp/") \
            and args[2].isdigit():
        return start_node(args[1], int(args[2]), args[3:])
    if len(args) != 2 or args[0] != "stop" or not args[1].startswith("/tmp/"):
        print(usage, file=sys.stderr)
        return 2
    count = stop_cluster_processes(args[1])
    problems = remove_node_cgroups(args[1])  # after the processes: an empty cgroup goes at once
    # Its logs and sockets too: on a shared host (local, ssh) nothing of the sweep stays.
    import shutil

    shutil.rmtree(args[1], ignore_errors=True)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"stopped {count} Ray process(es) of {args[1]} and removed it")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
