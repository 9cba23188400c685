"""One trial on one host: its request, run with retries on the same host, its results put
in the bucket by the host, collected, and recorded in the store.

Every trial is in the store the moment it is collected, so a crash loses at most the
trial in flight. A dropped session is retried on the same host (reconnecting first);
a result the host already put in the bucket, or left on its disk, is collected rather
than run again.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine import timeouts
from orchestrator.engine.host_session import last_line
from orchestrator.errors import (
    CloudprofError,
    ConnectionLostError,
    ProviderError,
    RemoteCommandError,
    UnreachableError,
    one_line,
)
from orchestrator.formatting import fmt_bytes
from orchestrator.plan.planner import TrialPlan
from orchestrator.providers import detached
from orchestrator.providers.base import CommandResult
from orchestrator.providers.remote import boot_timeout
from orchestrator.results.store import trial_row
from workloads import protocol
from workloads.job import LOG_FILE as JOB_LOG
from workloads.protocol import TrialRequest

if TYPE_CHECKING:
    from orchestrator.engine.context import SweepContext
    from orchestrator.engine.host_session import HostSession

TRIAL_ATTEMPTS = 3  # a dropped session is retried on the same VM this many times in all
RETRY_BACKOFF_S = 2.0
RETRYABLE = (ConnectionLostError, UnreachableError)  # worth a retry of the trial on the same VM
SUMMARIES_DIR = "summaries"  # summaries/<trial_id>.json: each trial's summary.json, as it came


@dataclass
class ResultsPut:
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


def read_summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def keep_summary(run_dir: Path, trial_id: str) -> None:
    """Keep the trial's summary.json in the store (every provider: a cloud VM's is gone with
    it), for what trials.parquet does not hold: spikes, the peak's bases, the leak fit."""
    src = run_dir / ".incoming" / trial_id / protocol.SUMMARY_FILE
    if src.is_file():
        (run_dir / SUMMARIES_DIR).mkdir(exist_ok=True)
        shutil.copyfile(src, run_dir / SUMMARIES_DIR / f"{trial_id}.json")


def host_request(host: HostSession, trial: TrialPlan, out_dir: str,
                 put: str | None) -> TrialRequest:
    """The trial's request with what only this host knows: its inputs and job copy, the
    Ray cluster (see ``ray_cluster.cluster_request``), the put manifest and the result
    directory."""
    from orchestrator.engine.ray_cluster import cluster_request

    request = trial.request
    if host.inputs_dir:
        request = request.with_params(inputs=host.inputs_dir)
    request = cluster_request(request, host, trial)
    return replace(request, chdir=host.job_dir or None, put=put, out=out_dir)


class TrialRunner:
    """Runs trials on hosts and records them; one per sweep, shared by its machines."""

    def __init__(self, ctx: SweepContext) -> None:
        self.ctx = ctx
        self.timeouts = timeouts.TrialTimeouts(ctx.spec)
        # --prove-limit/--find-limit trials (orchestrator.engine.limits): id → what to record
        self.limit_meta: dict[str, dict[str, Any]] = {}

    # -- run ---------------------------------------------------------------------

    def run(self, host: HostSession, trial: TrialPlan) -> None:
        """Run and record one trial, retried on the same host when its session drops."""
        if self.ctx.resuming and self._collect_earlier(host, trial, None):
            return  # the last run's VM put it in the bucket before that run ended
        last_dir: str | None = None
        last_error = ""
        for attempt in range(TRIAL_ATTEMPTS):
            if self.ctx.stop.is_set():
                return
            if attempt:
                finished, failed = self._reconnect(host, trial, attempt, last_error, last_dir)
                if finished:
                    return
                if failed is not None:
                    last_error = failed
                    continue
            ex = host.executor
            assert ex is not None
            last_dir = posixpath.join(ex.workdir, "trials", f"{trial.trial_id}-"
                                      f"{self.ctx.attempt_nonce}-{attempt}")
            try:
                self._attempt(host, trial, last_dir)
                return
            except ProviderError as exc:
                if self.ctx.stop.is_set():
                    return
                if not isinstance(exc, RETRYABLE):
                    raise
                last_error = f"connection lost: {one_line(exc)}"
        self.record(host, trial, None, None, status="failed",
                    error=f"gave up after {TRIAL_ATTEMPTS} attempts: {last_error}")

    def run_limit(self, host: HostSession, trial: TrialPlan, meta: dict[str, Any]) -> bool:
        """A --prove-limit/--find-limit trial: whether it ran unchanged under its limit."""
        self.limit_meta[trial.trial_id] = dict(meta)
        self.run(host, trial)
        return bool(self.limit_meta[trial.trial_id].get("ran_unchanged"))

    def _reconnect(self, host: HostSession, trial: TrialPlan, attempt: int, last_error: str,
                   last_dir: str | None) -> tuple[bool, str | None]:
        """Before a retry: wait, check the VM is still there, reconnect, and collect a
        result the last attempt left. (True, None): nothing more to do (stopping, or
        collected); (False, None): run it again; (False, why): the reconnect failed (the
        next attempt tries again)."""
        progress = self.ctx.progress
        progress.log(f"[yellow]{trial.trial_id}: {last_error}; retrying on the "
                     f"same machine ({attempt + 1}/{TRIAL_ATTEMPTS})")
        if self.ctx.stop.wait(RETRY_BACKOFF_S * 2 ** (attempt - 1)):
            return True, None
        host.check_alive()
        if host.provider.creates_machines:
            progress.log(f"{host.vm.machine.name}: reconnecting — waiting for SSH "
                         f"on {host.inst.address if host.inst else host.vm.name}")
        try:
            host.connect()
            if self._collect_earlier(host, trial, last_dir):
                return True, None
        except UnreachableError:
            if self.ctx.stop.is_set() or self._collect_earlier(host, trial, None):
                return True, None  # the runner, detached on the VM, put its result in the bucket
            raise  # the reconnect budget is spent: the machine is unreachable
        except RETRYABLE as exc:
            return False, one_line(exc)
        return False, None

    def _reconnected(self, host: HostSession) -> Any:
        """The host's executor after logging in again (a trial in flight reattaching)."""
        host.connect()
        if host.executor is None or self.ctx.stop.is_set():
            raise ConnectionLostError(f"stopped reconnecting to {host.vm.name}: sweep cancelled")
        return host.executor

    def _command(self, host: HostSession, trial: TrialPlan, request: TrialRequest) -> list[str]:
        """The runner's command line: through the host's warm runner where it can."""
        from orchestrator.engine.warm_runner import eligible

        ex = host.executor
        assert ex is not None
        argv = request.argv()
        warm = host.warm
        if warm is not None and warm.ready.is_set() and eligible(trial):
            return warm.argv(argv)
        return [ex.python, "-m", "workloads.run", *argv]

    def _attempt(self, host: HostSession, trial: TrialPlan, out_dir: str) -> None:
        """One run of the trial; raises ProviderError when the session drops."""
        key, ex = host.vm.name, host.executor
        assert ex is not None
        put = self._results_put(host, trial, out_dir)  # the runner puts its own results
        argv = self._command(host, trial, host_request(host, trial, out_dir, put.manifest))
        limit = self.timeouts.limit(trial)
        self.ctx.progress.trial_started(key, trial, self.ctx.spec.duration_s, limit)
        started = time.monotonic()
        try:
            result = detached.run(  # survives a dropped SSH session, for a reconnect budget
                ex, argv, out_dir, timeout=limit, stop=self.ctx.stop,
                on_line=put.watch(lambda line: self.ctx.progress.line(key, line)),
                reconnect=lambda: self._reconnected(host), patience=boot_timeout(),
                log=lambda line: self.ctx.progress.log(f"{trial.trial_id}: {line}"))
        except RemoteCommandError as exc:  # an SSH host stops it at the limit and says so
            if time.monotonic() - started < limit:
                raise
            result = CommandResult(exit_code=-1, stdout_tail="", stderr_tail=str(exc))
        elapsed = time.monotonic() - started
        if self.ctx.stop.is_set() and result.exit_code != protocol.EXIT_OK:
            self._collect(host, trial, out_dir, result, interrupted=True)
            return
        self._upload_results(host, trial, put)
        timed_out = elapsed >= limit and result.exit_code != protocol.EXIT_OK
        self._collect(host, trial, out_dir, result,
                      error=timeouts.reason(limit) if timed_out else None)
        if not timed_out and result.exit_code == protocol.EXIT_OK:
            self.timeouts.finished(trial, elapsed)

    # -- put ---------------------------------------------------------------------

    def _result_keys(self, trial: TrialPlan) -> dict[str, str]:
        from orchestrator.engine.prepare import results_prefix

        prefix = f"{results_prefix(self.ctx.plan)}{trial.trial_id}"
        names = (protocol.SUMMARY_FILE, protocol.TIMESERIES_FILE)
        return {name: f"{prefix}/{name}"
                for name in names + (JOB_LOG,) + (protocol.PROFILE_FILES if trial.profiled else ())}

    def _results_put(self, host: HostSession, trial: TrialPlan, out_dir: str) -> ResultsPut:
        """The trial's put manifest (a signed PUT URL per result file), on the host before the
        trial: its runner puts the files itself (``--put``), in the process that wrote them."""
        bucket = host.bucket
        if bucket is None:
            return ResultsPut()
        entries = [{"path": posixpath.join(out_dir, name), "optional": True,
                    "url": bucket.signed_url(key, "PUT", expires_s=self.ctx.url_lifetime_s)}
                   for name, key in self._result_keys(trial).items()]
        try:
            return ResultsPut(host.put_manifest(entries, f"put-{trial.trial_id}.json"), entries)
        except ProviderError:  # the trial still runs; the put after it writes the manifest
            return ResultsPut(None, entries)

    def _upload_results(self, host: HostSession, trial: TrialPlan, put: ResultsPut) -> None:
        """The host puts its result files in the bucket, where a dropped session cannot lose
        them: the runner did (``put.done``), else a ``transfer put`` process does it now (a
        runner killed, crashed or without ``--put``, or one that says its put failed)."""
        if host.bucket is None or put.done:
            return
        ex = host.executor
        assert ex is not None
        try:
            manifest = put.manifest or host.put_manifest(put.entries,
                                                         f"put-{trial.trial_id}.json")
            result = ex.run([ex.python, "-m", "workloads.transfer", "put", manifest],
                            timeout=600)
            reason = None if result.exit_code == 0 else last_line(result)
        except ProviderError as exc:  # a finished trial is still collected directly below
            reason = one_line(exc)
        if reason:
            self.ctx.progress.log(f"[yellow]{trial.trial_id}: results not copied to the "
                                  f"bucket: {reason}")

    # -- collect -----------------------------------------------------------------

    def _incoming(self, trial: TrialPlan) -> Path:
        path = self.ctx.store.run_dir / ".incoming" / trial.trial_id
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def _collect_earlier(self, host: HostSession, trial: TrialPlan, out_dir: str | None) -> bool:
        """A retried trial's result may already exist: in the bucket first, else on the host."""
        if self._collect_from_bucket(host, trial):
            return True
        if out_dir is not None:
            local = self._incoming(trial)
            summary, ts = self._fetch(host, out_dir, local)
            if summary and summary.get("status") != "interrupted":
                self.record(host, trial, summary, ts)
                self.ctx.progress.log(f"{trial.trial_id}: result fetched from the machine")
                return True
        return False

    def _collect_from_bucket(self, host: HostSession, trial: TrialPlan) -> bool:
        bucket = host.bucket
        if bucket is None:
            return False
        keys = self._result_keys(trial)
        local = self._incoming(trial)
        prefix = keys[protocol.SUMMARY_FILE].rsplit("/", 1)[0]
        try:  # list() takes a directory-like prefix: the trial's, not the key itself
            present = bucket.list(prefix)
        except CloudprofError:
            present = {}
        if keys[protocol.SUMMARY_FILE] not in present:
            return False
        bucket.download_dir(prefix, local)
        summary = read_summary(local / protocol.SUMMARY_FILE)
        if summary and summary.get("status") != "interrupted":
            self.record(host, trial, summary, local / protocol.TIMESERIES_FILE)
            self.ctx.progress.log(f"{trial.trial_id}: result fetched from the bucket")
            return True
        return False

    def _fetch(self, host: HostSession, out_dir: str,
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
        if self.ctx.spec.command is not None:  # the job's own output, kept in the store
            with contextlib.suppress(FileNotFoundError):
                ex.get(posixpath.join(out_dir, JOB_LOG), local / JOB_LOG)
        summary = read_summary(local / protocol.SUMMARY_FILE)
        for name in ((summary or {}).get("profile") or {}).get("files") or []:
            if name in protocol.PROFILE_FILES:  # names from the host: only the known ones
                with contextlib.suppress(FileNotFoundError):
                    ex.get(posixpath.join(out_dir, name), local / name)
        return summary, ts

    def _collect(self, host: HostSession, trial: TrialPlan, out_dir: str, result: CommandResult,
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
            error = f"runner exited {result.exit_code} without a summary: {last_line(result)}"
        elif result.exit_code not in (protocol.EXIT_OK, protocol.EXIT_MEMORY_BUDGET) \
                and not summary.get("error"):
            error = f"runner exited {result.exit_code}: {last_line(result)}"
        self.record(host, trial, summary, ts, status=status, error=error,
                    exit_code=result.exit_code)

    # -- record ------------------------------------------------------------------

    def record(self, host: HostSession, trial: TrialPlan, summary: dict[str, Any] | None,
               ts: Path | None, status: str | None = None, error: str | None = None,
               exit_code: int | None = None) -> None:
        """Put the trial in the store: a limit trial, a profiled one, or a throughput row."""
        row = trial_row(summary, host.vm.machine, trial=trial, sweep_id=self.ctx.plan.sweep_id,
                        ran_on=host.ran_on, provider=host.provider.name, spot=host.vm.spot,
                        status=status, error=error, exit_code=exit_code)
        run_dir = self.ctx.store.run_dir
        if trial.trial_id in self.limit_meta:  # kept apart too: see results/limits.py
            self._record_limit(trial, row, summary)
        elif trial.profiled:  # kept apart from the throughput trials: see results/profiles.py
            from orchestrator.results.profiles import record_profile

            record_profile(self.ctx.store, row, summary, ts)
            shutil.rmtree(run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
            self.ctx.progress.trial_done(host.vm.name, row)
        else:
            self._record_trial(host, trial, row, ts)

    def _record_limit(self, trial: TrialPlan, row: dict[str, Any],
                      summary: dict[str, Any] | None) -> None:
        from orchestrator.results.limits import record_limit

        rec = record_limit(self.ctx.store, row, summary, self.limit_meta[trial.trial_id])
        self.limit_meta[trial.trial_id] = rec
        shutil.rmtree(self.ctx.store.run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
        mark, what = (("[green]✓[/green]", "ran unchanged") if rec["ran_unchanged"]
                      else ("[red]✗[/red]", row.get("error") or row.get("status")))
        self.ctx.progress.log(f"  {mark} {trial.trial_id}: {what} "
                              f"(memory limit {fmt_bytes(rec['limit_bytes'])})")

    def _record_trial(self, host: HostSession, trial: TrialPlan, row: dict[str, Any],
                      ts: Path | None) -> None:
        store, run_dir = self.ctx.store, self.ctx.store.run_dir
        store.record_trial(row, ts if ts is not None and ts.is_file() else None)
        keep_summary(run_dir, trial.trial_id)
        log = run_dir / ".incoming" / trial.trial_id / JOB_LOG
        if log.is_file():
            (run_dir / "logs").mkdir(exist_ok=True)
            shutil.copyfile(log, run_dir / "logs" / f"{trial.trial_id}.log")
        shutil.rmtree(run_dir / ".incoming" / trial.trial_id, ignore_errors=True)
        self.ctx.progress.trial_done(host.vm.name, row)
