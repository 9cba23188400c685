"""How a sweep ends: its status, its report, and the exit-code decisions (VMs left
behind, results that could not be written, the memory gate, a partial sweep).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine.host_session import DELETE_ATTEMPTS
from orchestrator.engine.prepare import results_prefix
from orchestrator.errors import (
    CloudprofError,
    MemoryGateError,
    PartialSweepError,
    ResultsWriteError,
    TeardownError,
)
from orchestrator.plan.planner import Plan, slug
from orchestrator.providers.base import LABEL_SWEEP, Bucket
from orchestrator.results.store import RunStore, now_iso
from orchestrator.spec.spec import SweepSpec

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.engine.host_session import HostSession
    from orchestrator.engine.machines import Machines


def profile_ids(run_dir: Path, done_only: bool = False) -> set[str]:
    """Profiled trials recorded under profiles/ (they are not rows of trials.parquet)."""
    from orchestrator.results.profiles import profiled_trial_ids

    return profiled_trial_ids(run_dir, done_only=done_only)


def failed_profiles(run_dir: Path) -> list[dict[str, Any]]:
    """The records of the profiled trials that did not finish ok."""
    from orchestrator.results.profiles import load_profiles

    return [r for r in load_profiles(run_dir) if r.get("status") != "ok"]


def results_write_failed(exc: OSError, plan: Plan, store: RunStore,
                          bucket: Bucket | None) -> ResultsWriteError:
    """One line: what could not be written, where the results not on disk are, how to go on."""
    run_dir = store.run_dir
    where = f": {exc.filename}" if exc.filename else ""
    kept = (f"results not on disk stay in {bucket.url}/{results_prefix(plan)}, where --resume "
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


def _leftovers(host: HostSession, sweep_label: str) -> list[str]:
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


def teardown_failed(spec: SweepSpec, plan: Plan, store: RunStore,
                     left: list[HostSession]) -> TeardownError:
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


def settle(spec: SweepSpec, plan: Plan, store: RunStore, bucket: Bucket | None,
           console: Console, machines: Machines, finished: bool) -> Path:
    """After the teardown: the outcome that wins, loudest first — VMs left behind (they may
    still be billing), results that could not be written, an interrupt, a bug, then the
    finished sweep's own status."""
    failures = machines.ctx.failures
    left = machines.left_behind()
    if left:  # it may still be billing: this outcome wins over every other one
        if finished and not failures.errors:
            with contextlib.suppress(CloudprofError):
                finish(spec, plan, store, console)  # the results and report still count
        raise teardown_failed(spec, plan, store, left)
    if failures.write_error is not None:
        raise results_write_failed(failures.write_error, plan, store, bucket)
    if not finished:
        store.set_status("interrupted", finished_at=now_iso())
    if failures.errors:
        store.set_status("failed", finished_at=now_iso())
        raise failures.errors[0]
    if not finished:
        raise KeyboardInterrupt
    return finish(spec, plan, store, console)


def finish(spec: SweepSpec, plan: Plan, store: RunStore, console: Console) -> Path:
    """Status, report, then the exit-code decisions: memory gate first, then partial."""
    run_dir = store.run_dir
    rows = store.trial_rows()  # pyarrow alone: a plain sweep never imports pandas
    failed_machines, bad, missing = _shortfall(plan, store, rows)
    partial = bool(failed_machines or len(bad) or missing)
    store.set_status("partial" if partial else "done", finished_at=now_iso())
    _report(run_dir, console, spec.total, files=spec.report)
    gate = memory_gate(spec, rows, run_dir)
    if gate is not None:
        raise gate
    if partial:
        raise _partial(failed_machines, bad, missing, run_dir)
    return run_dir


def _shortfall(plan: Plan, store: RunStore, rows: list[dict[str, Any]],
               ) -> tuple[dict[str, Any], list[dict[str, Any]], set[str]]:
    """The machines that failed, the trials not ok, and the planned trials never run."""
    run_dir = store.run_dir
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
    return failed_machines, bad, missing


def _report(run_dir: Path, console: Console, total: float | None = None, *,
            files: bool = True) -> None:
    """The report, with ``--total``'s whole job on each card where ``cloudprof report RUN
    --total N`` puts it (the command prints every configuration's figures after it);
    its files unless ``files`` is False (--no-report)."""
    try:
        from orchestrator.results.publish import report_run
        from orchestrator.results.whole_job import question

        asked = question(None, None, total) if total is not None else None
        html = report_run(run_dir, console, asked, follow_up=False, files=files)
        if html is None:
            console.print(f"Results store: {run_dir} (--no-report: `cloudprof report "
                          f"{run_dir}` writes report.html and report.md)", soft_wrap=True)
            return
        # one last line: the report to open; the results store is the folder it is in
        console.print(f"Report: {html} (report.md beside it)", soft_wrap=True)
    except CloudprofError as exc:
        console.print(f"[yellow]No report: {exc}")
        console.print(f"Results store: {run_dir}")


def memory_gate(spec: SweepSpec, rows: list[dict[str, Any]],
                run_dir: Path) -> MemoryGateError | None:
    """The error when a trial peaked above --max-peak-memory; None when none did."""
    limit = spec.max_peak_memory
    # The whole lifetime (loading included) unless --max-peak-memory trial:SIZE said
    column = "peak_rss_trial_bytes" if spec.peak_gate == "trial" else "peak_rss_bytes"
    if rows and column not in rows[0]:  # a store written before the trial's own peak had one
        column = "peak_rss_bytes"
    if limit is None or not rows:
        return None
    over = [r for r in rows if r.get(column) is not None and float(r[column]) > limit]
    if not over:
        return None
    worst = max(over, key=lambda r: float(r[column]))  # the first of equal peaks
    what = "during the trial" if column == "peak_rss_trial_bytes" else (
        "over the trial process's lifetime, loading included")
    err = MemoryGateError(
        f"memory gate: {len(over)} trial(s) peaked above {limit / 2**20:.1f} MiB "
        f"{what}; worst {worst['trial_id']} at {float(worst[column]) / 2**20:.1f} MiB"
        f"{' (while loading)' if worst.get('peak_phase') == 'load' else ''} "
        f"(results in {run_dir})")
    err.run_dir = run_dir  # type: ignore[attr-defined]
    return err


def _partial(failed_machines: dict[str, Any], bad: list[dict[str, Any]], missing: set[str],
             run_dir: Path) -> PartialSweepError:
    parts = [f"{m} {v.get('status')}: {v.get('error') or ''}".strip()
             for m, v in failed_machines.items()]
    if len(bad):
        parts.append(f"{len(bad)} trial(s) not ok")
    if missing:
        parts.append(f"{len(missing)} trial(s) not run")
    return PartialSweepError(f"sweep finished with failures ({'; '.join(parts)}); "
                             f"resume with: cloudprof sweep --resume {run_dir}", run_dir)
