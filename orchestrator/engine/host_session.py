"""One host's life in a sweep: provision (or reattach), connect and bootstrap, stage the
inputs, the job and its --setup, then release it (the Ray cluster stopped, every
connection closed, the VM deleted with retries and backoff).

Money rules live here: a VM's id is in sweep.json before anything waits on it, and
:meth:`HostSession.release` is idempotent and safe from any thread (the main thread
calls it at once on an interrupt while the machine's own thread may too).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import settings
from orchestrator.engine.prepare import vm_expiry
from orchestrator.errors import (
    CapacityError,
    CloudprofError,
    ProviderError,
    RemoteCommandError,
    one_line,
)
from orchestrator.plan.planner import TrialPlan, VmPlan, slug
from orchestrator.providers.base import (
    LABEL_SWEEP,
    CommandResult,
    Executor,
    Instance,
    Provider,
    VmRequest,
    sweep_labels,
)
from orchestrator.results.store import now_iso
from workloads import protocol

if TYPE_CHECKING:
    from orchestrator.engine.context import SweepContext
    from orchestrator.engine.ray_cluster import RayCluster
    from orchestrator.engine.warm_runner import WarmRunner
    from orchestrator.providers.base import Bucket

SSH_USER = "cloudprof"
DELETE_ATTEMPTS = 4  # a failed VM deletion is tried again after 2, 4, 8 s, then reported
DELETE_BACKOFF_S = 2.0  # the first retry's delay; CLOUDPROF_DELETE_BACKOFF_S overrides it
GONE_STATES = {"terminated", "stopped", "stopping", "shutting-down", "suspended", "deleted"}


def delete_backoff_s() -> float:
    """The first deletion retry's delay: the environment's when it is a sane number (the
    tests shorten it; a user whose cloud needs longer may lengthen it), else the default."""
    raw = settings.DELETE_BACKOFF_S.get() or ""
    try:
        value = float(raw)
    except ValueError:
        return DELETE_BACKOFF_S
    return value if 0 <= value <= 600 else DELETE_BACKOFF_S


class Preempted(ProviderError):
    """The VM disappeared under the sweep (spot preemption, deleted by someone)."""


def last_line(result: CommandResult) -> str:
    """The runner's last words, its progress lines left out."""
    return result.last_line(skip=lambda ln: protocol.parse_progress(ln) is not None)


@dataclass
class HostSession:
    """One machine of the sweep (or one node of it) while it runs."""

    ctx: SweepContext
    vm: VmPlan
    provider: Provider
    node: int = 0  # which node of its machine (peers: 1..N-1; ssh: the group's i-th host)
    inst: Instance | None = None
    executor: Executor | None = None
    inputs_dir: str | None = None
    job_dir: str | None = None  # the user's job copy on the host (--workdir)
    deleted: bool = False
    delete_error: str | None = None  # the last error once every deletion attempt failed
    profiler_checked: bool = False  # --profile: its tool installed (or tried) on this host
    # --nodes: the machine's other nodes (1..N-1, created, recorded and deleted with this
    # one) and the Ray cluster over all of them (orchestrator.engine.ray_cluster)
    peers: list[HostSession] = field(default_factory=list)
    cluster: RayCluster | None = None
    warm: WarmRunner | None = None  # while its trials run
    manifests: list[str] = field(default_factory=list)  # signed-URL files put on the host
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set as the machine thread's very last step. The main thread polls this rather
    # than Thread.join(): on CPython < 3.13 a Ctrl-C landing inside join() can mark a
    # thread that is still deleting its VM as finished (cpython issue 90882).
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def bucket(self) -> Bucket | None:
        """The bucket for this host's transfers; None: over its executor."""
        return self.ctx.bucket_for(self.provider)

    @property
    def ran_on(self) -> str:
        """What a trial's row says it ran on: the machine type, or the user's own host."""
        if self.provider.creates_machines:
            return self.vm.machine.name
        if self.provider.name == "local" or self.inst is None:
            return self.provider.name
        return self.inst.name  # the user's own host (ssh): which one it was

    # -- provision ---------------------------------------------------------------

    def bring_up(self) -> None:
        """Provision in the plan's zone, or once in the next one a capacity error names."""
        vm = self.vm
        self.ctx.progress.state(vm.name, "creating" if self.provider.creates_machines
                                else "preparing")
        try:
            self.provision(vm.zone)
        except CapacityError as exc:
            if not exc.next_zones or self.ctx.stop.is_set():
                raise
            zone = exc.next_zones[0]
            self.ctx.progress.log(f"[yellow]{vm.machine.name}: {one_line(exc)}; "
                                  f"trying {zone} once")
            self.delete()
            self.inst, self.deleted = None, False
            self.provision(zone)

    def provision(self, zone: str | None) -> None:
        self.inst = self._create_or_reattach(zone)
        if self.ctx.stop.is_set():
            return
        self.ctx.progress.state(self.vm.name, "waiting for the machine")
        self.inst = self.provider.wait_ready(self.inst)

    def record_ready(self, **extra: Any) -> None:
        assert self.inst is not None
        self.ctx.store.record_vm(self.vm.name, state="ready", address=self.inst.address,
                                 facts=self.inst.facts, ready_at=now_iso(), **extra)

    def _reattach(self) -> Instance | None:
        """Only a --resume can find a VM of its sweep: a new sweep's id is new, so the search
        (a listing in each region or zone the sweep may use) would only delay the create."""
        if not (self.provider.creates_machines and self.ctx.resuming):
            return None
        for inst in self.provider.list({LABEL_SWEEP: slug(self.ctx.plan.sweep_id)}):
            if inst.name == self.vm.name and inst.state.lower() not in GONE_STATES:
                self.ctx.store.record_vm(self.vm.name, id=inst.id, state="reattached",
                                         zone=inst.zone)
                return inst
        return None

    def _create_or_reattach(self, zone: str | None) -> Instance:
        vm, provider, store = self.vm, self.provider, self.ctx.store
        found = self._reattach()
        if found is not None:
            return found
        now = time.time()
        expires = vm_expiry(now, vm)
        labels = {**vm.labels, **sweep_labels(slug(self.ctx.plan.sweep_id), now, expires)}
        public_key, script = "", ""
        if self.ctx.ssh_keys is not None:
            from orchestrator.providers import remote

            public_key = self.ctx.ssh_keys.user_public
            script = remote.startup_script(self.ctx.ssh_keys, SSH_USER, int(expires))
        req = VmRequest(sweep_id=self.ctx.plan.sweep_id, name=vm.name, machine=vm.machine.name,
                        region=vm.region, zone=zone, spot=vm.spot, labels=labels,
                        ssh_user=SSH_USER, ssh_public_key=public_key, startup_script=script,
                        cluster=vm.nodes > 1, node=self.node)
        store.record_vm(vm.name, provider=provider.name, machine=vm.machine.name,
                        state="creating", labels=labels, spot=vm.spot,
                        price_per_hour=vm.machine.price(vm.spot), requested_at=now_iso())
        try:
            inst = provider.create(req)
        except CloudprofError as exc:  # capacity, quota...: no VM, and sweep.json says so
            store.record_vm(vm.name, state="create_failed", error=one_line(exc),
                            failed_at=now_iso())
            raise
        with self.lock:
            self.inst = inst  # from here on, teardown deletes it
        store.record_vm(vm.name, id=inst.id, zone=inst.zone, state="created",
                        created_at=now_iso())
        return inst

    def check_alive(self) -> None:
        """Raise Preempted when the provider no longer lists a running instance."""
        if not self.provider.creates_machines or self.inst is None:
            return
        try:
            found = self.provider.list({LABEL_SWEEP: slug(self.ctx.plan.sweep_id)})
        except ProviderError:
            return  # cannot tell: let the retry find out
        mine = [i for i in found if i.id == self.inst.id or i.name == self.inst.name]
        if not mine or mine[0].state.lower() in GONE_STATES:
            state = mine[0].state if mine else "gone"
            raise Preempted(f"instance {self.inst.name} is {state} (spot preemption?)")

    # -- connect and bootstrap ---------------------------------------------------

    def connect(self) -> None:
        """(Re)connect, then make sure the host has the runner (and --profile's tool)."""
        assert self.inst is not None
        progress = self.ctx.progress
        if self.executor is not None:
            with contextlib.suppress(Exception):
                self.executor.close()
        if self.provider.creates_machines:  # what a wait of up to minutes is waiting for
            from orchestrator.providers.remote import boot_timeout

            where = self.inst.address or self.inst.name
            progress.state(self.vm.name, f"waiting for SSH on {where} "
                                         f"(up to {boot_timeout():.0f} s)")
        self.executor = self.provider.connect(self.inst)
        if self.ctx.stop.is_set():
            self.executor.close()
            return
        progress.state(self.vm.name, "bootstrapping")
        wheels = self.ctx.wheels  # the sweep's one staged set for this host's platform
        self.executor.ensure_workloads(wheels.source(self.bucket) if wheels else None)
        profile = self.ctx.spec.profile
        if profile and not self.profiler_checked:  # only when --profile asks
            self.profiler_checked = True
            problem = self.executor.ensure_profiler(profile)
            if problem:
                progress.log(f"[yellow]warning:[/yellow] {problem}; its profiled trials "
                             "will say there is no profile")

    def run_checked(self, argv: list[str], what: str) -> CommandResult:
        """Run a command on the host; a non-zero exit is a RemoteCommandError."""
        assert self.executor is not None
        result = self.executor.run(argv, timeout=3600)
        if result.exit_code != 0:
            raise RemoteCommandError(f"{what} failed on {self.vm.name} "
                                     f"(exit {result.exit_code}): {last_line(result)}")
        return result

    def put_manifest(self, entries: list[dict[str, Any]], name: str) -> str:
        """Write a signed-URL manifest on the host; it is removed at release."""
        assert self.executor is not None
        remote = posixpath.join(self.executor.workdir, "manifests", name)
        if remote not in self.manifests:
            self.manifests.append(remote)  # before the write: a partial one is removed too
        self.executor.put_bytes(json.dumps(entries).encode(), remote)
        return remote

    # -- stage -------------------------------------------------------------------

    def stage_inputs(self) -> None:
        """Inputs onto the host: signed URLs fetched in parallel there, else copied over."""
        inputs = self.ctx.inputs
        if inputs is None:
            return
        ex = self.executor
        assert ex is not None and inputs.local_dir is not None
        dest = posixpath.join(ex.workdir, "inputs", inputs.hash)
        if self.bucket is not None:
            manifest = self.put_manifest(self.ctx.staging.manifest, "inputs.json")
            self.run_checked([ex.python, "-m", "workloads.transfer", "get", manifest, dest],
                             "fetching the inputs")
        else:
            for rel, _ in inputs.files:
                ex.put(inputs.local_dir / rel, posixpath.join(dest, rel))
        self.inputs_dir = dest

    def stage_job(self) -> None:
        """The user's job onto the host and its --setup: once per (hash, setup) in the host's
        cache, reused by later sweeps there (``jobs.stage_on_host``)."""
        job, spec, store = self.ctx.job, self.ctx.spec, self.ctx.store
        if job is None:
            return
        from orchestrator.engine import jobs

        ex = self.executor
        assert ex is not None
        self.ctx.progress.state(self.vm.name, "shipping the job")
        self.job_dir, unpacked = jobs.stage_on_host(
            ex, job, self.bucket, self.put_manifest, spec.setup,
            url_lifetime_s=self.ctx.url_lifetime_s)
        store.record_vm(self.vm.name, job={"hash": job.hash, "dir": self.job_dir,
                                           "copy": unpacked})
        if spec.setup:
            self.ctx.progress.state(self.vm.name, "running --setup")
            log = store.run_dir / "setup" / f"{self.vm.name}.log"
            state = jobs.setup_on_host(ex, self.job_dir, spec.setup, log)
            store.record_vm(self.vm.name, setup=state, setup_log=str(log),
                            setup_done_at=now_iso())

    # -- the warm runner ---------------------------------------------------------

    def start_warm(self, trials: list[TrialPlan]) -> None:
        """A warm runner for the host's trials that can use one (see engine/warm_runner.py)."""
        from orchestrator.engine import warm_runner

        spec = self.ctx.spec
        wanted = spec.adaptive or any(warm_runner.eligible(t) for t in trials)
        if not (warm_runner.enabled() and self.executor is not None and wanted):
            return
        preload = None if spec.command is not None else spec.workload
        self.warm = warm_runner.WarmRunner(
            self.executor, preload, lambda line: self.ctx.progress.log(f"{self.vm.name}: {line}"))
        self.warm.launch()

    def warm_ready(self) -> None:
        """Before the first trial: the warm runner ready, or given up (trials start fresh)."""
        if self.warm is not None and not self.warm.wait_ready():
            self.stop_warm()

    def stop_warm(self) -> None:
        if self.warm is not None:
            self.warm.stop(self.executor)
            self.warm = None

    # -- release -----------------------------------------------------------------

    def release(self) -> None:
        """End the machine's Ray cluster, close every node's connection, delete its VMs."""
        self._stop_cluster()
        for node in [self, *self.peers]:
            if node.executor is not None:
                node._remove_manifests()
                with contextlib.suppress(Exception):
                    node.executor.close()
            node.delete()

    def _stop_cluster(self) -> None:
        """``ray stop`` (this cluster's processes only) on every node, before any deletion:
        on the local and ssh providers nothing is deleted, so this is what ends them."""
        cluster = self.cluster  # kept: a second stop (Ctrl-C, then the thread's finally) is
        if cluster is None:     # a no-op once every node is stopped
            return
        for error in cluster.stop():
            self.ctx.progress.log(f"[bold red]{self.vm.machine.name}: could not stop Ray: "
                                  f"{error}")

    def _remove_manifests(self) -> None:
        """The manifests' signed URLs open the bucket to whoever reads them until they
        expire: a host that outlives the sweep (ssh, local) keeps none of them. A cloud VM
        takes them with its disk."""
        paths, self.manifests = self.manifests, []
        if not paths or self.provider.creates_machines or self.executor is None:
            return
        with contextlib.suppress(Exception):  # teardown goes on; the URLs expire anyway
            self.executor.run(["rm", "-f", "--", *paths], timeout=30)

    def delete(self) -> None:
        """Delete the host's VM, retried with backoff; after the last try it is left for good
        (``delete_error``), which the end of the sweep reports as loudly as it can."""
        with self.lock:
            if self.inst is None or self.deleted or self.delete_error is not None:
                return
            self.deleted = True
            inst = self.inst
        for attempt in range(DELETE_ATTEMPTS):
            try:
                self.provider.delete(inst)
                break
            except Exception as exc:
                if attempt == DELETE_ATTEMPTS - 1:
                    self._delete_failed(inst, one_line(exc))
                    return
                delay = delete_backoff_s() * 2 ** attempt
                self.ctx.progress.log(f"[red]deleting {inst.name} ({inst.id}) failed: "
                                      f"{one_line(exc)}; retrying in {delay:g} s "
                                      f"({attempt + 2}/{DELETE_ATTEMPTS})")
                time.sleep(delay)  # not the stop event: it is set while tearing down
        state = "deleted" if self.provider.creates_machines else "released"
        try:
            self.ctx.store.record_vm(self.vm.name, state=state, deleted_at=now_iso(),
                                     error=None)
        except OSError as exc:
            self.ctx.failures.write_failed(exc)

    def _delete_failed(self, inst: Instance, error: str) -> None:
        with self.lock:
            self.deleted = False
            self.delete_error = error
        with contextlib.suppress(OSError):  # reported at the end either way
            self.ctx.store.record_vm(self.vm.name, state="delete_failed", error=error)
        self.ctx.progress.log(f"[bold red]could not delete {inst.name} ({inst.id}) "
                              f"after {DELETE_ATTEMPTS} attempts: {error}")
