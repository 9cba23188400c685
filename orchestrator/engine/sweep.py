"""The sweep engine: spec → plan → staged inputs → per-machine trials → store → report.

One thread per machine (one VM serves all its trials); the main thread only
watches them, so a Ctrl-C or SIGTERM always lands where teardown is handled.
Money and data rules live here: every VM's id is written to sweep.json before
anything waits on it, every VM is deleted in a ``finally`` (and by the main
thread at once on an interrupt), and every trial is in the store the moment it
is collected — so a crash loses at most the trial in flight, and
``--resume`` runs exactly what is missing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import posixpath
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine import timeouts
from orchestrator.engine.progress import SweepProgress
from orchestrator.engine.signals import current as current_signals
from orchestrator.engine.signals import deferred as signals_deferred
from orchestrator.engine.signals import signum_of, sweep_signals
from orchestrator.errors import (
    BudgetError,
    CapacityError,
    CloudprofError,
    ConnectionLostError,
    MemoryGateError,
    PartialSweepError,
    ProviderError,
    RemoteCommandError,
    ResultsWriteError,
    SweepInterruptedError,
    TeardownError,
    UnreachableError,
    UsageError,
    one_line,
)
from orchestrator.formatting import fmt_bytes, fmt_usd
from orchestrator.plan.planner import (
    Plan,
    TrialPlan,
    Upload,
    VmPlan,
    make_plan,
    new_sweep_id,
    render_plan,
    slug,
)
from orchestrator.providers.base import (
    LABEL_SWEEP,
    Bucket,
    CommandResult,
    Executor,
    Instance,
    Provider,
    ProviderOptions,
    VmRequest,
    sweep_labels,
)
from orchestrator.providers.wheelhouse import SweepWheels
from orchestrator.results.store import RunStore, now_iso, trial_row
from orchestrator.spec.spec import SweepSpec
from workloads import protocol
from workloads.job import LOG_FILE as JOB_LOG
from workloads.protocol import TrialRequest

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.spec.catalog import MachineType

SSH_USER = "cloudprof"
EXPIRY_MARGIN_S = 1800.0  # a VM outlives its estimate by 50% plus this, then deletes itself
# How long bucket prefixes outlive the sweep's expiry before `cloudprof cleanup` takes them:
# results long enough for `sweep --resume` to collect what VMs uploaded, the inputs cache
# long enough to be reused by the next sweeps (each sweep using it pushes this further).
RESULTS_RETENTION_S = 3 * 86400.0
INPUTS_RETENTION_S = 7 * 86400.0
TRIAL_ATTEMPTS = 3  # a dropped session is retried on the same VM this many times in all
RETRY_BACKOFF_S = 2.0
TEARDOWN_WAIT_S = 900.0
SIGNED_URL_MAX_S = 7 * 86400  # S3 (SigV4) and GCS (V4) refuse longer-lived signed URLs
UNASKED_COST_USD = 100.0  # a plan estimated above this needs --max-cost to start
DELETE_ATTEMPTS = 4  # a failed VM deletion is tried again after 2, 4, 8 s, then reported
DELETE_BACKOFF_S = 2.0  # the first retry's delay; CLOUDPROF_DELETE_BACKOFF_S overrides it


def delete_backoff_s() -> float:
    """The first deletion retry's delay: the environment's when it is a sane number (the
    tests shorten it; a user whose cloud needs longer may lengthen it), else the default."""
    raw = os.environ.get("CLOUDPROF_DELETE_BACKOFF_S", "")
    try:
        value = float(raw)
    except ValueError:
        return DELETE_BACKOFF_S
    return value if 0 <= value <= 600 else DELETE_BACKOFF_S
INPUT_PARAMS = {"frames": "frames", "rows": "rows", "cols": "cols", "seed": "seed",
                "format": "fmt"}
RETRYABLE = (ConnectionLostError, UnreachableError)  # worth a retry of the trial on the same VM
GONE_STATES = {"terminated", "stopped", "stopping", "shutting-down", "suspended", "deleted"}


class _Preempted(ProviderError):
    """The VM disappeared under the sweep (spot preemption, deleted by someone)."""


# ---------------------------------------------------------------------- inputs


@dataclass
class StagedInputs:
    """The sweep's input files: where they are locally and under which bucket prefix."""

    hash: str
    files: list[tuple[str, int]]  # (path relative to the inputs dir, size) — predicted
    local_dir: Path | None = None  # set once generated/validated
    cube_spec: Any = None  # workloads.inputs.InputSpec when the sweep generates the inputs

    @property
    def prefix(self) -> str:
        return f"inputs/{self.hash}"

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)


def plan_inputs(spec: SweepSpec) -> StagedInputs | None:
    """What the sweep will stage, known before anything is generated (for the plan and budget).

    The cube workload's inputs are generated from its parameters (content-addressed
    by the spec's hash); ``inputs=DIR`` stages a user's own directory; any other
    workload stages nothing.
    """
    given = spec.workload_params.get("inputs")
    if given:
        directory = Path(str(given)).expanduser()
        if not directory.is_dir():
            raise UsageError(f"inputs: {directory} is not a directory")
        if spec.workload == "cube":  # what the cube would refuse on the VM, refused here
            _check_cube_inputs(directory, spec)
        files = sorted(p for p in directory.rglob("*") if p.is_file())
        listing = [(p.relative_to(directory).as_posix(), p.stat().st_size) for p in files]
        digest = hashlib.sha256()
        for p, (rel, size) in zip(files, listing, strict=True):
            digest.update(f"{rel}:{size}:{p.stat().st_mtime_ns}\n".encode())
        return StagedInputs(digest.hexdigest()[:16], listing, local_dir=directory)
    if spec.workload != "cube" or spec.command is not None:
        return None
    from workloads.base import WorkloadInputError
    from workloads.inputs import MANIFEST, InputSpec

    kwargs: dict[str, Any] = {}
    for param, attr in INPUT_PARAMS.items():
        if param in spec.workload_params:
            value = spec.workload_params[param]
            if attr != "fmt":
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise UsageError(f"workload parameter {param} must be an integer, "
                                     f"got {value!r}") from None
            kwargs[attr] = value
    try:
        cube_spec = InputSpec(**kwargs)
    except WorkloadInputError as exc:
        raise UsageError(str(exc)) from None
    per_file = cube_spec.rows * cube_spec.cols * 8  # float64, uncompressed (an estimate)
    files = [(cube_spec.file_name(i), per_file) for i in range(cube_spec.frames)]
    files.append((MANIFEST, 200 * cube_spec.frames))
    return StagedInputs(cube_spec.hash, files, cube_spec=cube_spec)


def _check_cube_inputs(directory: Path, spec: SweepSpec) -> None:
    from workloads.base import WorkloadInputError
    from workloads.cube import CubeWorkload
    from workloads.inputs import check_inputs

    try:
        cube = CubeWorkload(**{k: str(v) for k, v in spec.workload_params.items()})
        check_inputs(directory, cube.dim)
    except WorkloadInputError as exc:
        raise UsageError(str(exc)) from None


def generate_inputs(inputs: StagedInputs, console: Console | None = None) -> Path:
    """Generate (or find in the cache) the inputs; the real file list replaces the predicted one.

    With a ``console``, a bar counts the frames written (generating large inputs takes
    minutes); found in the cache, nothing is shown.
    """
    if inputs.local_dir is None:
        from workloads.inputs import default_cache_dir, ensure_inputs, is_complete

        cube = inputs.cube_spec
        if console is None or is_complete(default_cache_dir() / cube.hash, cube):
            inputs.local_dir = ensure_inputs(cube)
        else:
            from orchestrator.engine.progress import counting

            with counting(console, "Generating inputs", cube.frames) as bar:
                inputs.local_dir = ensure_inputs(cube, on_frame=bar.set)
                bar.finish(f"frames, cached in {inputs.local_dir}")
    files = sorted(p for p in inputs.local_dir.rglob("*") if p.is_file())
    inputs.files = [(p.relative_to(inputs.local_dir).as_posix(), p.stat().st_size)
                    for p in files]
    return inputs.local_dir


# ---------------------------------------------------------------------- machines


def lookup_machines(spec: SweepSpec) -> list[MachineType]:
    """Catalog rows of the spec's machines; local/ssh machines may be off-catalog."""
    from orchestrator.errors import UnknownMachineError
    from orchestrator.spec.catalog import MachineType, lookup
    from orchestrator.spec.config import machine_providers

    out = []
    owners = machine_providers(spec)  # one provider, or several in one sweep
    # beside catalog machines a host of unknown size runs their worker counts (make_plan)
    sized = any(provider in ("gcp", "aws") for provider in owners.values())
    for name in spec.machines:
        provider = owners[name]
        if provider in ("gcp", "aws"):
            out.append(lookup(name, provider, spec.region))
            continue
        try:
            row = lookup(name)
            # several providers: the planner takes each VM's provider from its row
            out.append(row if spec.provider else replace(row, provider=provider))
        except UnknownMachineError:
            if not spec.workers and not sized:
                raise UsageError(f"{name!r} is not in the catalog, so its vCPU count is "
                                 "unknown: give --workers") from None
            if provider == "ssh":  # its price from the hosts file (a group's: one node's)
                from orchestrator.providers.ssh import SshProvider

                out.append(SshProvider(ProviderOptions(hosts_file=spec.hosts_file,
                                                       hosts=list(spec.hosts))).machine_type(name))
                continue
            out.append(MachineType(provider=provider, name=name, family="", vcpus=0,
                                   memory_gib=0.0, region="", price_on_demand=None,
                                   price_spot=None, price_source="", price_date=""))
    return out


# ---------------------------------------------------------------------- engine


@dataclass
class _Host:
    """One machine of the sweep while it runs."""

    vm: VmPlan
    provider: Provider
    inst: Instance | None = None
    executor: Executor | None = None
    inputs_dir: str | None = None
    job_dir: str | None = None  # the user's job copy on the host (--workdir)
    deleted: bool = False
    delete_error: str | None = None  # the last error once every deletion attempt failed
    profiler_checked: bool = False  # --profile: its tool installed (or tried) on this host
    # --nodes: the machine's other nodes (1..N-1, created, recorded and deleted with this
    # one) and the Ray cluster over all of them (orchestrator.engine.ray_cluster)
    peers: list[_Host] = field(default_factory=list)
    cluster: Any = None
    warm: Any = None  # orchestrator.engine.warm_runner.WarmRunner while its trials run
    node: int = 0  # which node of its machine (peers: 1..N-1; ssh: the group's i-th host)
    manifests: list[str] = field(default_factory=list)  # signed-URL files put on the host
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set as the machine thread's very last step. The main thread polls this rather
    # than Thread.join(): on CPython < 3.13 a Ctrl-C landing inside join() can mark a
    # thread that is still deleting its VM as finished (cpython issue 90882).
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _ResultsPut:
    """A trial's put manifest on the host (None: none written yet) and its entries, and
    whether the runner said it put them all (``protocol.format_put``)."""

    manifest: str | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    @property
    def args(self) -> list[str]:
        """The runner's ``--put`` option: none without a manifest on the host."""
        return ["--put", self.manifest] if self.manifest else []

    def watch(self, on_line: Callable[[str], None]) -> Callable[[str], None]:
        """``on_line`` for the runner's output, noting its "put ok" line on the way."""

        def watched(line: str) -> None:
            if self.manifest and protocol.put_succeeded(line, self.manifest):
                self.done = True
            on_line(line)

        return watched


class _Engine:
    def __init__(self, spec: SweepSpec, plan: Plan, store: RunStore, bucket: Bucket | None,
                 inputs: StagedInputs | None, progress: SweepProgress,
                 providers: dict[str, Provider], ssh_keys: Any, job: Any = None) -> None:
        self.spec, self.plan, self.store, self.bucket = spec, plan, store, bucket
        # the providers whose hosts fetch and put through the bucket (see bucket_serves)
        self.bucket_served = bucket_serves(bucket.url if bucket is not None else None,
                                           {_exec_provider_name(spec, vm) for vm in plan.vms})
        self.job = job  # orchestrator.engine.jobs.JobArchive of --workdir, or None
        self.inputs, self.progress, self.providers = inputs, progress, providers
        self.ssh_keys = ssh_keys
        # The keys' cancel event stops remote.connect's wait for SSH at once on Ctrl-C.
        cancel = getattr(ssh_keys, "cancel", None)
        self.stop: threading.Event = cancel if cancel is not None else threading.Event()
        self.hosts: dict[str, _Host] = {}
        self.errors: list[BaseException] = []  # bugs in a machine thread, re-raised at the end
        self.attempt_nonce = str(int(time.time()))
        self.timeouts = timeouts.TrialTimeouts(spec)
        self.input_manifest: list[dict[str, Any]] = []
        self.url_lifetime_s = signed_url_lifetime(plan)
        self.write_error: OSError | None = None  # the first local write that failed
        self.resuming = False  # look in the bucket for a trial's result before running it
        self.lock = threading.Lock()
        # Set by a machine thread as it ends: wakes the main thread at once (see execute).
        self.wake = threading.Event()
        # Set once the main thread has imported what the sweep needs between trials, which it
        # does while the machines provision and stage: pyarrow (ensure_trials_table), and
        # pandas only for --adaptive and --search (they read the trials as a frame between
        # trials); no trial starts before it, so no import runs beside a trial. A plain sweep
        # never imports pandas: recording a trial and the report need pyarrow alone.
        self.pandas_ready = threading.Event()
        # What the main thread uploads while the machines provision (the job, the inputs:
        # see ``_stage_once``); set once it has, or failed. No host fetches them before.
        self.stage: Callable[[], None] = lambda: None
        self.staged = threading.Event()
        # --prove-limit/--find-limit trials (orchestrator.engine.limits): id → what to record
        self.limit_meta: dict[str, dict[str, Any]] = {}
        # the wheels the hosts' envs install, fetched and staged once per sweep
        self.wheels = SweepWheels(progress.log, self.url_lifetime_s, slug(plan.sweep_id))

    # -- the whole run ---------------------------------------------------------

    def execute(self, todo: dict[str, list[TrialPlan]]) -> bool:
        """Run every machine with trials left; False when interrupted."""
        vms = [vm for vm in self.plan.vms if todo.get(vm.name)]
        concurrent = all(self._provider(vm).concurrent_machines for vm in vms)
        gate = threading.Semaphore(len(vms) if concurrent else 1)
        threads = []
        for vm in vms:
            self.hosts[vm.name] = _Host(vm=vm, provider=self._provider(vm))
            self.progress.add_machine(vm.name, vm.machine.name, len(todo[vm.name]))
            threads.append(threading.Thread(target=self._machine_thread,
                                            args=(vm, todo[vm.name], gate),
                                            name=f"machine-{vm.name}", daemon=True))
        try:
            for thread in threads:
                thread.start()
            self._stage_once()
            # Not needed before the first record: written while the machines start (see _run)
            self.store.ensure_trials_table()
            if self.spec.adaptive or self.plan.search:
                self._import_pandas()
            else:
                self.pandas_ready.set()
            while self._running():
                # A machine thread's end sets ``wake``, so the sweep goes on the moment the
                # last one ends, not at the next tick; the timeout keeps Ctrl-C prompt.
                self.wake.wait(0.1)
                self.wake.clear()
        except KeyboardInterrupt:
            self.stop.set()
            self.progress.tearing_down()
            self._shielded(self.teardown_all)
            self._wait_teardown()
            return False
        return True

    def _stage_once(self) -> None:
        """Upload what the hosts fetch (``stage``) and sign its URLs, on the main thread while
        the machine threads create, boot and bootstrap their hosts: a VM's boot no longer
        waits for the upload. A failure stops the machines (torn down as for any failure)."""
        if self.staged.is_set():
            return  # an earlier execute of this sweep (--search) staged them
        try:
            self.stage()
            if self.bucket is not None and self.inputs is not None:
                keys = self.bucket.list(self.inputs.prefix + "/")
                self.input_manifest = [
                    {"url": self.bucket.signed_url(f"{self.inputs.prefix}/{rel}",
                                                   expires_s=self.url_lifetime_s),
                     "path": rel, "md5": keys.get(f"{self.inputs.prefix}/{rel}")}
                    for rel, _ in self.inputs.files
                ]
        except BaseException:
            self.stop.set()
            raise
        finally:
            self.staged.set()

    def _wait_staged(self) -> bool:
        """Wait for ``_stage_once``; False when the sweep is stopping (or staging failed)."""
        while not self.staged.wait(0.1):
            if self.stop.is_set():
                return False
        return not self.stop.is_set()

    def _import_pandas(self) -> None:
        """Import pandas (what ``RunStore.trials_frame`` needs, ~0.3-1 s) on the main thread
        while the machine threads provision, connect and stage the inputs, which wait on
        other processes or the network; paid there, it is no longer a pause of its own
        before the sweep starts. ``pandas_ready`` is set whatever happens: the machine threads
        wait for it before their first trial, so the import never runs beside a trial."""
        try:
            import pandas  # noqa: F401
        finally:
            self.pandas_ready.set()

    def _wait_pandas(self) -> bool:
        """Wait for :meth:`_import_pandas` (normally over by the time staging is); False when the
        sweep is stopping meanwhile."""
        while not self.pandas_ready.wait(0.1):
            if self.stop.is_set():
                return False
        return not self.stop.is_set()

    def _shielded(self, work: Callable[[], None]) -> None:
        """Run a teardown in a thread of its own, so that a further Ctrl-C (which only the
        main thread receives) cannot cut a VM's deletion short halfway — instance gone, key
        pair or firewall rule left behind. Such Ctrl-Cs only warn."""
        finished = threading.Event()

        def run() -> None:
            try:
                work()
            finally:
                finished.set()

        threading.Thread(target=run, name="teardown", daemon=True).start()
        while not finished.is_set():
            try:
                finished.wait(0.1)
            except KeyboardInterrupt:
                self._still_tearing_down()

    def _still_tearing_down(self) -> None:
        self.progress.log("[bold red]Still tearing down — please wait; VMs also "
                          "delete themselves at their expiry label.")

    def _running(self) -> bool:
        return not all(host.done.is_set() for host in self.hosts.values())

    def _provider(self, vm: VmPlan) -> Provider:
        return self.providers[_exec_provider_name(self.spec, vm)]

    def _bucket(self, host: _Host) -> Bucket | None:
        """The bucket for this host's transfers; None: over its executor."""
        return self.bucket if host.provider.name in self.bucket_served else None

    def _wait_teardown(self) -> None:
        """Wait for the machine threads' own ``finally`` blocks; further Ctrl-Cs only warn."""
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        next_sweep = time.monotonic() + 5
        while self._running() and time.monotonic() < deadline:
            try:
                time.sleep(0.1)
                if time.monotonic() > next_sweep:  # a VM created since the interrupt goes too
                    self._shielded(self.teardown_all)
                    next_sweep = time.monotonic() + 5
            except KeyboardInterrupt:
                self._still_tearing_down()

    def teardown_all(self) -> None:
        """Stop running commands and delete every known VM (idempotent, from any thread)."""
        for host in list(self.hosts.values()):
            self._release(host)

    def _release(self, host: _Host) -> None:
        """End the machine's Ray cluster, close every node's connection, delete its VMs."""
        self._stop_cluster(host)
        for node in [host, *host.peers]:
            if node.executor is not None:
                self._remove_manifests(node)
                with contextlib.suppress(Exception):
                    node.executor.close()
            self._delete(node)

    def _remove_manifests(self, host: _Host) -> None:
        """The manifests' signed URLs open the bucket to whoever reads them until they
        expire: a host that outlives the sweep (ssh, local) keeps none of them. A cloud VM
        takes them with its disk."""
        paths, host.manifests = host.manifests, []
        if not paths or host.provider.creates_machines or host.executor is None:
            return
        with contextlib.suppress(Exception):  # teardown goes on; the URLs expire anyway
            host.executor.run(["rm", "-f", "--", *paths], timeout=30)

    def _delete(self, host: _Host) -> None:
        """Delete the host's VM, retried with backoff; after the last try it is left for good
        (``host.delete_error``), which the end of the sweep reports as loudly as it can."""
        with host.lock:
            if host.inst is None or host.deleted or host.delete_error is not None:
                return
            host.deleted = True
            inst = host.inst
        for attempt in range(DELETE_ATTEMPTS):
            try:
                host.provider.delete(inst)
                break
            except Exception as exc:
                error = one_line(exc)
                if attempt == DELETE_ATTEMPTS - 1:
                    with host.lock:
                        host.deleted = False
                        host.delete_error = error
                    with contextlib.suppress(OSError):  # reported at the end either way
                        self.store.record_vm(host.vm.name, state="delete_failed", error=error)
                    self.progress.log(f"[bold red]could not delete {inst.name} ({inst.id}) "
                                      f"after {DELETE_ATTEMPTS} attempts: {error}")
                    return
                delay = delete_backoff_s() * 2 ** attempt
                self.progress.log(f"[red]deleting {inst.name} ({inst.id}) failed: {error}; "
                                  f"retrying in {delay:g} s ({attempt + 2}/{DELETE_ATTEMPTS})")
                time.sleep(delay)  # not the stop event: it is set while tearing down
        state = "deleted" if host.provider.creates_machines else "released"
        try:
            self.store.record_vm(host.vm.name, state=state, deleted_at=now_iso(), error=None)
        except OSError as exc:
            self._write_failed(exc)

    # -- one machine -------------------------------------------------------------

    def _machine_thread(self, vm: VmPlan, trials: list[TrialPlan],
                        gate: threading.Semaphore) -> None:
        host = self.hosts[vm.name]
        try:
            while not gate.acquire(timeout=0.2):
                if self.stop.is_set():
                    return
            try:
                self._run_machine_guarded(host, trials)
            finally:
                gate.release()
        finally:
            host.done.set()
            self.wake.set()

    def _run_machine_guarded(self, host: _Host, trials: list[TrialPlan]) -> None:
        """Run one machine, record how it ended, and always tear it down."""
        vm = host.vm
        try:
            if self.stop.is_set():
                return
            self._run_machine(host, trials)
            status = "interrupted" if self.stop.is_set() else "done"
            self._note_machine(vm.machine.name, status)
            self.progress.machine_done(vm.name, status)
        except _Preempted as exc:
            self._note_machine(vm.machine.name, "preempted", one_line(exc))
            self.progress.machine_done(vm.name, "preempted")
            self.progress.log(f"[red]{vm.machine.name}: preempted: {one_line(exc)}")
        except CloudprofError as exc:
            if self.stop.is_set():
                self._note_machine(vm.machine.name, "interrupted")
            else:
                self._note_machine(vm.machine.name, "failed", one_line(exc))
                self.progress.machine_done(vm.name, "failed")
                self.progress.log(f"[red]{vm.machine.name}: failed: {one_line(exc)}")
        except OSError as exc:
            if not _local_write_error(exc):
                self.errors.append(exc)  # not the disk: a bug, as below
                self._note_machine(vm.machine.name, "failed", f"internal error: {exc!r}")
                return
            self._write_failed(exc)
            self._note_machine(vm.machine.name, "failed", f"cannot write results: {exc}")
            self.progress.machine_done(vm.name, "failed")
        except BaseException as exc:  # a bug: record it, tear down, re-raise in the main thread
            self.errors.append(exc)
            self._note_machine(vm.machine.name, "failed", f"internal error: {exc!r}")
        finally:
            self._release(host)

    def _stop_cluster(self, host: _Host) -> None:
        """``ray stop`` (this cluster's processes only) on every node, before any deletion:
        on the local and ssh providers nothing is deleted, so this is what ends them."""
        cluster = host.cluster  # kept: a second stop (Ctrl-C, then the thread's finally) is
        if cluster is None:     # a no-op once every node is stopped
            return
        for error in cluster.stop():
            self.progress.log(f"[bold red]{host.vm.machine.name}: could not stop Ray: {error}")

    def _write_failed(self, exc: OSError) -> None:
        """The results directory stopped taking writes: stop every machine (their results
        could not be stored either) and keep the bucket's copies for --resume."""
        with self.lock:
            first = self.write_error is None
            if first:
                self.write_error = exc
        self.stop.set()
        if first:
            self.progress.log(f"[bold red]cannot write the results: {exc} — stopping the sweep")

    def _note_machine(self, machine: str, status: str, error: str | None = None) -> None:
        """Record how a machine ended; a failing disk must not stop its teardown."""
        try:
            self.store.record_machine(machine, status, error)
        except OSError as exc:
            self._write_failed(exc)

    def _run_machine(self, host: _Host, trials: list[TrialPlan]) -> None:
        vm, key = host.vm, host.vm.name
        self.progress.state(key, "creating" if host.provider.creates_machines else "preparing")
        try:
            self._provision(host, vm.zone)
        except CapacityError as exc:
            if not exc.next_zones or self.stop.is_set():
                raise
            zone = exc.next_zones[0]
            self.progress.log(f"[yellow]{vm.machine.name}: {one_line(exc)}; trying {zone} once")
            self._delete(host)
            host.inst, host.deleted = None, False
            self._provision(host, zone)
        if self.stop.is_set():
            return
        self.store.record_vm(vm.name, state="ready", address=host.inst.address,
                             facts=host.inst.facts, ready_at=now_iso())
        self._connect(host)
        if self.stop.is_set():
            return
        # The warm runner imports while the inputs and the job are staged; after a --setup,
        # which may install into the interpreter it imports from, it starts after it.
        early = not self.spec.setup
        if early:
            self._start_warm(host, trials)
        try:
            if not self._wait_staged():
                return
            self.progress.state(key, "staging inputs")
            self._stage_inputs(host)
            # With ready_at and created_at: the measured phases next to the plan's estimates.
            self.store.record_vm(vm.name, inputs_staged_at=now_iso())
            self._stage_job(host)
            if self.stop.is_set():
                return
            # A resumed sweep whose multi-node trials are all done creates no extra VM.
            if host.vm.nodes > 1 and any(t.nodes > 1 for t in trials):
                self._form_cluster(host)
                if self.stop.is_set():
                    return
            if not early:
                self._start_warm(host, trials)
            self._warm_ready(host)
            if not self._wait_pandas():
                return
            if self.spec.adaptive:
                self._run_adaptive(host)
                return
            for i, trial in enumerate(trials):
                if self.stop.is_set():
                    return
                try:
                    self._run_trial(host, trial)
                except UnreachableError as exc:
                    # Its reconnect budget is spent: waiting again for each trial left would
                    # cost that budget again and again. They fail now, with the reason.
                    reason = f"machine unreachable: {one_line(exc)}"
                    self.progress.log(f"[red]{vm.machine.name}: unreachable; "
                                      f"{len(trials) - i} trial(s) left recorded as failed")
                    for left in trials[i:]:
                        self._record(host, left, None, None, status="failed", error=reason)
                    raise
            if self.spec.prove_limit or self.spec.find_limit:
                self._prove_limits(host)
        finally:
            if host.warm is not None:
                host.warm.stop(host.executor)
                host.warm = None

    def _prove_limits(self, host: _Host) -> None:
        """--prove-limit/--find-limit after the machine's trials: orchestrator.engine.limits."""
        from orchestrator.engine.limits import prove_limits

        def run(trial: TrialPlan, meta: dict[str, Any]) -> bool:
            self.limit_meta[trial.trial_id] = dict(meta)
            self._run_trial(host, trial)
            return bool(self.limit_meta[trial.trial_id].get("ran_unchanged"))

        prove_limits(self.spec, host.vm.machine.name, self.store.trial_rows(), run,
                     self.progress.log, self.stop.is_set)

    def _start_warm(self, host: _Host, trials: list[TrialPlan]) -> None:
        """A warm runner for the host's trials that can use one (see engine/warm_runner.py)."""
        from orchestrator.engine import warm_runner

        wanted = self.spec.adaptive or any(self._warm_eligible(host, t) for t in trials)
        if not (warm_runner.enabled() and host.executor is not None and wanted):
            return
        preload = None if self.spec.command is not None else self.spec.workload
        host.warm = warm_runner.WarmRunner(
            host.executor, preload, lambda line: self.progress.log(f"{host.vm.name}: {line}"))
        host.warm.launch()

    def _warm_ready(self, host: _Host) -> None:
        """Before the first trial: the warm runner ready, or given up (trials start fresh)."""
        if host.warm is not None and not host.warm.wait_ready():
            host.warm.stop(host.executor)
            host.warm = None

    def _warm_eligible(self, host: _Host, trial: TrialPlan) -> bool:
        """Profilers attach from the runner's start; a Ray trial's driver joins a cluster."""
        return not trial.profiled and trial.nodes <= 1

    def _form_cluster(self, host: _Host) -> None:
        """Nodes 1..N-1 made ready like node 0 (in parallel), then a Ray cluster over all."""
        from orchestrator.engine.ray_cluster import (
            RayCluster,
            RayNode,
            in_parallel,
            node_address,
            plan_cluster,
        )

        vm = host.vm
        self.progress.state(vm.name, f"starting {vm.nodes - 1} more node(s)")
        with host.lock:
            host.peers = [_Host(vm=replace(vm, name=vm.node_name(i)), provider=host.provider,
                                node=i) for i in range(1, vm.nodes)]

        def ready(peer: _Host) -> None:
            self._provision(peer, vm.zone)
            if self.stop.is_set():
                return
            assert peer.inst is not None
            self.store.record_vm(peer.vm.name, state="ready", address=peer.inst.address,
                                 facts=peer.inst.facts, ready_at=now_iso(), node_of=vm.name)
            self._connect(peer)
            self._stage_inputs(peer)
            self._stage_job(peer)

        errors = in_parallel(ready, host.peers, lambda peer: f"node-{peer.vm.name}")
        if errors:
            raise errors[0]
        if self.stop.is_set():
            return
        nodes = [host, *host.peers]
        for node in nodes:
            assert node.executor is not None
            problem = node.executor.ensure_ray()
            if problem:
                raise RemoteCommandError(f"Ray on {node.vm.name}: {problem}")
        # Each node is reached at its own address (ssh: its own host), the head's first.
        addresses = []
        for node in nodes:
            assert node.inst is not None
            addresses.append(node_address(node.inst, host.provider.name))
        plan = plan_cluster(self.plan.sweep_id, vm.machine.name, addresses[0],
                            host.provider.name, host.provider.creates_machines)
        cluster = RayCluster(plan, [RayNode(i, n.executor, address) for i, (n, address)
                                    in enumerate(zip(nodes, addresses, strict=True))
                                    if n.executor is not None])
        host.cluster = cluster  # from here on, teardown stops it
        self.progress.state(vm.name, f"starting Ray on {vm.nodes} nodes")
        cluster.start()
        self.store.record_vm(vm.name, ray={"address": cluster.address, "nodes": vm.nodes,
                                           "start_s": round(cluster.start_s or 0.0, 3),
                                           "node_vms": [n.vm.name for n in nodes],
                                           "node_addresses": addresses,
                                           "temp_dir": cluster.plan.temp_dir,
                                           "notes": cluster.notes})
        self.progress.log(f"{vm.machine.name}: Ray cluster of {vm.nodes} nodes up in "
                          f"{cluster.start_s or 0.0:.1f} s (measured)")
        from rich.markup import escape

        for note in cluster.notes:  # a node whose peaks are sampled, not the kernel's
            self.progress.log(escape(f"{vm.machine.name}: {note}"))

    def _on_host(self, host: _Host, trial: TrialPlan, out_dir: str,
                 put: str | None) -> TrialRequest:
        """The trial's request with what only this host knows: its inputs and job copy, the
        Ray cluster (each node's own copies, for a trial on the first ``trial.nodes`` of
        the machine's nodes), the put manifest and the result directory."""
        request = trial.request
        if host.inputs_dir:
            request = request.with_params(inputs=host.inputs_dir)
        if trial.nodes > 1 and host.cluster is not None:
            nodes = [host, *host.peers][:trial.nodes]
            request = replace(
                request, ray_address=host.cluster.address,
                ray_node_params={i: {"inputs": n.inputs_dir} for i, n in enumerate(nodes)
                                 if n.inputs_dir},
                ray_node_chdirs={i: n.job_dir for i, n in enumerate(nodes) if n.job_dir})
        return replace(request, chdir=host.job_dir or None, put=put, out=out_dir)

    def _run_adaptive(self, host: _Host) -> None:
        """``--adaptive``: run what ``plan.search.next_points`` asks for, one trial at a time.

        The budget is the planned grid's trial count for this machine; trial ids
        stay ``<machine>-w<N>-r<k>`` with k counting every trial at N already in
        the store, so they are unique and ``--resume`` continues from what was
        measured. A trial that does not finish ok spends budget (a machine that
        keeps failing cannot loop). How many trials it took is recorded on the
        VM (``adaptive`` in sweep.json) and logged.
        """
        from orchestrator.plan.model import fit_usl_with_intervals
        from orchestrator.plan.planner import trial_id, trial_request
        from orchestrator.plan.search import ADAPTIVE_BOOT, converged, next_points
        from orchestrator.results.report.measure import trial_rate

        vm, machine = host.vm, host.vm.machine.name
        budget = len(vm.trials)
        measured: dict[int, list[float]] = {}
        tried: dict[int, int] = {}
        frame = self.store.trials_frame()
        for row in frame[frame["machine"] == machine].to_dict("records"):
            w = int(row["workers"])
            tried[w] = tried.get(w, 0) + 1
            ups = trial_rate(row)
            if row["status"] == "ok" and math.isfinite(ups):
                measured.setdefault(w, []).append(ups)
        spent = sum(tried.values())
        while not self.stop.is_set():
            ok_count = sum(len(v) for v in measured.values())
            points = next_points(measured, max(1, int(vm.machine.vcpus)),
                                 budget - (spent - ok_count))
            if not points:
                break
            for w in points:
                if self.stop.is_set():
                    return
                r = tried.get(w, 0)
                tid = trial_id(machine, w, r)
                trial = TrialPlan(tid, machine, w, r, trial_request(self.spec, w, tid, r))
                tried[w] = tried.get(w, 0) + 1
                spent += 1
                self._run_trial(host, trial)
                done = self.store.trials_frame()
                row = done[done["trial_id"] == trial.trial_id]
                if not row.empty and row["status"].iloc[-1] == "ok":
                    ups = trial_rate(row.iloc[-1].to_dict())
                    if math.isfinite(ups):
                        measured.setdefault(w, []).append(ups)
        if self.stop.is_set():
            return
        model = fit_usl_with_intervals(measured, n_boot=ADAPTIVE_BOOT)
        if model is not None and converged(model):
            stopped = "N* known within ±10%"
        else:
            stopped = "budget spent" if spent >= budget else "no usable USL fit"
        self.store.record_vm(vm.name, adaptive={"trials": spent, "grid_trials": budget,
                                                "stopped": stopped})
        self.progress.log(f"{machine}: --adaptive took {spent} trials against the full "
                          f"grid's {budget} ({stopped})")

    def _provision(self, host: _Host, zone: str | None) -> None:
        host.inst = self._create_or_reattach(host, zone)
        if self.stop.is_set():
            return
        self.progress.state(host.vm.name, "waiting for the machine")
        host.inst = host.provider.wait_ready(host.inst)

    def _create_or_reattach(self, host: _Host, zone: str | None) -> Instance:
        vm, provider = host.vm, host.provider
        # Only a --resume can find a VM of its sweep: a new sweep's id is new, so the search
        # (a listing in each region or zone the sweep may use) would only delay the create.
        if provider.creates_machines and self.resuming:
            for inst in provider.list({LABEL_SWEEP: slug(self.plan.sweep_id)}):
                if inst.name == vm.name and inst.state.lower() not in GONE_STATES:
                    self.store.record_vm(vm.name, id=inst.id, state="reattached",
                                         zone=inst.zone)
                    return inst
        now = time.time()
        expires = _expiry(now, vm)
        labels = {**vm.labels, **sweep_labels(slug(self.plan.sweep_id), now, expires)}
        public_key, script = "", ""
        if self.ssh_keys is not None:
            from orchestrator.providers import remote

            public_key = self.ssh_keys.user_public
            script = remote.startup_script(self.ssh_keys, SSH_USER, int(expires))
        req = VmRequest(sweep_id=self.plan.sweep_id, name=vm.name, machine=vm.machine.name,
                        region=vm.region, zone=zone, spot=vm.spot, labels=labels,
                        ssh_user=SSH_USER, ssh_public_key=public_key, startup_script=script,
                        cluster=vm.nodes > 1, node=host.node)
        self.store.record_vm(vm.name, provider=provider.name, machine=vm.machine.name,
                             state="creating", labels=labels, spot=vm.spot,
                             price_per_hour=vm.machine.price(vm.spot), requested_at=now_iso())
        try:
            inst = provider.create(req)
        except CloudprofError as exc:  # capacity, quota...: no VM, and sweep.json says so
            self.store.record_vm(vm.name, state="create_failed", error=one_line(exc),
                                 failed_at=now_iso())
            raise
        with host.lock:
            host.inst = inst  # from here on, teardown deletes it
        self.store.record_vm(vm.name, id=inst.id, zone=inst.zone, state="created",
                             created_at=now_iso())
        return inst

    def _connect(self, host: _Host) -> None:
        assert host.inst is not None
        if host.executor is not None:
            with contextlib.suppress(Exception):
                host.executor.close()
        if host.provider.creates_machines:  # what a wait of up to minutes is waiting for
            from orchestrator.providers.remote import boot_timeout

            where = host.inst.address or host.inst.name
            self.progress.state(host.vm.name, f"waiting for SSH on {where} "
                                              f"(up to {boot_timeout():.0f} s)")
        host.executor = host.provider.connect(host.inst)
        if self.stop.is_set():
            host.executor.close()
            return
        self.progress.state(host.vm.name, "bootstrapping")
        host.executor.ensure_workloads(self.wheels.source(self._bucket(host)))
        if self.spec.profile and not host.profiler_checked:  # only when --profile asks
            host.profiler_checked = True
            problem = host.executor.ensure_profiler(self.spec.profile)
            if problem:
                self.progress.log(f"[yellow]warning:[/yellow] {problem}; its profiled trials "
                                  "will say there is no profile")

    def _run(self, host: _Host, argv: list[str], what: str) -> CommandResult:
        assert host.executor is not None
        result = host.executor.run(argv, timeout=3600)
        if result.exit_code != 0:
            raise RemoteCommandError(f"{what} failed on {host.vm.name} "
                                     f"(exit {result.exit_code}): {_last_line(result)}")
        return result

    def _put_manifest(self, host: _Host, entries: list[dict[str, Any]], name: str) -> str:
        assert host.executor is not None
        remote = posixpath.join(host.executor.workdir, "manifests", name)
        if remote not in host.manifests:
            host.manifests.append(remote)  # before the write: a partial one is removed too
        host.executor.put_bytes(json.dumps(entries).encode(), remote)
        return remote

    def _stage_inputs(self, host: _Host) -> None:
        """Inputs onto the host: signed URLs fetched in parallel there, else copied over."""
        if self.inputs is None:
            return
        ex = host.executor
        assert ex is not None and self.inputs.local_dir is not None
        dest = posixpath.join(ex.workdir, "inputs", self.inputs.hash)
        if self._bucket(host) is not None:
            manifest = self._put_manifest(host, self.input_manifest, "inputs.json")
            self._run(host, [ex.python, "-m", "workloads.transfer", "get", manifest, dest],
                      "fetching the inputs")
        else:
            for rel, _ in self.inputs.files:
                ex.put(self.inputs.local_dir / rel, posixpath.join(dest, rel))
        host.inputs_dir = dest

    def _stage_job(self, host: _Host) -> None:
        """The user's job onto the host and its --setup: once per (hash, setup) in the host's
        cache, reused by later sweeps there (``jobs.stage_on_host``)."""
        if self.job is None:
            return
        from orchestrator.engine import jobs

        ex = host.executor
        assert ex is not None
        self.progress.state(host.vm.name, "shipping the job")
        host.job_dir, unpacked = jobs.stage_on_host(
            ex, self.job, self._bucket(host),
            lambda entries, name: self._put_manifest(host, entries, name), self.spec.setup,
            url_lifetime_s=self.url_lifetime_s)
        self.store.record_vm(host.vm.name, job={"hash": self.job.hash, "dir": host.job_dir,
                                                "copy": unpacked})
        if self.spec.setup:
            self.progress.state(host.vm.name, "running --setup")
            log = self.store.run_dir / "setup" / f"{host.vm.name}.log"
            state = jobs.setup_on_host(ex, host.job_dir, self.spec.setup, log)
            self.store.record_vm(host.vm.name, setup=state, setup_log=str(log),
                                 setup_done_at=now_iso())

    # -- one trial ---------------------------------------------------------------

    def _run_trial(self, host: _Host, trial: TrialPlan) -> None:
        key = host.vm.name
        if self.resuming and self._collect_earlier(host, trial, None):
            return  # the last run's VM put it in the bucket before that run ended
        last_dir: str | None = None
        last_error = ""
        for attempt in range(TRIAL_ATTEMPTS):
            if self.stop.is_set():
                return
            if attempt:
                self.progress.log(f"[yellow]{trial.trial_id}: {last_error}; retrying on the "
                                  f"same machine ({attempt + 1}/{TRIAL_ATTEMPTS})")
                if self.stop.wait(RETRY_BACKOFF_S * 2 ** (attempt - 1)):
                    return
                self._check_alive(host)
                if host.provider.creates_machines:
                    self.progress.log(f"{host.vm.machine.name}: reconnecting — waiting for SSH "
                                      f"on {host.inst.address if host.inst else key}")
                try:
                    self._connect(host)
                    if self._collect_earlier(host, trial, last_dir):
                        return
                except UnreachableError:
                    if self.stop.is_set():
                        return
                    raise  # the reconnect budget is spent: the machine is unreachable
                except RETRYABLE as exc:
                    last_error = one_line(exc)
                    continue
            ex = host.executor
            assert ex is not None
            out_dir = posixpath.join(ex.workdir, "trials",
                                     f"{trial.trial_id}-{self.attempt_nonce}-{attempt}")
            last_dir = out_dir
            put = self._results_put(host, trial, out_dir)  # the runner puts its own results
            request = self._on_host(host, trial, out_dir, put.manifest)
            argv = request.argv()
            warm = host.warm
            if warm is not None and warm.ready.is_set() and self._warm_eligible(host, trial):
                argv = warm.argv(argv)
            else:
                argv = [ex.python, "-m", "workloads.run", *argv]
            limit = self.timeouts.limit(trial)
            self.progress.trial_started(key, trial, self.spec.duration_s, limit)
            started = time.monotonic()
            try:
                try:
                    result = ex.run(argv, timeout=limit, on_line=put.watch(
                        lambda line: self.progress.line(key, line)))
                except RemoteCommandError as exc:  # an SSH host stops it at the limit and says so
                    if time.monotonic() - started < limit:
                        raise
                    result = CommandResult(exit_code=-1, stdout_tail="", stderr_tail=str(exc))
                elapsed = time.monotonic() - started
                if self.stop.is_set() and result.exit_code != protocol.EXIT_OK:
                    self._collect(host, trial, out_dir, result, interrupted=True)
                    return
                self._upload_results(host, trial, put)
                timed_out = elapsed >= limit and result.exit_code != protocol.EXIT_OK
                self._collect(host, trial, out_dir, result,
                              error=timeouts.reason(limit) if timed_out else None)
                if not timed_out and result.exit_code == protocol.EXIT_OK:
                    self.timeouts.finished(trial, elapsed)
                return
            except ProviderError as exc:
                if self.stop.is_set():
                    return
                if not isinstance(exc, RETRYABLE):
                    raise
                last_error = f"connection lost: {one_line(exc)}"
        self._record(host, trial, None, None, status="failed",
                     error=f"gave up after {TRIAL_ATTEMPTS} attempts: {last_error}")

    def _check_alive(self, host: _Host) -> None:
        """Raise _Preempted when the provider no longer lists a running instance."""
        if not host.provider.creates_machines or host.inst is None:
            return
        try:
            found = host.provider.list({LABEL_SWEEP: slug(self.plan.sweep_id)})
        except ProviderError:
            return  # cannot tell: let the retry find out
        mine = [i for i in found if i.id == host.inst.id or i.name == host.inst.name]
        if not mine or mine[0].state.lower() in GONE_STATES:
            state = mine[0].state if mine else "gone"
            raise _Preempted(f"instance {host.inst.name} is {state} (spot preemption?)")

    def _result_keys(self, trial: TrialPlan) -> dict[str, str]:
        prefix = f"{_results_prefix(self.plan)}{trial.trial_id}"
        names = (protocol.SUMMARY_FILE, protocol.TIMESERIES_FILE)
        return {name: f"{prefix}/{name}"
                for name in names + (JOB_LOG,) + (protocol.PROFILE_FILES if trial.profiled else ())}

    def _results_put(self, host: _Host, trial: TrialPlan, out_dir: str) -> _ResultsPut:
        """The trial's put manifest (a signed PUT URL per result file), on the host before the
        trial: its runner puts the files itself (``--put``), in the process that wrote them."""
        bucket = self._bucket(host)
        if bucket is None:
            return _ResultsPut()
        entries = [{"path": posixpath.join(out_dir, name), "optional": True,
                    "url": bucket.signed_url(key, "PUT", expires_s=self.url_lifetime_s)}
                   for name, key in self._result_keys(trial).items()]
        try:
            return _ResultsPut(self._put_manifest(host, entries, f"put-{trial.trial_id}.json"),
                               entries)
        except ProviderError:  # the trial still runs; the put after it writes the manifest
            return _ResultsPut(None, entries)

    def _upload_results(self, host: _Host, trial: TrialPlan, put: _ResultsPut) -> None:
        """The host puts its result files in the bucket, where a dropped session cannot lose
        them: the runner did (``put.done``), else a ``transfer put`` process does it now (a
        runner killed, crashed or without ``--put``, or one that says its put failed)."""
        if self._bucket(host) is None or put.done:
            return
        ex = host.executor
        assert ex is not None
        try:
            manifest = put.manifest or self._put_manifest(host, put.entries,
                                                          f"put-{trial.trial_id}.json")
            result = ex.run([ex.python, "-m", "workloads.transfer", "put", manifest],
                            timeout=600)
            reason = None if result.exit_code == 0 else _last_line(result)
        except ProviderError as exc:  # a finished trial is still collected directly below
            reason = one_line(exc)
        if reason:
            self.progress.log(f"[yellow]{trial.trial_id}: results not copied to the bucket: "
                              f"{reason}")

    def _incoming(self, trial: TrialPlan) -> Path:
        path = self.store.run_dir / ".incoming" / trial.trial_id
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def _collect_earlier(self, host: _Host, trial: TrialPlan, out_dir: str | None) -> bool:
        """A retried trial's result may already exist: in the bucket first, else on the host."""
        bucket = self._bucket(host)
        if bucket is not None:
            keys = self._result_keys(trial)
            local = self._incoming(trial)
            prefix = keys[protocol.SUMMARY_FILE].rsplit("/", 1)[0]
            try:  # list() takes a directory-like prefix: the trial's, not the key itself
                present = bucket.list(prefix)
            except CloudprofError:
                present = {}
            if keys[protocol.SUMMARY_FILE] in present:
                bucket.download_dir(prefix, local)
                summary = _read_summary(local / protocol.SUMMARY_FILE)
                if summary and summary.get("status") != "interrupted":
                    self._record(host, trial, summary, local / protocol.TIMESERIES_FILE)
                    self.progress.log(f"{trial.trial_id}: result fetched from the bucket")
                    return True
        if out_dir is not None:
            local = self._incoming(trial)
            summary, ts = self._fetch(host, out_dir, local)
            if summary and summary.get("status") != "interrupted":
                self._record(host, trial, summary, ts)
                self.progress.log(f"{trial.trial_id}: result fetched from the machine")
                return True
        return False

    def _fetch(self, host: _Host, out_dir: str,
               local: Path) -> tuple[dict[str, Any] | None, Path | None]:
        ex = host.executor
        assert ex is not None
        try:
            ex.get(posixpath.join(out_dir, protocol.SUMMARY_FILE), local / protocol.SUMMARY_FILE)
        except FileNotFoundError:
            return None, None
        ts: Path | None = local / protocol.TIMESERIES_FILE
        try:
            ex.get(posixpath.join(out_dir, protocol.TIMESERIES_FILE), ts)
        except FileNotFoundError:
            ts = None
        if self.spec.command is not None:  # the job's own output, kept in the store
            with contextlib.suppress(FileNotFoundError):
                ex.get(posixpath.join(out_dir, JOB_LOG), local / JOB_LOG)
        summary = _read_summary(local / protocol.SUMMARY_FILE)
        for name in ((summary or {}).get("profile") or {}).get("files") or []:
            if name in protocol.PROFILE_FILES:  # names from the host: only the known ones
                with contextlib.suppress(FileNotFoundError):
                    ex.get(posixpath.join(out_dir, name), local / name)
        return summary, ts

    def _collect(self, host: _Host, trial: TrialPlan, out_dir: str, result: CommandResult,
                 interrupted: bool = False, error: str | None = None) -> None:
        """``error``: the engine's own reason to fail the trial (its time limit)."""
        local = self._incoming(trial)
        summary, ts = self._fetch(host, out_dir, local)
        status = None
        if error is not None:
            status = "failed"
        elif interrupted:
            status = "interrupted"
            error = "the sweep was interrupted during this trial"
        elif summary is None:
            status = "failed"
            error = f"runner exited {result.exit_code} without a summary: {_last_line(result)}"
        elif result.exit_code not in (protocol.EXIT_OK, protocol.EXIT_MEMORY_BUDGET) \
                and not summary.get("error"):
            error = f"runner exited {result.exit_code}: {_last_line(result)}"
        self._record(host, trial, summary, ts, status=status, error=error,
                     exit_code=result.exit_code)

    def _record(self, host: _Host, trial: TrialPlan, summary: dict[str, Any] | None,
                ts: Path | None, status: str | None = None, error: str | None = None,
                exit_code: int | None = None) -> None:
        provider = host.provider
        if provider.creates_machines:
            ran_on = host.vm.machine.name
        elif provider.name == "local" or host.inst is None:
            ran_on = provider.name
        else:  # the user's own host (ssh): which one it was
            ran_on = host.inst.name
        row = trial_row(summary, host.vm.machine, trial=trial, sweep_id=self.plan.sweep_id,
                        ran_on=ran_on, provider=provider.name, spot=host.vm.spot, status=status,
                        error=error, exit_code=exit_code)
        if trial.trial_id in self.limit_meta:  # kept apart too: see results/limits.py
            from orchestrator.results.limits import record_limit

            rec = record_limit(self.store, row, summary, self.limit_meta[trial.trial_id])
            self.limit_meta[trial.trial_id] = rec
            shutil.rmtree(self.store.run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
            mark, what = (("[green]✓[/green]", "ran unchanged") if rec["ran_unchanged"]
                          else ("[red]✗[/red]", row.get("error") or row.get("status")))
            self.progress.log(f"  {mark} {trial.trial_id}: {what} "
                              f"(memory limit {fmt_bytes(rec['limit_bytes'])})")
            return
        if trial.profiled:  # kept apart from the throughput trials: see results/profiles.py
            from orchestrator.results.profiles import record_profile

            record_profile(self.store, row, summary, ts)
            shutil.rmtree(self.store.run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
            self.progress.trial_done(host.vm.name, row)
            return
        self.store.record_trial(row, ts if ts is not None and ts.is_file() else None)
        _keep_summary(self.store.run_dir, trial.trial_id)
        log = self.store.run_dir / ".incoming" / trial.trial_id / JOB_LOG
        if log.is_file():
            (self.store.run_dir / "logs").mkdir(exist_ok=True)
            shutil.copyfile(log, self.store.run_dir / "logs" / f"{trial.trial_id}.log")
        shutil.rmtree(self.store.run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
        self.progress.trial_done(host.vm.name, row)


# What a local disk or directory says when it stops taking writes (remote failures are
# ProviderErrors by then): full, over quota, file size limit, read-only, permissions, or a
# path turned into something else under the sweep.
LOCAL_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS,
                                errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR,
                                errno.EISDIR, errno.EIO})


def _local_write_error(exc: OSError) -> bool:
    return exc.errno in LOCAL_WRITE_ERRNOS


def profile_ids(run_dir: Path, done_only: bool = False) -> set[str]:
    """Profiled trials recorded under profiles/ (they are not rows of trials.parquet)."""
    from orchestrator.results.profiles import profiled_trial_ids

    return profiled_trial_ids(run_dir, done_only=done_only)


SUMMARIES_DIR = "summaries"  # summaries/<trial_id>.json: each trial's summary.json, as it came


def _keep_summary(run_dir: Path, trial_id: str) -> None:
    """Keep the trial's summary.json in the store (every provider: a cloud VM's is gone with
    it), for what trials.parquet does not hold: spikes, the peak's bases, the leak fit."""
    src = run_dir / ".incoming" / trial_id / protocol.SUMMARY_FILE
    if src.is_file():
        (run_dir / SUMMARIES_DIR).mkdir(exist_ok=True)
        shutil.copyfile(src, run_dir / SUMMARIES_DIR / f"{trial_id}.json")


def failed_profiles(run_dir: Path) -> list[dict[str, Any]]:
    """The records of the profiled trials that did not finish ok."""
    from orchestrator.results.profiles import load_profiles

    return [r for r in load_profiles(run_dir) if r.get("status") != "ok"]


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None



def _last_line(result: CommandResult) -> str:
    """The runner's last words, its progress lines left out."""
    return result.last_line(skip=lambda ln: protocol.parse_progress(ln) is not None)


def _exec_provider_name(spec: SweepSpec, vm: VmPlan) -> str:
    """Where a VM's trials really run: on this machine for --dry-run."""
    return "local" if spec.dry_run else vm.provider


# ---------------------------------------------------------------------- entry point


def _prices(plan: Plan) -> dict[str, Any]:
    return {vm.machine.name: {**asdict(vm.machine), "spot": vm.spot,
                              "price_per_hour": vm.machine.price(vm.spot)} for vm in plan.vms}


def _build_providers(spec: SweepSpec, plan: Plan, run_dir: Path | None,
                     sweep_id: str) -> tuple[dict[str, Provider], Any]:
    """One provider per name the plan runs on; SSH keys first for those that create VMs.

    With ``run_dir`` None the providers are only for the credentials check.
    """
    from orchestrator.providers import get_provider, provider_class

    names = sorted({_exec_provider_name(spec, vm) for vm in plan.vms})
    keys = None
    if run_dir is not None and any(provider_class(n).creates_machines for n in names):
        from orchestrator.providers.remote import SshKeys

        keys = SshKeys.for_sweep(run_dir, spec.ssh_key)
    out = {}
    for name in names:
        options = ProviderOptions(
            region=spec.region, zone=spec.zone, project=spec.project,
            hosts_file=spec.hosts_file, hosts=list(spec.hosts), ssh_key=spec.ssh_key,
            workdir=(run_dir / "hosts") if run_dir is not None else None,
            ssh=keys, sweep_id=sweep_id)
        out[name] = get_provider(name, options)
    return out, keys


def signed_url_lifetime(plan: Plan) -> int:
    """How long the URLs a VM gets stay valid: as long as the sweep's VMs may live (their
    estimate × 1.5 + the margin, the expiry label), within SigV4's and GCS's 7-day limit."""
    longest = max((_expiry(0.0, vm) for vm in plan.vms), default=EXPIRY_MARGIN_S)
    return int(min(longest, SIGNED_URL_MAX_S))


_BUCKET_CLOUDS = {"gs": "gcp", "s3": "aws"}


def bucket_serves(url: str | None, providers: set[str]) -> set[str]:
    """The providers (of ``providers``, those the plan runs on) whose hosts use the bucket.

    A sweep on one provider uses it for every host, as given. A sweep across
    providers uses a ``gs://`` bucket for its GCP VMs and an ``s3://`` one for its AWS
    VMs only: they reach their own cloud's storage inside it, while another cloud's VM
    or an SSH host would pay egress on every input and result; those hosts get their
    files over SSH instead, as without a bucket."""
    if url is None:
        return set()
    if len(providers) <= 1:
        return set(providers)
    cloud = _BUCKET_CLOUDS.get(url.partition("://")[0])
    return {cloud} & providers if cloud else set()


def _open_bucket(spec: SweepSpec, providers: Iterable[str]) -> Bucket | None:
    """The sweep's bucket; a dry run never touches a cloud one (it makes no cloud call).
    None when no host would use it (a sweep across providers, none of them its cloud's).

    ``providers`` are the names the plan runs on."""
    cloud = spec.bucket is not None and spec.bucket.startswith(("gs://", "s3://"))
    names = set(providers)
    if spec.bucket and not bucket_serves(spec.bucket, names):
        return None
    if spec.bucket and not (spec.dry_run and cloud):
        from orchestrator.providers import open_bucket

        return open_bucket(spec.bucket)
    if names == {"local"}:
        from orchestrator.providers.local import LocalBucket

        return LocalBucket()
    return None  # inputs are copied to each host over its executor


def run_sweep(spec: SweepSpec, *, resume: Path | None = None,
              console: Console | None = None, plan_only: bool = False) -> Path | None:
    """Run (or resume) a sweep and return its run directory.

    ``plan_only`` prints the plan and its estimate and returns None: no credentials
    are asked for, no input is generated, no VM or run directory is created.

    Raises BudgetError before anything starts when the estimate is above
    ``max_cost``; CredentialsError unless ``dry_run``; MemoryGateError after
    everything is recorded and reported when a trial peaked above
    ``max_peak_memory``; PartialSweepError when some machine or trial failed;
    SweepInterruptedError after teardown on Ctrl-C, SIGTERM, SIGHUP or SIGQUIT.
    """
    if console is None:
        from rich.console import Console

        console = Console()
    started: list[Path] = []  # the run directory, once it exists
    with sweep_signals() as signals:
        try:
            run_dir = _run(spec, resume, console, started, plan_only)
        except KeyboardInterrupt as exc:
            signals.raised = True  # from here on a signal only warns
            raise _interrupted(started, signals.signum or signum_of(exc)) from None
        except TeardownError:
            raise  # a VM may still be billing: louder than the interrupt
        except CloudprofError:
            if not signals.raised:
                raise
            raise _interrupted(started, signals.signum) from None
        if signals.raised:  # a signal the teardown absorbed: still exit 130
            raise _interrupted(started, signals.signum)
        return run_dir


def _interrupted(started: list[Path], signum: int | None = None) -> SweepInterruptedError:
    run_dir = started[0] if started else None
    if run_dir is not None:
        _settle_status(run_dir)
    where = f"; resume with: cloudprof sweep --resume {run_dir}" if run_dir else ""
    by = f" by {signal.Signals(signum).name}" if signum not in (None, signal.SIGINT) else ""
    return SweepInterruptedError(f"interrupted{by}: every machine was torn down{where}",
                                 run_dir)


def _settle_status(run_dir: Path) -> None:
    """An interrupted sweep never stays ``running`` in sweep.json, wherever the signal hit."""
    store = RunStore(run_dir)
    with contextlib.suppress(OSError, ValueError):
        if store.read_sweep().get("status") in ("running", "planned"):
            store.set_status("interrupted", finished_at=now_iso())


def _limit_note(spec: SweepSpec, console: Console) -> None:
    """--prove-limit/--find-limit add trials the plan's estimate does not count: say how many."""
    if spec.find_limit or spec.prove_limit:
        from orchestrator.engine.limits import MAX_STEPS

        most = 2 + MAX_STEPS if spec.find_limit else 1
        flag = "--find-limit" if spec.find_limit else "--prove-limit"
        console.print(f"[yellow]note:[/yellow] {flag} adds up to {most} trial(s) per machine "
                      "and worker count under a memory limit, after the others; the "
                      "estimates above do not count them.",
                      highlight=False)


def _run(spec: SweepSpec, resume: Path | None, console: Console, started: list[Path],
         plan_only: bool = False) -> Path | None:
    done: set[str] = set()
    if resume is not None:
        store = RunStore.open(resume)
        done = store.done_trial_ids()
        data = store.read_sweep()
        try:
            spec = SweepSpec.from_dict(data["spec"])
            plan = Plan.from_dict(data["plan"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"cannot resume {resume}: sweep.json lacks a valid spec and "
                             f"plan ({exc!r})") from None
        inputs = plan_inputs(spec)
        job = _pack_job(spec)
    else:
        machines = lookup_machines(spec)
        sweep_id = new_sweep_id()
        inputs = plan_inputs(spec)
        job = _pack_job(spec)  # a workdir above the limit stops here, before anything exists
        plan = make_plan(spec, sweep_id, machines, input_bytes=inputs.size if inputs else 0)
        if inputs is not None:
            predicted = inputs.local_dir is None  # the cube's files are not generated yet
            plan.uploads = [Upload(f"{inputs.prefix}/{rel}", size, predicted)
                            for rel, size in inputs.files]
        if job is not None:
            plan.uploads.append(Upload(job.key, job.path.stat().st_size))
        cost = plan.total_cost_usd
        if spec.max_cost is not None and cost is not None and cost > spec.max_cost:
            if plan_only:
                render_plan(plan, console, spec.dry_run)
            raise BudgetError(f"estimated cost {fmt_usd(cost)} is above --max-cost "
                              f"{fmt_usd(spec.max_cost)}; nothing was started")
        if (spec.max_cost is None and cost is not None and cost > UNASKED_COST_USD
                and not (plan_only or spec.dry_run)):  # a large bill is asked for, not assumed
            raise BudgetError(f"estimated cost {fmt_usd(cost)} is above "
                              f"{fmt_usd(UNASKED_COST_USD)}: give --max-cost to accept it "
                              "(--plan shows it); nothing was started")
        store = None
    names = {_exec_provider_name(spec, vm) for vm in plan.vms}
    if plan_only:
        render_plan(plan, console, spec.dry_run, done=done)
        _bucket_note(spec, names, console)
        console.print(f"Time limit: {timeouts.describe(spec)}", highlight=False)
        _limit_note(spec, console)
        return None
    if not spec.dry_run:
        checkers, _ = _build_providers(spec, plan, None, plan.sweep_id)
        for provider in checkers.values():
            provider.check_credentials()
        for vm in plan.vms:  # ssh: the group's hosts alike (read from them), before anything
            if vm.nodes > 1:
                provider = checkers[_exec_provider_name(spec, vm)]
                for warning in provider.check_nodes(vm.machine.name, vm.nodes):
                    console.print(f"[yellow]warning:[/yellow] {warning}")
        if any(provider.creates_machines for provider in checkers.values()):
            from orchestrator.providers.remote import boot_timeout

            boot_timeout()  # a bad CLOUDPROF_SSH_BOOT_TIMEOUT fails here, before any VM exists
    bucket = _open_bucket(spec, names)
    if bucket is not None and spec.bucket:  # a missing bucket (or no access) fails here,
        # before any run directory or VM exists
        bucket.list(_results_prefix(plan))
    render_plan(plan, console, spec.dry_run, done=done)
    _bucket_note(spec, names, console)
    console.print(f"Time limit: {timeouts.describe(spec)}", highlight=False)
    _limit_note(spec, console)

    if inputs is not None:
        generate_inputs(inputs, console)  # once, then cached: a bar of frames while it runs
        plan.uploads = [Upload(f"{inputs.prefix}/{rel}", size) for rel, size in inputs.files]
        if job is not None:
            plan.uploads.append(Upload(job.key, job.path.stat().st_size))
    if store is None:
        # Its empty trials table is written by the engine once the machine threads have
        # started (their provisioning and warm runners need sweep.json only), or at the
        # latest below, however the sweep ends.
        store = RunStore.create(Path(spec.out) / plan.sweep_id, {
            "sweep_id": plan.sweep_id, "spec": spec.to_dict(), "plan": plan.to_dict(),
            "prices": _prices(plan), "dry_run": spec.dry_run,
            "ran_on": "local" if spec.dry_run else None,
            "inputs": {"hash": inputs.hash, "prefix": inputs.prefix,
                       "local_dir": str(inputs.local_dir)} if inputs else None,
            "job": {"hash": job.hash, "prefix": job.prefix, "source": str(job.source),
                    "files": job.files, "bytes": job.size} if job else None,
        }, trials_table=False)
    run_dir = store.run_dir
    store.guard = signals_deferred  # a signal never cuts a sweep.json write short
    started.append(run_dir)
    with store.running():
        if resume is not None:
            # again under the lock: what the plan showed may be older
            done = store.done_trial_ids() | profile_ids(store.run_dir, done_only=True)
            store.update_sweep(machines={})  # this run's outcome per machine replaces the last
            console.print(f"Resuming sweep {plan.sweep_id}: {len(done)} trial(s) already done.")
        try:
            return _execute(spec, plan, store, bucket, inputs, done, console, job,
                            resuming=resume is not None)
        finally:
            # A sweep that stopped before its engine wrote it still leaves a whole store
            # (its status says why); a disk that refuses it was reported already.
            with contextlib.suppress(OSError):
                store.ensure_trials_table()


def _bucket_note(spec: SweepSpec, providers: set[str], console: Console) -> None:
    """Say which hosts of a sweep across providers use --bucket, and which get their
    files over SSH (see ``bucket_serves``)."""
    if not spec.bucket or len(providers) <= 1:
        return
    served = bucket_serves(spec.bucket, providers)
    others = ", ".join(sorted(providers - served))
    used = (f"the {', '.join(sorted(served))} VMs use it; the {others} hosts" if served
            else "no cloud of this sweep holds it, so every host")
    console.print(f"Bucket {spec.bucket}: {used} get their inputs and results over SSH.",
                  highlight=False)


def _pack_job(spec: SweepSpec) -> Any:
    """The --workdir archive (orchestrator.engine.jobs.JobArchive), or None."""
    if spec.workdir is None:
        return None
    from orchestrator.engine.jobs import pack_workdir

    return pack_workdir(spec.workdir)


def _execute(spec: SweepSpec, plan: Plan, store: RunStore, bucket: Bucket | None,
             inputs: StagedInputs | None, done: set[str], console: Console,
             job: Any = None, resuming: bool = False) -> Path:
    run_dir = store.run_dir
    providers, keys = _build_providers(spec, plan, run_dir, plan.sweep_id)
    facts: dict[str, Any] = {}
    if spec.dry_run:
        from orchestrator.providers.local import host_facts

        facts["local_host"] = host_facts()
    # One rewrite of sweep.json (each is a flushed write) before the machines start
    store.set_status("running", started_at=now_iso(),
                     bucket=bucket.url if bucket is not None else None, **facts)

    todo = {vm.name: [t for t in vm.trials if t.trial_id not in done] for vm in plan.vms}
    if spec.adaptive:  # --resume: a machine whose adaptive loop finished needs no VM again
        vms = store.read_sweep().get("vms") or {}
        todo = {name: [] if (vms.get(name) or {}).get("adaptive") else left
                for name, left in todo.items()}
    finished = False
    with SweepProgress(console) as progress:
        engine = _Engine(spec, plan, store, bucket, inputs, progress, providers, keys, job)
        engine.resuming = resuming
        if (signals := current_signals()) is not None:
            signals.warn = engine._still_tearing_down
        def stage() -> None:
            if bucket is None:
                return
            _label_prefixes(bucket, plan, inputs)
            if job is not None:  # a cache like the inputs: labelled, kept for later sweeps
                bucket.label_prefix(job.prefix, slug(plan.sweep_id),
                                    max(_expiry(time.time(), vm) for vm in plan.vms),
                                    INPUTS_RETENTION_S)
                progress.log(f"Shipping the job ({job.files} files) to "
                             f"{bucket.url}/{job.prefix}/ ...")
                bucket.upload_dir(job.path.parent, job.prefix)
            if inputs is not None:
                _stage(bucket, inputs, progress)

        engine.stage = stage
        try:
            finished = (_run_search(engine, plan, store, todo) if plan.search
                        else engine.execute(todo))
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            store.set_status(status, finished_at=now_iso(), error=one_line(exc))
            raise
        finally:
            engine.stop.set()
            # Also when a second Ctrl-C cut the first teardown short: delete what is left and
            # wait for the machine threads' own deletions (daemon threads die with the process).
            engine._shielded(engine.teardown_all)
            engine._wait_teardown()
            shutil.rmtree(store.run_dir / ".incoming", ignore_errors=True)
            if keys is not None and all(h.inst is None or h.deleted
                                        for h in engine.hosts.values()):
                keys.remove()  # the per-sweep key pair dies with the last VM that trusted it
            if bucket is not None and engine.write_error is None \
                    and store.reads_back():  # else the bucket holds the only copy
                with contextlib.suppress(Exception):
                    bucket.delete_labelled(_results_prefix(plan))
    left = [host for host in engine.hosts.values() if host.delete_error is not None]
    if left:  # it may still be billing: this outcome wins over every other one
        if finished and not engine.errors:
            with contextlib.suppress(CloudprofError):
                _finish(spec, plan, store, console)  # the results and report still count
        raise _teardown_failed(spec, plan, store, left)
    if engine.write_error is not None:
        raise _results_write_failed(engine.write_error, plan, store, bucket)
    if not finished:
        store.set_status("interrupted", finished_at=now_iso())
    if engine.errors:
        store.set_status("failed", finished_at=now_iso())
        raise engine.errors[0]
    if not finished:
        raise KeyboardInterrupt
    return _finish(spec, plan, store, console)


def _run_search(engine: _Engine, plan: Plan, store: RunStore,
                todo: dict[str, list[TrialPlan]]) -> bool:
    """``--search``: run the candidate machines one at a time, each the one
    ``plan.search.search_step`` expects to improve most on what was measured.

    Each machine tried is a normal machine of the sweep (``engine.execute`` of
    that one VM: created, its grid or ``--adaptive`` run, torn down). What was
    tried is recorded in sweep.json (``search``) after every machine, so
    ``--resume`` goes on from there and the end of the sweep does not count the
    untried candidates as missing. False when interrupted.
    """
    from orchestrator.plan.search import (
        Candidate,
        describe_confidence,
        objective_value,
        peak_throughput,
        search_step,
    )
    from orchestrator.results.report.measure import trial_rate

    assert plan.search is not None
    goal, budget = plan.search["objective"], int(plan.search["budget"])
    vms = {vm.name: vm for vm in plan.vms}
    spot = engine.spec.spot
    cands = [Candidate(vm.name, vm.machine.vcpus, vm.machine.memory_gib, vm.machine.family,
                       vm.machine.price(spot) or 0.0) for vm in plan.vms]
    tried: list[str] = list((store.read_sweep().get("search") or {}).get("tried") or [])

    def measured() -> dict[str, float]:
        frame = store.trials_frame()
        ok = frame[frame["status"] == "ok"]
        out = {}
        for name in tried:
            rows = ok[ok["machine"] == vms[name].machine.name]
            samples = {int(w): [u for u in map(trial_rate, g.to_dict("records"))
                                if math.isfinite(u)]
                       for w, g in rows.groupby("workers")}
            out[name] = peak_throughput(samples) or 0.0
        return out

    def record(step: Any) -> dict[str, Any]:
        values = measured()
        spent = [vms[n].estimate.cost_usd for n in tried]
        info = {
            **plan.search, **step.to_dict(),
            "pick_machine": vms[step.pick].machine.name if step.pick else None,
            "tried": tried,
            "measured": {vms[n].machine.name: {
                "peak_units_per_s": v,
                goal: objective_value(goal, cands[list(vms).index(n)].price_per_hour, v)
                if v > 0 else None} for n, v in values.items()},
            "estimated_cost_usd": sum(c for c in spent if c is not None),
            "estimated_grid_cost_usd": plan.grid_cost_usd,
            "trials": len(store.trials_frame()),
            "grid_trials": sum(len(vm.trials) for vm in plan.vms),
        }
        store.update_sweep(search=info)
        return info

    again = [n for n in tried if todo.get(n)]  # --resume: a machine cut short goes on first
    while True:
        if again:
            name = again.pop(0)
        else:
            step = search_step(cands, measured(), goal, budget)
            if step.next is None:
                break
            name = step.next
            tried.append(name)
            record(step)
            engine.progress.log(f"--search: trying {vms[name].machine.name} "
                                f"({len(tried)} of at most {budget})")
        if todo.get(name) and not engine.execute({name: todo[name]}):
            return False
        if engine.stop.is_set():
            return False
    info = record(step)
    if info["pick_machine"]:
        conf = ("" if step.confidence is None
                else f", {describe_confidence(step.confidence)} sure it is the best")
        engine.progress.log(
            f"--search {goal}: picked {info['pick_machine']}{conf} of {len(cands)} candidates "
            f"after trying {len(tried)} ({step.stopped}); estimated cost "
            f"{fmt_usd(info['estimated_cost_usd'])} against {fmt_usd(plan.grid_cost_usd or 0.0)} "
            "for every candidate")
    return True


def _stage(bucket: Bucket, inputs: StagedInputs, progress: SweepProgress) -> None:
    """Upload the inputs with a bar of bytes and MiB/s; say what was sent and how fast."""
    progress.log(f"Staging inputs in {bucket.url}/{inputs.prefix}/ ...")
    bar = progress.transfer("staging inputs", inputs.size)
    sent = [0]
    lock = threading.Lock()

    def on_bytes(n: int) -> None:
        with lock:
            sent[0] += n
        if bar is not None:
            bar.add(n)

    started = time.monotonic()
    uploaded = bucket.upload_dir(inputs.local_dir, inputs.prefix, progress=on_bytes)
    seconds = time.monotonic() - started
    if bar is not None:
        bar.set(inputs.size)  # objects already there count as staged
        bar.finish("staged")
    rate = f" at {sent[0] / 2**20 / seconds:,.1f} MiB/s" if sent[0] and seconds > 0 else ""
    progress.log(f"  {len(uploaded)} object(s) uploaded ({sent[0] / 2**20:,.1f} MiB in "
                 f"{seconds:.1f} s{rate}), {len(inputs.files) - len(uploaded)} already there")


def _results_write_failed(exc: OSError, plan: Plan, store: RunStore,
                          bucket: Bucket | None) -> ResultsWriteError:
    """One line: what could not be written, where the results not on disk are, how to go on."""
    run_dir = store.run_dir
    where = f": {exc.filename}" if exc.filename else ""
    kept = (f"results not on disk stay in {bucket.url}/{_results_prefix(plan)}, where --resume "
            "collects them" if bucket is not None else "the trials not on disk run again")
    message = (f"cannot write the results: {exc.strerror or exc}{where}; the sweep stopped, "
               f"every machine was torn down and {kept}; "
               f"{getattr(exc, 'fix', 'free space (or fix permissions)')}, "
               f"then resume with: cloudprof sweep --resume {run_dir}")
    try:
        store.set_status("failed", finished_at=now_iso(), error=message)
    except OSError:
        message = message.replace("; the sweep stopped", "; sweep.json could not be updated "
                                  "either (it still says running); the sweep stopped")
    return ResultsWriteError(message, run_dir)


def _leftovers(host: _Host, sweep_label: str) -> list[str]:
    """What of the sweep the host's cloud still holds (kind, id, zone or region), as the
    cloud lists it now; the VM alone (as last known) when even listing fails."""
    inst = host.inst
    assert inst is not None
    fallback = [f"instance {inst.id} ({inst.name}) in {inst.zone or host.vm.region}"]
    labels = {LABEL_SWEEP: sweep_label}
    try:
        found = host.provider.list_resources(labels)
    except Exception:  # the cloud is failing: say what is known
        return fallback
    lines = []
    for res in found:
        where = res.zone or res.region
        name = f" ({res.name})" if res.name and res.name != res.id else ""
        lines.append(f"{res.kind} {res.id}{name}" + (f" in {where}" if where else ""))
    return lines or fallback


def _teardown_failed(spec: SweepSpec, plan: Plan, store: RunStore,
                     left: list[_Host]) -> TeardownError:
    """The error (and sweep.json status) for VMs that could not be deleted: each resource
    left, why, and the command that deletes them."""
    sweep_label = slug(plan.sweep_id)
    several = len({vm.provider for vm in plan.vms}) > 1  # say whose cloud holds each one
    resources: list[str] = []
    for host in left:
        found = [f"{host.provider.name} {r}" if several else r
                 for r in _leftovers(host, sweep_label)]
        resources += [r for r in found if r not in resources]
    reasons = "; ".join(f"{h.vm.name}: {h.delete_error}" for h in left)
    command = f"cloudprof cleanup --sweep {plan.sweep_id} --yes"
    if spec.project and any(h.provider.name == "gcp" for h in left):
        import shlex  # cleanup finds the project where the SDK does: give it the sweep's

        command = f"GOOGLE_CLOUD_PROJECT={shlex.quote(spec.project)} {command}"
    message = (f"COULD NOT DELETE {len(resources)} resource(s) of sweep {plan.sweep_id} after "
               f"{DELETE_ATTEMPTS} attempts — they may still be billing: "
               f"{'; '.join(resources)} (why: {reasons}). Delete them now with: {command}")
    store.set_status("teardown_failed", finished_at=now_iso(), error=message,
                     left_resources=resources, cleanup_command=command)
    return TeardownError(message, store.run_dir)


def _expiry(now: float, vm: VmPlan) -> float:
    """When ``vm`` powers itself off: its estimate plus 50% and a margin."""
    return now + vm.estimate.total_s * 1.5 + EXPIRY_MARGIN_S


def _results_prefix(plan: Plan) -> str:
    return f"results/{slug(plan.sweep_id)}/"


def _label_prefixes(bucket: Bucket, plan: Plan, inputs: StagedInputs | None) -> None:
    """Label the prefixes the sweep writes before anything goes under them, so that
    `cloudprof cleanup` finds them if this process dies before its ``finally``."""
    now = time.time()
    expires = max((_expiry(now, vm) for vm in plan.vms), default=now + EXPIRY_MARGIN_S)
    sweep = slug(plan.sweep_id)
    bucket.label_prefix(_results_prefix(plan), sweep, expires, RESULTS_RETENTION_S)
    if inputs is not None:
        bucket.label_prefix(inputs.prefix, sweep, expires, INPUTS_RETENTION_S)


def _finish(spec: SweepSpec, plan: Plan, store: RunStore, console: Console) -> Path:
    """Status, report, then the exit-code decisions: memory gate first, then partial."""
    run_dir = store.run_dir
    rows = store.trial_rows()  # pyarrow alone: a plain sweep never imports pandas
    sweep = store.read_sweep()
    failed_machines = {m: v for m, v in sweep.get("machines", {}).items()
                       if v.get("status") in ("failed", "preempted")}
    # --adaptive: a machine whose loop finished ran what it needed, not the grid's ids
    vms = sweep.get("vms") or {}
    searched = set((sweep.get("search") or {}).get("tried") or [vm.name for vm in plan.vms])
    planned = {t.trial_id for vm in plan.vms for t in vm.trials
               if not (vms.get(vm.name) or {}).get("adaptive") and vm.name in searched}
    # A profiled trial that failed is a failed trial, though it is kept under profiles/
    bad = [r for r in rows if r["status"] != "ok"] + failed_profiles(run_dir)
    missing = planned - {r["trial_id"] for r in rows} - profile_ids(run_dir)
    partial = bool(failed_machines or len(bad) or missing)
    store.set_status("partial" if partial else "done", finished_at=now_iso())
    try:
        from orchestrator.results.report import report_run

        html = report_run(run_dir, console)
        # one last line: the report to open; the results store is the folder it is in
        console.print(f"Report: {html} (report.md beside it)", soft_wrap=True)
    except CloudprofError as exc:
        console.print(f"[yellow]No report: {exc}")
        console.print(f"Results store: {run_dir}")

    limit = spec.max_peak_memory
    # The whole lifetime (loading included) unless --max-peak-memory trial:SIZE said
    column = "peak_rss_trial_bytes" if spec.peak_gate == "trial" else "peak_rss_bytes"
    if rows and column not in rows[0]:  # a store written before the trial's own peak had one
        column = "peak_rss_bytes"
    if limit is not None and rows:
        over = [r for r in rows if r.get(column) is not None and float(r[column]) > limit]
        if over:
            worst = max(over, key=lambda r: float(r[column]))  # the first of equal peaks
            what = "during the trial" if column == "peak_rss_trial_bytes" else (
                "over the trial process's lifetime, loading included")
            err = MemoryGateError(
                f"memory gate: {len(over)} trial(s) peaked above {limit / 2**20:.1f} MiB "
                f"{what}; worst {worst['trial_id']} at {float(worst[column]) / 2**20:.1f} MiB"
                f"{' (while loading)' if worst.get('peak_phase') == 'load' else ''} "
                f"(results in {run_dir})")
            err.run_dir = run_dir  # type: ignore[attr-defined]
            raise err
    if partial:
        parts = [f"{m} {v.get('status')}: {v.get('error') or ''}".strip()
                 for m, v in failed_machines.items()]
        if len(bad):
            parts.append(f"{len(bad)} trial(s) not ok")
        if missing:
            parts.append(f"{len(missing)} trial(s) not run")
        raise PartialSweepError(f"sweep finished with failures ({'; '.join(parts)}); "
                                f"resume with: cloudprof sweep --resume {run_dir}", run_dir)
    return run_dir
