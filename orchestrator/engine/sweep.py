"""The sweep engine's driver: spec → plan → staged inputs → per-machine trials → store → report.

The rooms, each handed the sweep's :class:`~orchestrator.engine.context.SweepContext`:
``prepare`` (machines, providers, bucket, before anything is paid for), ``inputs`` and
``staging`` (the files the hosts fetch), ``machines`` (one thread per machine),
``host_session`` (a host's lifecycle), ``ray_cluster`` (a machine's nodes as one
cluster), ``trial_runner`` (one trial: run, retry, put, collect, record),
``strategies`` (grid, --adaptive, --search: which trial next) and ``outcome`` (status,
report and exit-code decisions).

Money and data rules: every VM's id is written to sweep.json before anything waits on
it, every VM is deleted in a ``finally`` (and by the main thread at once on an
interrupt), and every trial is in the store the moment it is collected — so a crash
loses at most the trial in flight, and ``--resume`` runs exactly what is missing.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine import timeouts
from orchestrator.engine.context import SweepContext
from orchestrator.engine.host_session import SSH_USER
from orchestrator.engine.inputs import StagedInputs, generate_inputs, plan_inputs, upload_inputs
from orchestrator.engine.machines import Machines
from orchestrator.engine.outcome import profile_ids, settle
from orchestrator.engine.prepare import (
    EXPIRY_MARGIN_S,
    INPUTS_RETENTION_S,
    UNASKED_COST_USD,
    bucket_note,
    build_providers,
    exec_provider_name,
    limit_note,
    lookup_machines,
    machine_prices,
    open_bucket,
    pack_job,
    results_prefix,
    signed_url_lifetime,
)
from orchestrator.engine.progress import SweepProgress
from orchestrator.engine.signals import current as current_signals
from orchestrator.engine.signals import deferred as signals_deferred
from orchestrator.engine.signals import signum_of, sweep_signals
from orchestrator.engine.staging import Staging
from orchestrator.engine.strategies import run_search
from orchestrator.engine.trial_runner import TrialRunner
from orchestrator.errors import (
    BudgetError,
    CloudprofError,
    SweepInterruptedError,
    TeardownError,
    UsageError,
    one_line,
)
from orchestrator.formatting import fmt_usd
from orchestrator.plan.planner import Plan, TrialPlan, Upload, make_plan, new_sweep_id, render_plan
from orchestrator.providers.base import Bucket
from orchestrator.results.store import RunStore, now_iso
from orchestrator.spec.spec import SweepSpec

if TYPE_CHECKING:
    from rich.console import Console

# The engine's names its callers (the CLI, the tests, the benchmarks) import from here.
__all__ = [
    "EXPIRY_MARGIN_S",
    "INPUTS_RETENTION_S",
    "SSH_USER",
    "UNASKED_COST_USD",
    "StagedInputs",
    "generate_inputs",
    "lookup_machines",
    "plan_inputs",
    "run_sweep",
    "upload_inputs",
]


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



def _load_resume(resume: Path) -> tuple[RunStore, SweepSpec, Plan, set[str]]:
    """The store, spec and plan of the sweep to resume, and the trials it already holds."""
    store = RunStore.open(resume)
    done = store.done_trial_ids()
    data = store.read_sweep()
    try:
        spec = SweepSpec.from_dict(data["spec"])
        plan = Plan.from_dict(data["plan"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"cannot resume {resume}: sweep.json lacks a valid spec and "
                         f"plan ({exc!r})") from None
    return store, spec, plan, done


def _set_uploads(plan: Plan, inputs: StagedInputs | None, job: Any,
                 predicted: bool = False) -> None:
    """What the sweep uploads, in the plan (its sizes predicted until the inputs exist)."""
    if inputs is not None:
        plan.uploads = [Upload(f"{inputs.prefix}/{rel}", size, predicted)
                        for rel, size in inputs.files]
        if job is not None:
            plan.uploads.append(Upload(job.key, job.path.stat().st_size))


def _new_plan(spec: SweepSpec, console: Console, plan_only: bool,
              inputs: StagedInputs | None, job: Any) -> Plan:
    """A new sweep's plan, refused before anything starts when it costs more than asked."""
    machines = lookup_machines(spec)
    sweep_id = new_sweep_id()
    plan = make_plan(spec, sweep_id, machines, input_bytes=inputs.size if inputs else 0)
    if inputs is not None:  # the cube's files are not generated yet: their sizes predicted
        _set_uploads(plan, inputs, None, predicted=inputs.local_dir is None)
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
    return plan


def _show_plan(spec: SweepSpec, plan: Plan, names: set[str], console: Console,
               done: set[str]) -> None:
    render_plan(plan, console, spec.dry_run, done=done)
    bucket_note(spec, names, console)
    console.print(f"Time limit: {timeouts.describe(spec)}", highlight=False)
    limit_note(spec, console)


def _check_providers(spec: SweepSpec, plan: Plan, console: Console) -> None:
    """Credentials, a group's hosts and the boot timeout, before anything is paid for."""
    if spec.dry_run:
        return
    checkers, _ = build_providers(spec, plan, None, plan.sweep_id)
    for provider in checkers.values():
        provider.check_credentials()
    for vm in plan.vms:  # ssh: the group's hosts alike (read from them), before anything
        if vm.nodes > 1:
            provider = checkers[exec_provider_name(spec, vm)]
            for warning in provider.check_nodes(vm.machine.name, vm.nodes):
                console.print(f"[yellow]warning:[/yellow] {warning}")
    if any(provider.creates_machines for provider in checkers.values()):
        from orchestrator.providers.remote import boot_timeout

        boot_timeout()  # a bad CLOUDPROF_SSH_BOOT_TIMEOUT fails here, before any VM exists


def _create_store(spec: SweepSpec, plan: Plan, inputs: StagedInputs | None,
                  job: Any) -> RunStore:
    """A new sweep's store. Its empty trials table is written by the engine once the
    machine threads have started (their provisioning and warm runners need sweep.json
    only), or at the latest by ``_run``, however the sweep ends."""
    return RunStore.create(Path(spec.out) / plan.sweep_id, {
        "sweep_id": plan.sweep_id, "spec": spec.to_dict(), "plan": plan.to_dict(),
        "prices": machine_prices(plan), "dry_run": spec.dry_run,
        "ran_on": "local" if spec.dry_run else None,
        "inputs": {"hash": inputs.hash, "prefix": inputs.prefix,
                   "local_dir": str(inputs.local_dir)} if inputs else None,
        "job": {"hash": job.hash, "prefix": job.prefix, "source": str(job.source),
                "files": job.files, "bytes": job.size} if job else None,
    }, trials_table=False)


def _run(spec: SweepSpec, resume: Path | None, console: Console, started: list[Path],
         plan_only: bool = False) -> Path | None:
    done: set[str] = set()
    store: RunStore | None = None
    if resume is not None:
        store, spec, plan, done = _load_resume(resume)
        inputs, job = plan_inputs(spec), pack_job(spec)
    else:
        inputs = plan_inputs(spec)
        job = pack_job(spec)  # a workdir above the limit stops here, before anything exists
        plan = _new_plan(spec, console, plan_only, inputs, job)
    names = {exec_provider_name(spec, vm) for vm in plan.vms}
    if plan_only:
        _show_plan(spec, plan, names, console, done)
        return None
    _check_providers(spec, plan, console)
    bucket = open_bucket(spec, names)
    if bucket is not None and spec.bucket:  # a missing bucket (or no access) fails here,
        # before any run directory or VM exists
        bucket.list(results_prefix(plan))
    _show_plan(spec, plan, names, console, done)
    if inputs is not None:
        generate_inputs(inputs, console)  # once, then cached: a bar of frames while it runs
        _set_uploads(plan, inputs, job)
    if store is None:
        store = _create_store(spec, plan, inputs, job)
    store.guard = signals_deferred  # a signal never cuts a sweep.json write short
    started.append(store.run_dir)
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


def _todo(spec: SweepSpec, plan: Plan, store: RunStore,
          done: set[str]) -> dict[str, list[TrialPlan]]:
    """Each machine's trials left to run."""
    todo = {vm.name: [t for t in vm.trials if t.trial_id not in done] for vm in plan.vms}
    if spec.adaptive:  # --resume: a machine whose adaptive loop finished needs no VM again
        vms = store.read_sweep().get("vms") or {}
        todo = {name: [] if (vms.get(name) or {}).get("adaptive") else left
                for name, left in todo.items()}
    return todo


def _execute(spec: SweepSpec, plan: Plan, store: RunStore, bucket: Bucket | None,
             inputs: StagedInputs | None, done: set[str], console: Console,
             job: Any = None, resuming: bool = False) -> Path:
    providers, keys = build_providers(spec, plan, store.run_dir, plan.sweep_id)
    facts: dict[str, Any] = {}
    if spec.dry_run:
        from orchestrator.providers.local import host_facts

        facts["local_host"] = host_facts()
    # One rewrite of sweep.json (each is a flushed write) before the machines start
    store.set_status("running", started_at=now_iso(),
                     bucket=bucket.url if bucket is not None else None, **facts)
    todo = _todo(spec, plan, store, done)
    with SweepProgress(console) as progress:
        staging = Staging(plan, bucket, inputs, job, progress, signed_url_lifetime(plan))
        ctx = SweepContext.create(spec, plan, store, bucket, inputs, progress, providers,
                                  staging, ssh_keys=keys, job=job, resuming=resuming)
        machines = Machines(ctx, TrialRunner(ctx))
        if (signals := current_signals()) is not None:
            signals.warn = machines.still_tearing_down
        try:
            finished = (run_search(ctx, todo, machines.execute) if plan.search
                        else machines.execute(todo))
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            store.set_status(status, finished_at=now_iso(), error=one_line(exc))
            raise
        finally:
            _wind_down(ctx, machines, keys)
    return settle(spec, plan, store, bucket, console, machines, finished)


def _wind_down(ctx: SweepContext, machines: Machines, keys: Any) -> None:
    """However the machines ended: every host released, the scratch files and the key pair
    gone, and the bucket's results copy deleted once the store holds them."""
    ctx.stop.set()
    # Also when a second Ctrl-C cut the first teardown short: delete what is left and
    # wait for the machine threads' own deletions (daemon threads die with the process).
    machines.shielded(machines.teardown_all)
    machines.wait_teardown()
    shutil.rmtree(ctx.store.run_dir / ".incoming", ignore_errors=True)
    if keys is not None and machines.all_deleted():
        keys.remove()  # the per-sweep key pair dies with the last VM that trusted it
    if ctx.bucket is not None and ctx.failures.write_error is None \
            and ctx.store.reads_back():  # else the bucket holds the only copy
        with contextlib.suppress(Exception):
            ctx.bucket.delete_labelled(results_prefix(ctx.plan))
