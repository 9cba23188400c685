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
import hashlib
import json
import posixpath
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine.progress import SweepProgress
from orchestrator.errors import (
    BudgetError,
    CapacityError,
    CloudprofError,
    ConnectionLostError,
    MemoryGateError,
    PartialSweepError,
    ProviderError,
    RemoteCommandError,
    SweepInterruptedError,
    UnreachableError,
    UsageError,
    one_line,
)
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
from orchestrator.results.store import RunStore, now_iso
from orchestrator.spec.spec import SweepSpec
from workloads import protocol

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
INPUT_PARAMS = {"frames": "frames", "rows": "rows", "cols": "cols", "seed": "seed",
                "format": "fmt"}
RETRYABLE = (ConnectionLostError, UnreachableError)  # worth a retry of the trial on the same VM
GONE_STATES = {"terminated", "stopped", "stopping", "shutting-down", "suspended", "deleted"}


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into what Ctrl-C raises so that both take the same teardown path."""


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
        files = sorted(p for p in directory.rglob("*") if p.is_file())
        listing = [(p.relative_to(directory).as_posix(), p.stat().st_size) for p in files]
        digest = hashlib.sha256()
        for p, (rel, size) in zip(files, listing, strict=True):
            digest.update(f"{rel}:{size}:{p.stat().st_mtime_ns}\n".encode())
        return StagedInputs(digest.hexdigest()[:16], listing, local_dir=directory)
    if spec.workload != "cube":
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


def generate_inputs(inputs: StagedInputs) -> Path:
    """Generate (or find in the cache) the inputs; the real file list replaces the predicted one."""
    if inputs.local_dir is None:
        from workloads.inputs import ensure_inputs

        inputs.local_dir = ensure_inputs(inputs.cube_spec)
    files = sorted(p for p in inputs.local_dir.rglob("*") if p.is_file())
    inputs.files = [(p.relative_to(inputs.local_dir).as_posix(), p.stat().st_size)
                    for p in files]
    return inputs.local_dir


# ---------------------------------------------------------------------- machines


def lookup_machines(spec: SweepSpec) -> list[MachineType]:
    """Catalog rows of the spec's machines; local/ssh machines may be off-catalog."""
    from orchestrator.errors import UnknownMachineError
    from orchestrator.spec.catalog import MachineType, lookup

    out = []
    for name in spec.machines:
        if spec.provider in (None, "gcp", "aws"):
            out.append(lookup(name, spec.provider, spec.region))
            continue
        try:
            out.append(lookup(name))
        except UnknownMachineError:
            if not spec.workers:
                raise UsageError(f"{name!r} is not in the catalog, so its vCPU count is "
                                 "unknown: give --workers") from None
            out.append(MachineType(provider=spec.provider, name=name, family="", vcpus=0,
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
    deleted: bool = False
    profiler_checked: bool = False  # --profile: its tool installed (or tried) on this host
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set as the machine thread's very last step. The main thread polls this rather
    # than Thread.join(): on CPython < 3.13 a Ctrl-C landing inside join() can mark a
    # thread that is still deleting its VM as finished (cpython issue 90882).
    done: threading.Event = field(default_factory=threading.Event)


class _Engine:
    def __init__(self, spec: SweepSpec, plan: Plan, store: RunStore, bucket: Bucket | None,
                 inputs: StagedInputs | None, progress: SweepProgress,
                 providers: dict[str, Provider], ssh_keys: Any) -> None:
        self.spec, self.plan, self.store, self.bucket = spec, plan, store, bucket
        self.inputs, self.progress, self.providers = inputs, progress, providers
        self.ssh_keys = ssh_keys
        # The keys' cancel event stops remote.connect's wait for SSH at once on Ctrl-C.
        cancel = getattr(ssh_keys, "cancel", None)
        self.stop: threading.Event = cancel if cancel is not None else threading.Event()
        self.hosts: dict[str, _Host] = {}
        self.errors: list[BaseException] = []  # bugs in a machine thread, re-raised at the end
        self.attempt_nonce = str(int(time.time()))
        self.input_manifest: list[dict[str, Any]] = []

    # -- the whole run ---------------------------------------------------------

    def execute(self, todo: dict[str, list[TrialPlan]]) -> bool:
        """Run every machine with trials left; False when interrupted."""
        vms = [vm for vm in self.plan.vms if todo.get(vm.name)]
        if self.bucket is not None and self.inputs is not None:
            keys = self.bucket.list(self.inputs.prefix + "/")
            self.input_manifest = [
                {"url": self.bucket.signed_url(f"{self.inputs.prefix}/{rel}"), "path": rel,
                 "md5": keys.get(f"{self.inputs.prefix}/{rel}")}
                for rel, _ in self.inputs.files
            ]
        concurrent = all(getattr(self._provider(vm), "concurrent_machines", True) for vm in vms)
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
            while self._running():
                time.sleep(0.1)
        except KeyboardInterrupt:
            self.stop.set()
            self.progress.tearing_down()
            self._shielded(self.teardown_all)
            self._wait_teardown()
            return False
        return True

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
            if host.executor is not None:
                with contextlib.suppress(Exception):
                    host.executor.close()
            self._delete(host)

    def _delete(self, host: _Host) -> None:
        with host.lock:
            if host.inst is None or host.deleted:
                return
            host.deleted = True
            inst = host.inst
        try:
            host.provider.delete(inst)
        except Exception as exc:
            with host.lock:
                host.deleted = False
            self.store.record_vm(host.vm.name, state="delete_failed", error=one_line(exc))
            self.progress.log(f"[red]could not delete {inst.name} ({inst.id}): {one_line(exc)}"
                              f" — run `cloudprof cleanup --sweep {self.plan.sweep_id}`")
            return
        state = "deleted" if host.provider.creates_machines else "released"
        self.store.record_vm(host.vm.name, state=state, deleted_at=now_iso())

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

    def _run_machine_guarded(self, host: _Host, trials: list[TrialPlan]) -> None:
        """Run one machine, record how it ended, and always tear it down."""
        vm = host.vm
        try:
            if self.stop.is_set():
                return
            self._run_machine(host, trials)
            status = "interrupted" if self.stop.is_set() else "done"
            self.store.record_machine(vm.machine.name, status)
            self.progress.machine_done(vm.name, status)
        except _Preempted as exc:
            self.store.record_machine(vm.machine.name, "preempted", one_line(exc))
            self.progress.machine_done(vm.name, "preempted")
            self.progress.log(f"[red]{vm.machine.name}: preempted: {one_line(exc)}")
        except CloudprofError as exc:
            if self.stop.is_set():
                self.store.record_machine(vm.machine.name, "interrupted")
            else:
                self.store.record_machine(vm.machine.name, "failed", one_line(exc))
                self.progress.machine_done(vm.name, "failed")
                self.progress.log(f"[red]{vm.machine.name}: failed: {one_line(exc)}")
        except BaseException as exc:  # a bug: record it, tear down, re-raise in the main thread
            self.errors.append(exc)
            self.store.record_machine(vm.machine.name, "failed", f"internal error: {exc!r}")
        finally:
            if host.executor is not None:
                with contextlib.suppress(Exception):
                    host.executor.close()
            self._delete(host)

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
        self.progress.state(key, "staging inputs")
        self._stage_inputs(host)
        # With ready_at and created_at: the measured phases next to the plan's estimates.
        self.store.record_vm(vm.name, inputs_staged_at=now_iso())
        for trial in trials:
            if self.stop.is_set():
                return
            self._run_trial(host, trial)

    def _provision(self, host: _Host, zone: str | None) -> None:
        host.inst = self._create_or_reattach(host, zone)
        if self.stop.is_set():
            return
        self.progress.state(host.vm.name, "waiting for the machine")
        host.inst = host.provider.wait_ready(host.inst)

    def _create_or_reattach(self, host: _Host, zone: str | None) -> Instance:
        vm, provider = host.vm, host.provider
        if provider.creates_machines:
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
            from orchestrator.engine import remote

            public_key = self.ssh_keys.user_public
            script = remote.startup_script(self.ssh_keys, SSH_USER, int(expires))
        req = VmRequest(sweep_id=self.plan.sweep_id, name=vm.name, machine=vm.machine.name,
                        region=vm.region, zone=zone, spot=vm.spot, labels=labels,
                        ssh_user=SSH_USER, ssh_public_key=public_key, startup_script=script)
        self.store.record_vm(vm.name, provider=provider.name, machine=vm.machine.name,
                             state="creating", labels=labels, spot=vm.spot,
                             price_per_hour=vm.machine.price(vm.spot), requested_at=now_iso())
        inst = provider.create(req)
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
        host.executor = host.provider.connect(host.inst)
        if self.stop.is_set():
            host.executor.close()
            return
        self.progress.state(host.vm.name, "bootstrapping")
        host.executor.ensure_workloads()
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
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / name
            local.write_text(json.dumps(entries))
            host.executor.put(local, remote)
        return remote

    def _stage_inputs(self, host: _Host) -> None:
        """Inputs onto the host: signed URLs fetched in parallel there, else copied over."""
        if self.inputs is None:
            return
        ex = host.executor
        assert ex is not None and self.inputs.local_dir is not None
        dest = posixpath.join(ex.workdir, "inputs", self.inputs.hash)
        if self.bucket is not None:
            manifest = self._put_manifest(host, self.input_manifest, "inputs.json")
            self._run(host, [ex.python, "-m", "workloads.transfer", "get", manifest, dest],
                      "fetching the inputs")
        else:
            for rel, _ in self.inputs.files:
                ex.put(self.inputs.local_dir / rel, posixpath.join(dest, rel))
        host.inputs_dir = dest

    # -- one trial ---------------------------------------------------------------

    def _run_trial(self, host: _Host, trial: TrialPlan) -> None:
        key = host.vm.name
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
                try:
                    self._connect(host)
                    if self._collect_earlier(host, trial, last_dir):
                        return
                except RETRYABLE as exc:
                    last_error = one_line(exc)
                    continue
            ex = host.executor
            assert ex is not None
            out_dir = posixpath.join(ex.workdir, "trials",
                                     f"{trial.trial_id}-{self.attempt_nonce}-{attempt}")
            last_dir = out_dir
            argv = [ex.python, "-m", "workloads.run", *trial.runner_args]
            if host.inputs_dir:
                argv += ["--param", f"inputs={host.inputs_dir}"]
            argv += ["--out", out_dir]
            self.progress.trial_started(key, trial, self.spec.duration_s)
            try:
                result = ex.run(argv, on_line=lambda line: self.progress.line(key, line),
                                timeout=self.spec.duration_s * 3 + 600)
                if self.stop.is_set() and result.exit_code != protocol.EXIT_OK:
                    self._collect(host, trial, out_dir, result, interrupted=True)
                    return
                self._upload_results(host, trial, out_dir)
                self._collect(host, trial, out_dir, result)
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
                for name in names + (protocol.PROFILE_FILES if trial.profiled else ())}

    def _upload_results(self, host: _Host, trial: TrialPlan, out_dir: str) -> None:
        """The host puts its result files in the bucket, where a dropped session cannot lose
        them."""
        if self.bucket is None:
            return
        ex = host.executor
        assert ex is not None
        entries = [{"path": posixpath.join(out_dir, name), "optional": True,
                    "url": self.bucket.signed_url(key, "PUT")}
                   for name, key in self._result_keys(trial).items()]
        try:
            manifest = self._put_manifest(host, entries, f"put-{trial.trial_id}.json")
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
        if self.bucket is not None:
            keys = self._result_keys(trial)
            local = self._incoming(trial)
            try:
                present = self.bucket.list(keys[protocol.SUMMARY_FILE])
            except CloudprofError:
                present = {}
            if keys[protocol.SUMMARY_FILE] in present:
                prefix = keys[protocol.SUMMARY_FILE].rsplit("/", 1)[0]
                self.bucket.download_dir(prefix, local)
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
        summary = _read_summary(local / protocol.SUMMARY_FILE)
        for name in ((summary or {}).get("profile") or {}).get("files") or []:
            if name in protocol.PROFILE_FILES:  # names from the host: only the known ones
                with contextlib.suppress(FileNotFoundError):
                    ex.get(posixpath.join(out_dir, name), local / name)
        return summary, ts

    def _collect(self, host: _Host, trial: TrialPlan, out_dir: str, result: CommandResult,
                 interrupted: bool = False) -> None:
        local = self._incoming(trial)
        summary, ts = self._fetch(host, out_dir, local)
        status = error = None
        if interrupted:
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
        if trial.profiled:  # kept apart from the throughput trials: see results/profiles.py
            from orchestrator.results.profiles import record_profile

            row = record_profile(self.store, summary, ts, host.vm.machine, trial=trial,
                                 sweep_id=self.plan.sweep_id, ran_on=ran_on,
                                 provider=provider.name, status=status, error=error)
            shutil.rmtree(self.store.run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
            self.progress.trial_done(host.vm.name, row)
            return
        row = self.store.record_trial(
            summary, ts if ts is not None and ts.is_file() else None, host.vm.machine,
            trial=trial, sweep_id=self.plan.sweep_id, ran_on=ran_on, provider=provider.name,
            spot=host.vm.spot, status=status, error=error, exit_code=exit_code)
        shutil.rmtree(self.store.run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
        self.progress.trial_done(host.vm.name, row)


def profile_ids(run_dir: Path, done_only: bool = False) -> set[str]:
    """Profiled trials recorded under profiles/ (they are not rows of trials.parquet)."""
    from orchestrator.results.profiles import profiled_trial_ids

    return profiled_trial_ids(run_dir, done_only=done_only)


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None



def _last_line(result: CommandResult) -> str:
    lines = [ln for ln in (result.stderr_tail or result.stdout_tail or "").splitlines()
             if ln.strip() and protocol.parse_progress(ln) is None]
    return lines[-1].strip() if lines else "(no output)"


def _exec_provider_name(spec: SweepSpec, vm: VmPlan) -> str:
    """Where a VM's trials really run: on this machine for --dry-run."""
    return "local" if spec.dry_run else vm.provider


# ---------------------------------------------------------------------- entry point


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises in the main thread like Ctrl-C does (only possible from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
        from orchestrator.engine.remote import SshKeys

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


def _open_bucket(spec: SweepSpec, providers: dict[str, Provider]) -> Bucket | None:
    """The sweep's bucket; a dry run never touches a cloud one (it makes no cloud call)."""
    cloud = spec.bucket is not None and spec.bucket.startswith(("gs://", "s3://"))
    if spec.bucket and not (spec.dry_run and cloud):
        from orchestrator.providers import open_bucket

        return open_bucket(spec.bucket)
    if set(providers) == {"local"}:
        from orchestrator.providers.local import LocalBucket

        return LocalBucket()
    return None  # inputs are copied to each host over its executor


def run_sweep(spec: SweepSpec, *, resume: Path | None = None,
              console: Console | None = None) -> Path:
    """Run (or resume) a sweep and return its run directory.

    Raises BudgetError before anything starts when the estimate is above
    ``max_cost``; CredentialsError unless ``dry_run``; MemoryGateError after
    everything is recorded and reported when a trial peaked above
    ``max_peak_memory``; PartialSweepError when some machine or trial failed;
    SweepInterruptedError after teardown on Ctrl-C/SIGTERM.
    """
    if console is None:
        from rich.console import Console

        console = Console()
    started: list[Path] = []  # the run directory, once it exists
    try:
        with _sigterm_as_interrupt():
            return _run(spec, resume, console, started)
    except KeyboardInterrupt:
        run_dir = started[0] if started else None
        where = f"; resume with: cloudprof sweep --resume {run_dir}" if run_dir else ""
        raise SweepInterruptedError(f"interrupted: every machine was torn down{where}",
                                    run_dir) from None


def _run(spec: SweepSpec, resume: Path | None, console: Console, started: list[Path]) -> Path:
    if resume is not None:
        store = RunStore.open(resume)
        data = store.read_sweep()
        try:
            spec = SweepSpec.from_dict(data["spec"])
            plan = Plan.from_dict(data["plan"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"cannot resume {resume}: sweep.json lacks a valid spec and "
                             f"plan ({exc!r})") from None
        inputs = plan_inputs(spec)
    else:
        machines = lookup_machines(spec)
        sweep_id = new_sweep_id()
        inputs = plan_inputs(spec)
        plan = make_plan(spec, sweep_id, machines, input_bytes=inputs.size if inputs else 0)
        if inputs is not None:
            plan.uploads = [Upload(f"{inputs.prefix}/{rel}", size) for rel, size in inputs.files]
        cost = plan.total_cost_usd
        if spec.max_cost is not None and cost is not None and cost > spec.max_cost:
            raise BudgetError(f"estimated cost ${cost:.2f} is above --max-cost "
                              f"${spec.max_cost:.2f}; nothing was started")
        store = None
    if not spec.dry_run:
        checkers, _ = _build_providers(spec, plan, None, plan.sweep_id)
        for provider in checkers.values():
            provider.check_credentials()
        if any(provider.creates_machines for provider in checkers.values()):
            from orchestrator.engine.remote import boot_timeout

            boot_timeout()  # a bad CLOUDPROF_SSH_BOOT_TIMEOUT fails here, before any VM exists
    render_plan(plan, console, spec.dry_run)

    if inputs is not None:
        with console.status("Preparing inputs (generated once, then cached)..."):
            generate_inputs(inputs)
        plan.uploads = [Upload(f"{inputs.prefix}/{rel}", size) for rel, size in inputs.files]
    if store is None:
        store = RunStore.create(Path(spec.out) / plan.sweep_id, {
            "sweep_id": plan.sweep_id, "spec": spec.to_dict(), "plan": plan.to_dict(),
            "prices": _prices(plan), "dry_run": spec.dry_run,
            "ran_on": "local" if spec.dry_run else None,
            "inputs": {"hash": inputs.hash, "prefix": inputs.prefix,
                       "local_dir": str(inputs.local_dir)} if inputs else None,
        })
    run_dir = store.run_dir
    started.append(run_dir)
    with store.running():
        done: set[str] = set()
        if resume is not None:
            done = store.done_trial_ids() | profile_ids(store.run_dir, done_only=True)
            store.update_sweep(machines={})  # this run's outcome per machine replaces the last
            console.print(f"Resuming sweep {plan.sweep_id}: {len(done)} trial(s) already done.")
        return _execute(spec, plan, store, inputs, done, console)


def _execute(spec: SweepSpec, plan: Plan, store: RunStore, inputs: StagedInputs | None,
             done: set[str], console: Console) -> Path:
    run_dir = store.run_dir
    providers, keys = _build_providers(spec, plan, run_dir, plan.sweep_id)
    if spec.dry_run:
        from orchestrator.providers.local import host_facts

        store.update_sweep(local_host=host_facts())
    bucket = _open_bucket(spec, providers)
    store.set_status("running", started_at=now_iso(),
                     bucket=bucket.url if bucket is not None else None)

    todo = {vm.name: [t for t in vm.trials if t.trial_id not in done] for vm in plan.vms}
    finished = False
    with SweepProgress(console) as progress:
        engine = _Engine(spec, plan, store, bucket, inputs, progress, providers, keys)
        try:
            if bucket is not None:
                _label_prefixes(bucket, plan, inputs)
            if inputs is not None and bucket is not None:
                progress.log(f"Staging inputs in {bucket.url}/{inputs.prefix}/ ...")
                uploaded = bucket.upload_dir(inputs.local_dir, inputs.prefix)
                progress.log(f"  {len(uploaded)} object(s) uploaded, "
                             f"{len(inputs.files) - len(uploaded)} already there")
            finished = engine.execute(todo)
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
            if bucket is not None:
                with contextlib.suppress(Exception):
                    bucket.delete_labelled(_results_prefix(plan))
    if not finished:
        store.set_status("interrupted", finished_at=now_iso())
    if engine.errors:
        store.set_status("failed", finished_at=now_iso())
        raise engine.errors[0]
    if not finished:
        raise KeyboardInterrupt
    return _finish(spec, plan, store, console)


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
    frame = store.trials_frame()
    sweep = store.read_sweep()
    failed_machines = {m: v for m, v in sweep.get("machines", {}).items()
                       if v.get("status") in ("failed", "preempted")}
    planned = {t.trial_id for vm in plan.vms for t in vm.trials}
    bad = frame[frame["status"] != "ok"]
    missing = planned - set(frame["trial_id"]) - profile_ids(run_dir)
    partial = bool(failed_machines or len(bad) or missing)
    store.set_status("partial" if partial else "done", finished_at=now_iso())
    try:
        from orchestrator.results.report import print_summary, write_report

        html = write_report(run_dir)
        print_summary(run_dir, console)
        console.print(f"Report: {html}")
    except CloudprofError as exc:
        console.print(f"[yellow]No report: {exc}")
    console.print(f"Results store: {run_dir}")

    limit = spec.max_peak_memory
    if limit is not None and len(frame):
        peaks = frame.dropna(subset=["peak_rss_bytes"])
        over = peaks[peaks["peak_rss_bytes"].astype(float) > limit]
        if len(over):
            worst = over.loc[over["peak_rss_bytes"].astype(float).idxmax()]
            err = MemoryGateError(
                f"memory gate: {len(over)} trial(s) peaked above {limit / 2**20:.1f} MiB; "
                f"worst {worst['trial_id']} at {float(worst['peak_rss_bytes']) / 2**20:.1f} MiB "
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
