"""The sweep's machines at once: one thread per machine (one host serves all its trials),
the main thread only watching them, so a Ctrl-C or SIGTERM always lands where teardown
is handled. Every host is released in its thread's ``finally``, and by the main thread
at once on an interrupt.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable

from orchestrator.engine.context import SweepContext
from orchestrator.engine.host_session import HostSession, Preempted
from orchestrator.engine.strategies import run_machine_trials
from orchestrator.engine.trial_runner import TrialRunner
from orchestrator.errors import CloudprofError, one_line
from orchestrator.plan.planner import TrialPlan, VmPlan
from orchestrator.results.store import now_iso

TEARDOWN_WAIT_S = 900.0
# What a local disk or directory says when it stops taking writes (remote failures are
# ProviderErrors by then): full, over quota, file size limit, read-only, permissions, or a
# path turned into something else under the sweep.
LOCAL_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS,
                                errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR,
                                errno.EISDIR, errno.EIO})


def local_write_error(exc: OSError) -> bool:
    return exc.errno in LOCAL_WRITE_ERRNOS


class Machines:
    """The hosts of a sweep, their threads, and their teardown."""

    def __init__(self, ctx: SweepContext, runner: TrialRunner) -> None:
        self.ctx, self.runner = ctx, runner
        self.hosts: dict[str, HostSession] = {}
        # Set by a machine thread as it ends: wakes the main thread at once (see execute).
        self.wake = threading.Event()
        # Set once the main thread has imported what the sweep needs between trials, which it
        # does while the machines provision and stage: pyarrow (ensure_trials_table), and
        # pandas only for --adaptive and --search (they read the trials as a frame between
        # trials); no trial starts before it, so no import runs beside a trial. A plain sweep
        # imports pandas only for its report, after the last trial: recording needs pyarrow.
        self.pandas_ready = threading.Event()

    # -- the whole run ---------------------------------------------------------

    def execute(self, todo: dict[str, list[TrialPlan]]) -> bool:
        """Run every machine with trials left; False when interrupted."""
        ctx = self.ctx
        vms = [vm for vm in ctx.plan.vms if todo.get(vm.name)]
        concurrent = all(ctx.provider(vm).concurrent_machines for vm in vms)
        gate = threading.Semaphore(len(vms) if concurrent else 1)
        threads = []
        for vm in vms:
            self.hosts[vm.name] = HostSession(ctx, vm, ctx.provider(vm))
            ctx.progress.add_machine(vm.name, vm.machine.name, len(todo[vm.name]))
            threads.append(threading.Thread(target=self._machine_thread,
                                            args=(vm, todo[vm.name], gate),
                                            name=f"machine-{vm.name}", daemon=True))
        try:
            for thread in threads:
                thread.start()
            ctx.staging.run_once(ctx.stop)
            # Not needed before the first record: written while the machines start (see _run)
            ctx.store.ensure_trials_table()
            if ctx.spec.adaptive or ctx.plan.search:
                self._import_pandas()
            else:
                self.pandas_ready.set()
            while self.running():
                # A machine thread's end sets ``wake``, so the sweep goes on the moment the
                # last one ends, not at the next tick; the timeout keeps Ctrl-C prompt.
                self.wake.wait(0.1)
                self.wake.clear()
        except KeyboardInterrupt:
            ctx.stop.set()
            ctx.progress.tearing_down()
            self.shielded(self.teardown_all)
            self.wait_teardown()
            return False
        return True

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
        """Wait for :meth:`_import_pandas` (normally over by the time staging is); False when
        the sweep is stopping meanwhile."""
        while not self.pandas_ready.wait(0.1):
            if self.ctx.stop.is_set():
                return False
        return not self.ctx.stop.is_set()

    # -- teardown ----------------------------------------------------------------

    def shielded(self, work: Callable[[], None]) -> None:
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
                self.still_tearing_down()

    def still_tearing_down(self) -> None:
        self.ctx.progress.log("[bold red]Still tearing down — please wait; VMs also "
                              "delete themselves at their expiry label.")

    def running(self) -> bool:
        return not all(host.done.is_set() for host in self.hosts.values())

    def wait_teardown(self) -> None:
        """Wait for the machine threads' own ``finally`` blocks; further Ctrl-Cs only warn."""
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        next_sweep = time.monotonic() + 5
        while self.running() and time.monotonic() < deadline:
            try:
                time.sleep(0.1)
                if time.monotonic() > next_sweep:  # a VM created since the interrupt goes too
                    self.shielded(self.teardown_all)
                    next_sweep = time.monotonic() + 5
            except KeyboardInterrupt:
                self.still_tearing_down()

    def teardown_all(self) -> None:
        """Stop running commands and delete every known VM (idempotent, from any thread)."""
        for host in list(self.hosts.values()):
            host.release()

    def left_behind(self) -> list[HostSession]:
        """The hosts whose VM could not be deleted (it may still be billing)."""
        return [host for host in self.hosts.values() if host.delete_error is not None]

    def all_deleted(self) -> bool:
        return all(h.inst is None or h.deleted for h in self.hosts.values())

    # -- one machine -------------------------------------------------------------

    def _machine_thread(self, vm: VmPlan, trials: list[TrialPlan],
                        gate: threading.Semaphore) -> None:
        host = self.hosts[vm.name]
        try:
            while not gate.acquire(timeout=0.2):
                if self.ctx.stop.is_set():
                    return
            try:
                self._run_guarded(host, trials)
            finally:
                gate.release()
        finally:
            host.done.set()
            self.wake.set()

    def _run_guarded(self, host: HostSession, trials: list[TrialPlan]) -> None:
        """Run one machine, record how it ended, and always tear it down."""
        ctx, vm = self.ctx, host.vm
        try:
            if ctx.stop.is_set():
                return
            self._run_machine(host, trials)
            status = "interrupted" if ctx.stop.is_set() else "done"
            ctx.note_machine(vm.machine.name, status)
            ctx.progress.machine_done(vm.name, status)
        except Preempted as exc:
            ctx.note_machine(vm.machine.name, "preempted", one_line(exc))
            ctx.progress.machine_done(vm.name, "preempted")
            ctx.progress.log(f"[red]{vm.machine.name}: preempted: {one_line(exc)}")
        except CloudprofError as exc:
            if ctx.stop.is_set():
                ctx.note_machine(vm.machine.name, "interrupted")
            else:
                ctx.note_machine(vm.machine.name, "failed", one_line(exc))
                ctx.progress.machine_done(vm.name, "failed")
                ctx.progress.log(f"[red]{vm.machine.name}: failed: {one_line(exc)}")
        except OSError as exc:
            if not local_write_error(exc):
                ctx.failures.bug(exc)  # not the disk: a bug, as below
                ctx.note_machine(vm.machine.name, "failed", f"internal error: {exc!r}")
                return
            ctx.failures.write_failed(exc)
            ctx.note_machine(vm.machine.name, "failed", f"cannot write results: {exc}")
            ctx.progress.machine_done(vm.name, "failed")
        except BaseException as exc:  # a bug: record it, tear down, re-raise in the main thread
            ctx.failures.bug(exc)
            ctx.note_machine(vm.machine.name, "failed", f"internal error: {exc!r}")
        finally:
            host.release()

    def _run_machine(self, host: HostSession, trials: list[TrialPlan]) -> None:
        ctx = self.ctx
        host.bring_up()
        if ctx.stop.is_set():
            return
        host.record_ready()
        host.connect()
        if ctx.stop.is_set():
            return
        # The warm runner imports while the inputs and the job are staged; after a --setup,
        # which may install into the interpreter it imports from, it starts after it.
        early = not ctx.spec.setup
        if early:
            host.start_warm(trials)
        try:
            if self._make_ready(host, trials, early):
                run_machine_trials(host, trials, self.runner)
        finally:
            host.stop_warm()

    def _make_ready(self, host: HostSession, trials: list[TrialPlan], early: bool) -> bool:
        """Stage the inputs and the job, form the Ray cluster where a trial needs one, start
        the warm runner; False when the sweep stopped meanwhile."""
        from orchestrator.engine.ray_cluster import form_cluster

        ctx = self.ctx
        if not ctx.staging.wait(ctx.stop):
            return False
        ctx.progress.state(host.vm.name, "staging inputs")
        host.stage_inputs()
        # With ready_at and created_at: the measured phases next to the plan's estimates.
        ctx.store.record_vm(host.vm.name, inputs_staged_at=now_iso())
        host.stage_job()
        if ctx.stop.is_set():
            return False
        # A resumed sweep whose multi-node trials are all done creates no extra VM.
        if host.vm.nodes > 1 and any(t.nodes > 1 for t in trials):
            form_cluster(host)
            if ctx.stop.is_set():
                return False
        if not early:
            host.start_warm(trials)
        host.warm_ready()
        return self._wait_pandas()
