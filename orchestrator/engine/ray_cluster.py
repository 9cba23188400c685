"""A Ray cluster over a machine's nodes: ``ray start --head`` on node 0, ``--address`` on the rest.

:func:`form_cluster` makes the machine's other nodes ready like its first (each a
host session of its own) and starts the cluster over all of them;
:func:`cluster_request` points a trial at it.

Commands are built here from plain values (pure functions, tested without a
cluster) and run through each node's existing :class:`Executor` — SSH on a
cloud VM or an ssh host, a subprocess for ``--dry-run`` — never a cloud SDK.
``--dry-run --nodes 2`` therefore starts a real two-node cluster on this
machine the same way a cloud sweep does, with distinct ports per node.

Each node gets the custom resource ``cloudprof_node_<i>`` so that the trial's
actor i lands on node i (``workloads.ray_trial``), and every node of one
cluster shares one short ``--temp-dir``: stopping the cluster stops exactly the
processes started for it (``python -m workloads.ray_trial stop``), never the
user's other Ray processes on a shared host.

Each node's ``ray start`` runs inside a memory cgroup of its own where the host
allows one (``workloads.ray_trial start``): the node's peak memory is then the
kernel's high-water mark of all its Ray processes. The cgroups go when the
cluster stops; a node without one says so in :attr:`RayCluster.notes`.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from orchestrator import settings
from orchestrator.errors import RemoteCommandError, UsageError, one_line
from orchestrator.providers.base import CommandResult, Executor, Instance

if TYPE_CHECKING:
    from orchestrator.engine.host_session import HostSession
    from orchestrator.plan.planner import TrialPlan
    from workloads.protocol import TrialRequest

CLOUD_HEAD_PORT = 6379  # Ray's default, on a VM of the sweep's own
LOCAL_PORTS = (20000, 29999)  # shared hosts: a port from the sweep id, clear of Ray's defaults
WORKER_PORTS_BASE = 30000  # node i's worker processes listen on their own range
WORKER_PORTS_PER_NODE = 400
LOCAL_OBJECT_STORE_BYTES = 80_000_000  # nodes sharing this machine: Ray's 30 % of RAM each is
# too much; the trial's actors pass only counters through the object store
START_TIMEOUT_S = 300.0
T = TypeVar("T")


@dataclass
class RayNode:
    """One node of a cluster: how to run commands there and where the others reach it."""

    index: int
    executor: Executor
    address: str  # its own (--node-ip-address); node 0's is the head's


@dataclass
class ClusterPlan:
    """Where the cluster listens and what every node shares."""

    head_address: str  # HOST:PORT, given to --address and to the trial's --ray-address
    port: int
    temp_dir: str
    local: bool  # all nodes on this machine: small object stores


def node_address(inst: Instance, provider: str) -> str:
    """Where the sweep's other nodes reach ``inst``: its private address on a cloud, the
    tests' loopback endpoint when CLOUDPROF_SSH_ENDPOINT redirects a cloud's SSH, the
    hosts file's address of an ssh host (that setting never redirects those), this
    machine for the local provider (whose "address" is a work directory)."""
    if provider == "local":
        return "127.0.0.1"
    endpoint = settings.SSH_ENDPOINT.get() if provider != "ssh" else None
    if endpoint:
        return endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint
    address = inst.private_address or inst.address
    if not address:
        raise UsageError(f"{inst.name} has no address for the other Ray nodes")
    return address


def plan_cluster(sweep_id: str, machine: str, head: str, provider: str,
                 creates_machines: bool) -> ClusterPlan:
    """Ports and temp dir of one machine's cluster: Ray's default port on the sweep's own
    VMs; on shared hosts (local, ssh) one derived from the sweep so that two sweeps (or two
    machines of one sweep) do not meet."""
    digest = int(hashlib.sha256(f"{sweep_id}/{machine}".encode()).hexdigest()[:8], 16)
    low, high = LOCAL_PORTS
    # CLOUDPROF_SSH_ENDPOINT sends every "VM" to one shared host (the tests' loopback sshd,
    # where two sweeps may run at once): that host is shared, so its port is derived too.
    own_vms = creates_machines and not settings.SSH_ENDPOINT.get()
    port = CLOUD_HEAD_PORT if own_vms else low + digest % (high - low)
    # Short: Ray's Unix sockets live below it (108 bytes for a socket path).
    temp_dir = f"/tmp/cpray-{digest % 16**8:08x}"
    return ClusterPlan(f"{head}:{port}", port, temp_dir, local=provider == "local")


def ray_binary(executor: Executor) -> str:
    """The ``ray`` script beside the host's interpreter (the venv's bin directory)."""
    return posixpath.join(posixpath.dirname(executor.python), "ray")


def start_command(ray: str, plan: ClusterPlan, index: int,
                  node_ip: str | None = None) -> list[str]:
    """``ray start`` for node ``index``: the head for 0, a worker joining it otherwise.

    ``node_ip``: the address the other nodes reach this one at. Given, Ray registers the
    node there instead of guessing from its route to the head (two ssh "hosts" on one
    machine's loopback, 127.0.0.1 and 127.0.0.2, would both guess the head's). Ray
    itself turns 127.0.0.1 into the machine's own address."""
    role = (["--head", f"--port={plan.port}", "--include-dashboard=false"] if index == 0
            else [f"--address={plan.head_address}"])
    low = WORKER_PORTS_BASE + index * WORKER_PORTS_PER_NODE
    argv = [ray, "start", *role,
            f"--temp-dir={plan.temp_dir}",
            f"--resources={json.dumps({f'cloudprof_node_{index}': 1})}",
            "--dashboard-agent-listen-port=0",  # two nodes on one host must not share it
            f"--min-worker-port={low}", f"--max-worker-port={low + WORKER_PORTS_PER_NODE - 1}",
            "--disable-usage-stats",
            # the driver connects with log_to_driver=False: nothing reads a log monitor's
            # stream, so a node runs one Python daemon fewer (measured in its peak)
            "--include-log-monitor=false"]
    if plan.local:
        argv.append(f"--object-store-memory={LOCAL_OBJECT_STORE_BYTES}")
    if node_ip:
        argv.append(f"--node-ip-address={node_ip}")
    return argv


def stop_command(python: str, plan: ClusterPlan) -> list[str]:
    """Stop this cluster's processes on one host (only those under its temp dir)."""
    return [python, "-m", "workloads.ray_trial", "stop", plan.temp_dir]


class RayCluster:
    """A started cluster; :meth:`stop` is idempotent and safe from any thread."""

    def __init__(self, plan: ClusterPlan, nodes: Sequence[RayNode]) -> None:
        self.plan, self.nodes = plan, list(nodes)
        self.started: list[RayNode] = []  # stop() visits these (a half-started cluster too)
        self.start_s: float | None = None  # measured: head and every worker up
        self.notes: list[str] = []  # "note: node 1 has no memory cgroup (...)", one per node
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a `ray start` returns
        self._starting = 0  # `ray start` commands running now
        self._stopping = False
        self._stop_lock = threading.Lock()  # a second stop() waits for the first to finish

    @property
    def address(self) -> str:
        return self.plan.head_address

    def start(self) -> None:
        """The head first, then every other node at once (each waits to join the head)."""
        began = time.monotonic()
        # What a crashed earlier run of this sweep left (same ports, same temp dir) goes
        # first, on every node, before any node of this cluster starts.
        self._stop_nodes(list(self.nodes))
        self._start_node(self.nodes[0])
        errors = in_parallel(self._start_node, self.nodes[1:],
                             lambda node: f"ray-node-{node.index}")
        if errors:
            raise errors[0]
        self.start_s = time.monotonic() - began

    def _start_node(self, node: RayNode) -> None:
        ex = node.executor
        with self._lock:
            if self._stopping:
                raise RemoteCommandError("the sweep is stopping: Ray is not started")
            self.started.append(node)  # before it runs: a half-started node is stopped too
            self._starting += 1
        try:
            result = _run(ex, [ex.python, "-m", "workloads.ray_trial", "start",
                               self.plan.temp_dir, str(node.index),
                               *start_command(ray_binary(ex), self.plan, node.index,
                                              node.address)],
                          f"ray start on node {node.index}")
            notes = [line.strip() for line in (result.stdout_tail or "").splitlines()
                     if line.startswith("note: ")]
            with self._lock:
                self.notes += notes
        finally:
            with self._lock:
                self._starting -= 1
                self._idle.notify_all()

    def stop(self) -> list[str]:
        """Stop every started node (in parallel); the one-line errors of those that failed.

        Idempotent, from any thread: no node starts after the first call, and a ``ray
        start`` running at that moment is waited for (its daemons would outlive a stop
        that ran before them) before the nodes are stopped."""
        with self._stop_lock:  # the caller then closes the executors: only once all stopped
            with self._lock:
                self._stopping = True
                self._idle.wait_for(lambda: self._starting == 0, timeout=START_TIMEOUT_S)
                nodes, self.started = list(self.started), []
            return self._stop_nodes(nodes)

    def _stop_nodes(self, nodes: list[RayNode]) -> list[str]:
        def stop_one(node: RayNode) -> None:
            _run(node.executor, stop_command(node.executor.python, self.plan),
                 f"stopping Ray on node {node.index}", timeout=120)

        # reported by the caller; the VMs' deletion follows anyway
        return [one_line(exc) for exc in in_parallel(stop_one, nodes,
                                                      lambda node: f"ray-stop-{node.index}")]


def in_parallel(work: Callable[[T], None], items: Sequence[T],
                name: Callable[[T], str]) -> list[BaseException]:
    """``work(item)`` for every item at once, a thread each; waits for all of them (nodes
    come up, or go, together) and returns what they raised, in the items' order."""
    raised: dict[int, BaseException] = {}

    def one(i: int, item: T) -> None:
        try:
            work(item)
        except BaseException as exc:
            raised[i] = exc

    threads = [threading.Thread(target=one, args=(i, item), name=name(item), daemon=True)
               for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [raised[i] for i in sorted(raised)]


def _run(ex: Executor, argv: list[str], what: str,
         timeout: float = START_TIMEOUT_S) -> CommandResult:
    result = ex.run(argv, timeout=timeout)
    if result.exit_code != 0:
        raise RemoteCommandError(f"{what} failed (exit {result.exit_code}): "
                                 f"{result.last_line()}")
    return result


def form_cluster(host: HostSession) -> None:
    """Nodes 1..N-1 made ready like node 0 (in parallel), then a Ray cluster over all."""
    from orchestrator.engine.host_session import HostSession

    ctx, vm = host.ctx, host.vm
    ctx.progress.state(vm.name, f"starting {vm.nodes - 1} more node(s)")
    with host.lock:
        host.peers = [HostSession(ctx, replace(vm, name=vm.node_name(i)), host.provider, node=i)
                      for i in range(1, vm.nodes)]

    def ready(peer: HostSession) -> None:
        peer.provision(vm.zone)
        if ctx.stop.is_set():
            return
        peer.record_ready(node_of=vm.name)
        peer.connect()
        peer.stage_inputs()
        peer.stage_job()

    errors = in_parallel(ready, host.peers, lambda peer: f"node-{peer.vm.name}")
    if errors:
        raise errors[0]
    if ctx.stop.is_set():
        return
    nodes = [host, *host.peers]

    def ray_on(node: HostSession) -> None:
        assert node.executor is not None
        problem = node.executor.ensure_ray()
        if problem:
            raise RemoteCommandError(f"Ray on {node.vm.name}: {problem}")

    # All nodes at once: where Ray is missing, each VM's pip install takes tens of seconds
    # (one after the other, N nodes waited N installs); the first node's problem is shown.
    errors = in_parallel(ray_on, nodes, lambda node: f"ray-check-{node.vm.name}")
    if errors:
        raise errors[0]
    _start_cluster(host, nodes)


def _start_cluster(host: HostSession, nodes: list[HostSession]) -> None:
    """``ray start`` on every node, the head's first, and the cluster in sweep.json."""
    ctx, vm = host.ctx, host.vm
    # Each node is reached at its own address (ssh: its own host), the head's first.
    addresses = []
    for node in nodes:
        assert node.inst is not None
        addresses.append(node_address(node.inst, host.provider.name))
    plan = plan_cluster(ctx.plan.sweep_id, vm.machine.name, addresses[0],
                        host.provider.name, host.provider.creates_machines)
    cluster = RayCluster(plan, [RayNode(i, n.executor, address) for i, (n, address)
                                in enumerate(zip(nodes, addresses, strict=True))
                                if n.executor is not None])
    host.cluster = cluster  # from here on, teardown stops it
    ctx.progress.state(vm.name, f"starting Ray on {vm.nodes} nodes")
    cluster.start()
    ctx.store.record_vm(vm.name, ray={"address": cluster.address, "nodes": vm.nodes,
                                      "start_s": round(cluster.start_s or 0.0, 3),
                                      "node_vms": [n.vm.name for n in nodes],
                                      "node_addresses": addresses,
                                      "temp_dir": cluster.plan.temp_dir,
                                      "notes": cluster.notes})
    ctx.progress.log(f"{vm.machine.name}: Ray cluster of {vm.nodes} nodes up in "
                     f"{cluster.start_s or 0.0:.1f} s (measured)")
    from rich.markup import escape

    for note in cluster.notes:  # a node whose peaks are sampled, not the kernel's
        ctx.progress.log(escape(f"{vm.machine.name}: {note}"))


def cluster_request(request: TrialRequest, host: HostSession,
                    trial: TrialPlan) -> TrialRequest:
    """A multi-node trial's request on the machine's cluster: its address and each node's
    own copies of the inputs and the job, for the first ``trial.nodes`` nodes."""
    if trial.nodes <= 1 or host.cluster is None:
        return request
    nodes = [host, *host.peers][:trial.nodes]
    return replace(
        request, ray_address=host.cluster.address,
        ray_node_params={i: {"inputs": n.inputs_dir} for i, n in enumerate(nodes)
                         if n.inputs_dir},
        ray_node_chdirs={i: n.job_dir for i, n in enumerate(nodes) if n.job_dir})
