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
uses the first n nodes" holds exactly. While it runs, each actor samples its
own node's Ray processes as a tree (its raylet and every descendant: the worker
processes) for the per-node time series, peak memory and CPU in summary.json.

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
    """What runs inside one actor: the workload on this node, and a sampler of its Ray tree."""

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
        self.sampler: threading.Thread | None = None
        self.error: str | None = None
        self.samples: list[list[float]] = []  # [t, tree rss bytes, tree cpu seconds, units]
        self.t0 = 0.0

    def prepare(self) -> dict[str, Any]:
        self.workload.prepare()
        import platform

        import ray

        return {"unit": self.workload.unit, "describe": self.workload.describe(),
                "hostname": platform.node(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def start(self, workers: int) -> None:
        self.counter = UnitCounter()
        self.stop_event = threading.Event()
        self.samples = []
        self.t0 = time.monotonic()

        def run() -> None:
            try:
                self.workload.run(workers, self.stop_event, self.counter)
            except BaseException as exc:  # reported to the driver, which fails the trial
                self.error = f"{type(exc).__name__}: {exc}"
                self.stop_event.set()

        self.thread = threading.Thread(target=run, name="workload", daemon=True)
        self.thread.start()
        if self.sample_hz > 0:
            self.sampler = threading.Thread(target=self._sample, name="node-sampler",
                                            daemon=True)
            self.sampler.start()

    def units(self) -> tuple[int, str | None]:
        return self.counter.value, self.error

    def finish(self) -> dict[str, Any]:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()
        if self.sampler is not None:
            self.sampler.join()
        seconds = time.monotonic() - self.t0
        tree = _ray_tree()
        rss = [s[1] for s in self.samples]
        hwm = _tree_hwm(tree)
        cpu = self.samples[-1][2] - self.samples[0][2] if len(self.samples) > 1 else None
        return {
            "units": self.counter.value,
            "seconds": round(seconds, 6),
            "units_per_s": self.counter.value / seconds if seconds > 0 else 0.0,
            "peak_rss_bytes": max(rss) if rss else None,
            "peak_rss_source": "sampled Ray process tree (raylet and its workers)",
            # The kernel's high-water marks of the tree's processes, added up: an upper
            # bound of the tree's peak (each process may have peaked at another time).
            "peak_rss_hwm_sum_bytes": hwm,
            "processes": len(tree),
            "cpu_seconds": round(cpu, 3) if cpu is not None else None,
            "samples": self.samples,
            "error": self.error,
        }

    def _sample(self) -> None:
        period = 1.0 / self.sample_hz
        tree = _ray_tree()
        next_tree = time.monotonic() + 1.0
        while True:
            now = time.monotonic()
            if now >= next_tree:  # workers come and go: look for them once a second
                tree, next_tree = _ray_tree(), now + 1.0
            rss, cpu = _tree_usage(tree)
            self.samples.append([round(now - self.t0, 4), rss, round(cpu, 4),
                                 self.counter.value])
            if self.stop_event.wait(period):
                rss, cpu = _tree_usage(tree)
                self.samples.append([round(time.monotonic() - self.t0, 4), rss,
                                     round(cpu, 4), self.counter.value])
                return


def _ray_tree() -> list[Any]:
    """This node's Ray processes: the raylet (this actor's parent) and its descendants."""
    import psutil

    try:
        raylet = psutil.Process(os.getppid())
        return [raylet, *raylet.children(recursive=True)]
    except psutil.Error:
        return [psutil.Process()]


def _tree_usage(tree: list[Any]) -> tuple[int, float]:
    import psutil

    rss, cpu = 0, 0.0
    for proc in tree:
        try:
            rss += proc.memory_info().rss
            times = proc.cpu_times()
            cpu += times.user + times.system
        except psutil.Error:
            continue  # a worker that exited since the last listing
    return rss, cpu


def _tree_hwm(tree: list[Any]) -> int | None:
    from workloads.procfs import read_hwm

    marks = [read_hwm(proc.pid) for proc in tree]
    known = [m for m in marks if m is not None]
    return sum(known) if known else None


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
    """The cluster's figures from its nodes' (summary.json's ``cluster``)."""
    peaks = [n["peak_rss_bytes"] for n in nodes if n.get("peak_rss_bytes") is not None]
    cpu = [n["cpu_seconds"] for n in nodes if n.get("cpu_seconds") is not None]
    return {
        "nodes": len(nodes),
        "units": sum(int(n.get("units") or 0) for n in nodes),
        "peak_rss_bytes_sum": sum(peaks) if peaks else None,
        "peak_rss_bytes_max_node": max(peaks) if peaks else None,
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


def stop_cluster_processes(temp_dir: str, grace_s: float = 5.0) -> int:
    """Stop this user's processes of the Ray cluster under ``temp_dir`` (``ray start`` was
    given it on every node): SIGTERM, then SIGKILL after ``grace_s``. Unlike ``ray stop``,
    the user's other Ray clusters on a shared host live on. Returns how many were found."""
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
    for proc in victims:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _gone, alive = psutil.wait_procs(victims, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    return len(found)


def start_node(argv: list[str]) -> int:
    """Run ``ray start ARGV`` with its output in a file: the daemons it leaves behind inherit
    that file, not the caller's pipe (an SSH session or the engine's subprocess would
    otherwise wait for them to exit). Prints the output's tail; returns ray's exit code."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as log:
        code = subprocess.call(argv, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
        log.seek(0)
        tail = log.read().strip().splitlines()[-15:]
    print("\n".join(tail), file=sys.stderr if code else sys.stdout)
    return code


def main(argv: list[str] | None = None) -> int:
    """``python -m workloads.ray_trial stop TEMP_DIR`` / ``start RAY ARGS...``: what the
    engine runs on every node (workloads.ray_cluster builds the arguments)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 and args[0] == "start":
        return start_node(args[1:])
    if len(args) != 2 or args[0] != "stop" or not args[1].startswith("/tmp/"):
        print("usage: python -m workloads.ray_trial stop /tmp/<cluster temp dir> | "
              "start RAY START-ARGS...", file=sys.stderr)
        return 2
    count = stop_cluster_processes(args[1])
    # Its logs and sockets too: on a shared host (local, ssh) nothing of the sweep stays.
    import shutil

    shutil.rmtree(args[1], ignore_errors=True)
    print(f"stopped {count} Ray process(es) of {args[1]} and removed it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
