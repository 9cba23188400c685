"""The trial runner: ``python -m workloads.run`` runs one trial under the profiling agent.

One trial = one workload (or any command, like ``mprof run --include-children``)
at one worker count for a duration or a number of units. What it leaves behind
is the whole contract with the orchestrator (``workloads.protocol``): the exit
code, a progress line a second on stderr, ``summary.json`` and
``timeseries.parquet`` — both written atomically, and the summary written even
when the trial fails, so a collector never finds half a result.

    python -m workloads.run --workers 2 --duration 4 --out /tmp/trial
    python -m workloads.run --workload memory-leak --param mb_per_s=50 --duration 5 --out /tmp/leak
    python -m workloads.run --memory-budget 2G --out /tmp/t --command -- python train.py

The peak memory of a command's process tree is what a container's memory limit must allow:
what the tree cannot give back. ``peak_rss_bytes`` (source ``held``) is the highest sample
of anonymous memory plus the file pages the tree maps (libraries, mmapped data), each page
counted once across its processes, and not the page cache of files it only read (the
kernel reclaims that under a limit):

* anonymous: the trial cgroup's ``memory.stat`` (v1 ``total_rss``, v2 ``anon``: each page
  charged once), else the sum of each process's RssAnon (``statm``), where copy-on-write
  pages shared after a fork count once per process (an overestimate for forking jobs);
* file pages counted once: the larger of the sum of ``Pss_File + Pss_Shmem`` and the
  largest process's own file pages (``Rss − Anonymous``), from ``smaps_rollup`` at most
  once a second, or the cgroup's mapped file pages where more. Rss would count a library
  once per process that maps it (four numpy processes: 52 MiB for 13); Pss counts a page
  shared with processes outside the tree (libc, the interpreter) only in part. Both are
  lower bounds of the union; the error is at most ``peak_basis.file_sum_bytes −
  file_once_bytes``.

Sampling misses a peak between samples; with a cgroup, its high-water mark less the most
it was charged besides anonymous and mapped pages (page cache, kernel memory: in two
samples in a row, and what it still held once the tree was reaped) is a lower bound that catches it
(source ``held_cgroup``), on the assumption that the page cache did not rise and fall
between two samples. The largest process's own ``VmHWM`` is a floor (source ``vmhwm``).
The other bases stay in the summary (``peak_usage_with_cache_bytes``,
``peak_rss_sampled_bytes``, ``peak_rss_upper_bound_bytes``) and ``peak_bases_note`` names
those more than 10 % away. A workload in this process is one process: its ``VmHWM`` is that
basis already. ``--memory-limit BYTES`` runs the tree under a cgroup limit, as a container,
and records OOM kills (``memory_limit``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads import cgroup as cgroups

# What every trial needs; --command --job, --profile and --put load theirs when asked
# (a plain trial's runner never imports workloads.job, the profilers' base, urllib.request).
from workloads import limits, procfs, profilers, protocol
from workloads.agent import Agent, AgentReport
from workloads.base import UnitCounter, Workload, WorkloadInputError
from workloads.profilers import torch_gpu
from workloads.runner_args import (
    UsageError,
    _check_args,
    _guess_out,
    _make_workload,
    _now,
    _one_line,
    _parse_params,
    _split_command,
    _trial_params,
    parser,
)
from workloads.trial_results import (
    _SYNCED,
    _warm_result_writer,
    fill_measurements,
    write_summary,
    write_timeseries,
)

if TYPE_CHECKING:
    from workloads import job as jobs

TERMINATE_GRACE_S = 3.0  # SIGTERM first, SIGKILL after this
# How this trial's process began; workloads.warm sets it in the trials it forks.
STARTED_AS = "fresh interpreter"
# time.monotonic() just before the fork that began this trial's process, where that is known
# exactly: workloads.warm sets it in the trials it forks. None: ask /proc (to a 10 ms tick).
FORKED_AT: float | None = None


def base_summary(params: dict[str, Any]) -> dict[str, Any]:
    """Every key of protocol.SUMMARY_KEYS, filled with "nothing measured yet"."""
    from workloads.hostinfo import host_facts

    return {
        "schema": protocol.SCHEMA,
        "status": "failed",
        "error": None,
        "params": params,
        "host": host_facts(),
        "unit": None,
        "units": 0,
        "seconds": 0.0,
        "units_per_s": 0.0,
        "peak_rss_bytes": None,
        "peak_rss_source": None,
        "peak_rss_trial_bytes": None,
        "peak_phase": None,
        "peak_rss_sampled_bytes": None,
        "cpu_percent_mean": None,
        "cpu_utilisation": None,
        "leak": {"verdict": "inconclusive", "slope_mb_per_s": None},
        "spikes": [],
        "memory_budget": {"limit_bytes": params.get("memory_budget_bytes"), "breached": False},
        "gpu": None,
        "agent": {"samples": 0, "rate_hz_target": params.get("sample_hz"),
                  "rate_hz_achieved": 0.0, "cpu_seconds": 0.0},
        "started_at": _now(),
        "finished_at": None,
        "job_kind": None,
        "phases": [],
        "profiled": params.get("profile") is not None,
        # load_s counts from this process's start: a forked trial's excludes the imports
        "runner_start": STARTED_AS,
        "profile": None,
    }  # fmt: skip


# -- the trial ----------------------------------------------------------------------------


class _Signals:
    """SIGINT/SIGTERM → stop the trial cleanly and report it as interrupted."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake
        self.received: int | None = None
        self.tree: int | None = None  # a command's root pid, killed on a second signal
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received is not None:  # asked twice: the workload is not stopping, leave now
            if self.tree is not None:  # never leave a command's processes behind
                for pid in [self.tree, *procfs.descendants(self.tree)]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            print("error: interrupted again; exiting without a summary", file=sys.stderr)
            os._exit(protocol.EXIT_INTERRUPTED)
        self.received = signum
        self.wake.set()

    def __exit__(self, *_exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.next_at = 1.0

    def due_in(self, t: float) -> float:
        return max(0.0, self.next_at - t)

    def maybe(self, t: float, units: int, rss: int, force: bool = False) -> None:
        if t < self.next_at and not force:
            return
        while self.next_at <= t:
            self.next_at += 1.0
        if not self.quiet:
            rate = units / t if t > 0 else 0.0
            print(protocol.format_progress(t, units, rate, rss), file=sys.stderr, flush=True)


def _seconds_since_process_start() -> float | None:
    """How long this process ran before its trial: interpreter start, imports, input loading,
    warm-up. The agent samples only the trial; reports draw this span before t = 0.

    A forked trial counts from its fork on the monotonic clock (no rounding); a fresh one
    from its start as the kernel records it, on ``CLOCK_BOOTTIME`` (``procfs.age``: at most
    one 10 ms tick long), never from the wall clock and the boot time."""
    if FORKED_AT is not None:
        return round(max(0.0, time.monotonic() - FORKED_AT), 3)
    age = procfs.age()
    # None where /proc cannot say: the report shows no load phase
    return None if age is None else round(age, 3)


def _load_workload(args: argparse.Namespace, summary: dict[str, Any]) -> Workload:
    """The workload made and prepared, its own load phase timed, and the speed limit of its
    unit on this host where it says how many bytes a unit moves."""
    params = summary["params"]
    workload = _make_workload(args, params)
    summary["unit"] = workload.unit
    prepare_started = time.perf_counter()
    workload.prepare()
    # the workload's own load phase, apart from the interpreter's start and the imports that
    # load_s also holds: what the user's code costs before its clock, not cloudprof's start-up
    summary["prepare_s"] = round(time.perf_counter() - prepare_started, 6)
    params["workload_resolved"] = workload.describe()
    per_unit = workload.bytes_per_unit()
    if per_unit:  # the unit's speed limit on this host, once per host (workloads/bound.py)
        from workloads.bound import bound_at, host_bound

        found = host_bound(per_unit)
        summary["bound"] = {**found, "units_per_s": bound_at(found, args.workers)}
    return workload


def _run_workload(args: argparse.Namespace, summary: dict[str, Any], sig: _Signals) -> int:
    params = summary["params"]
    # memory attribution covers loading too (the peak is often in prepare()); cpu starts below.
    # pyarrow's arenas (a 1 GiB mmap reservation) are cloudprof's, mapped before tracking.
    if args.profile in profilers.LIFETIME:
        _warm_result_writer()
    early = profilers.start_lifetime_profile(args.profile, args.out)
    workload = _load_workload(args, summary)
    if args.warmup > 0:
        _drive(workload, args.workers, args.warmup, None, sig, None, None)
    if sig.received:
        summary["status"] = "interrupted"
        summary["profile"] = profilers.finish_profile(early)
        return protocol.EXIT_INTERRUPTED

    stop = threading.Event()
    counter = UnitCounter()

    def on_breach(_rss: int) -> None:
        stop.set()
        sig.wake.set()

    _warm_result_writer()
    agent = Agent(
        sample_hz=args.sample_hz,
        memory_budget=args.memory_budget,
        on_breach=on_breach,
        units=counter,
    )
    profile = early
    own_tids = {threading.get_native_id()}  # cloudprof's threads; the agent's join below
    if profile is None and args.profile is not None:  # a kind that watches the timed part
        profile = profilers.start_profile(args.profile, args.out, profilers.Target(
            os.getpid(), in_process=True, exclude_tids=own_tids,
            exclude_thread_names={"workload"},
        ))  # fmt: skip
    profilers.steady_state_begins(profile)
    # the load phase, drawn before t = 0; read before started_at, so that started_at less the
    # moment the process was started bounds it from above (the tests check load_s by that)
    summary["load_s"] = _seconds_since_process_start()
    summary["started_at"] = _now()
    agent.start()
    own_tids |= agent.thread_ids  # in place: py-spy may never name the agent's reader thread
    progress = _Progress(args.quiet)
    failure: BaseException | None = None
    start = time.perf_counter()
    try:
        seconds = _drive(
            workload, args.workers, params["duration_s"], params["units_target"], sig, agent,
            progress, stop=stop, counter=counter, own_tids=own_tids,
        )  # fmt: skip
    except Exception as exc:  # still record what was measured up to the failure
        failure, seconds = exc, time.perf_counter() - start
    finally:
        report = agent.stop()
        report.torch_peak_bytes = torch_gpu.torch_peak_in_process()
        summary["profile"] = profilers.finish_profile(profile)
    summary["finished_at"] = _now()
    summary["units"] = counter.value
    summary["seconds"] = round(seconds, 6)
    summary["units_per_s"] = counter.value / seconds if seconds > 0 else 0.0
    node_summaries = getattr(workload, "node_summaries", None)
    if node_summaries is not None:  # a Ray trial: one entry per node, and the cluster's sums
        from workloads.ray_trial import cluster_totals

        summary["nodes"] = node_summaries()
        summary["cluster"] = cluster_totals(summary["nodes"])
    code = _finish(args, summary, report, sig)
    if failure is not None:
        raise failure
    return code


def _drive(
    workload: Workload,
    workers: int,
    duration: float | None,
    units: int | None,
    sig: _Signals,
    agent: Agent | None,
    progress: _Progress | None,
    *,
    stop: threading.Event | None = None,
    counter: UnitCounter | None = None,
    own_tids: set[int] | None = None,
) -> float:
    """Run the workload in a thread until the duration/units are reached; returns seconds.

    The driver thread's id joins ``own_tids`` (a profile's exclusions): py-spy does not
    always read a thread's name on a busy host, and this thread only waits on the workers.
    """
    stop = stop or threading.Event()
    counter = counter or UnitCounter()
    error: list[BaseException] = []
    wake = sig.wake

    def target() -> None:
        try:
            workload.run(workers, stop, counter)
        except BaseException as exc:
            error.append(exc)
        finally:
            wake.set()

    start = time.perf_counter()
    thread = threading.Thread(target=target, name="workload", daemon=True)
    thread.start()
    if own_tids is not None and thread.native_id is not None:
        own_tids.add(thread.native_id)
    end_at = start + duration if duration is not None else None
    while thread.is_alive():
        now = time.perf_counter()
        t = now - start
        if progress is not None and agent is not None:
            progress.maybe(t, counter.value, agent.latest_rss)
        if (
            sig.received
            or stop.is_set()
            or (end_at is not None and now >= end_at)
            or (units is not None and counter.value >= units)
        ):
            stop.set()
            thread.join()
            break
        timeout = progress.due_in(t) if progress is not None else 1.0
        if end_at is not None:
            timeout = min(timeout, end_at - now)
        if units is not None:
            timeout = min(timeout, 0.02)  # counting units: look often, it is cheap
        wake.wait(max(timeout, 0.0))
        wake.clear()
    seconds = time.perf_counter() - start
    if progress is not None and agent is not None:
        progress.maybe(seconds, counter.value, agent.latest_rss, force=True)
    if error:
        raise error[0]
    return seconds


def _terminate_tree(root: int, pgid: int) -> None:
    """SIGTERM the command's process group and every descendant; SIGKILL what is left."""
    victims = [root, *procfs.descendants(root)]
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGTERM)
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)

    def finish() -> None:
        time.sleep(TERMINATE_GRACE_S)
        for pid in [*victims, *procfs.descendants(root)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    threading.Thread(target=finish, daemon=True).start()


def _run_command(
    args: argparse.Namespace, command: list[str], summary: dict[str, Any], sig: _Signals
) -> int:
    summary["unit"] = None
    # A forked child inherits this process's RSS counters until it execs, and the kernel
    # folds them into the child's ru_maxrss: that RSS is a floor under a command's peak.
    floor = procfs.ProcReader(os.getpid())
    spawn_rss = floor.read().rss_bytes
    floor.close()
    env = None
    if args.job or args.chdir is not None:
        from workloads import job as jobs
    if args.job:
        values = {**_parse_params(args.var), "workers": str(args.workers),
                  "vcpus": str(os.cpu_count() or 1)}
        try:
            command = jobs.expand(command, values, args.shell)
        except jobs.JobError as exc:
            raise UsageError(str(exc)) from None
        env = jobs.job_env(values)
    if args.chdir is not None:  # the job's processes import from its copy (and site dir)
        env = jobs.with_pythonpath(env if env is not None else os.environ, args.job_paths)
    env = torch_gpu.hook_env(env if env is not None else os.environ, args.out)
    if args.profile == "memory":  # what is on each Python process's heap at its peak
        from workloads.profilers.heap import heap_env

        env = heap_env(env, args.out)
    if args.ray_address:  # the user's own Ray program joins the sweep's cluster as its driver
        from workloads.ray_trial import RAY_ENV

        env = {**(env if env is not None else os.environ), **RAY_ENV,
               "RAY_ADDRESS": args.ray_address}
        summary["params"]["ray"] = {"nodes": args.ray_nodes, "address": args.ray_address}
    group = _trial_cgroup(summary)
    if args.memory_limit is not None:
        _limit(group, args.memory_limit, summary)
    try:
        code = _run_command_in(args, command, summary, sig, env, spawn_rss, group)
        if args.memory_limit is not None and group is not None:
            code = _judge_limit(group, args.memory_limit, summary, code)
        return code
    finally:
        problem = group.remove() if group is not None else None
        if problem is not None:  # a leftover of this trial on the host: say it loudly
            print(f"error: {problem}", file=sys.stderr, flush=True)
            summary.setdefault("cgroup_error", problem)


def _limit(group: cgroups.TrialCgroup | None, limit: int, summary: dict[str, Any]) -> None:
    """``--memory-limit``: the trial's cgroup under it, or a usage error saying why not."""
    if group is None:
        raise UsageError("--memory-limit needs a memory cgroup: "
                         f"{summary.get('peak_rss_note') or 'none could be made'}")
    try:
        group.set_limit(limit)
    except cgroups.CgroupUnavailable as exc:
        group.remove()
        raise UsageError(f"--memory-limit: {exc}") from None
    summary["memory_limit"] = {"limit_bytes": limit, "oom_kills": None, "ran_unchanged": None}


def _judge_limit(group: cgroups.TrialCgroup, limit: int, summary: dict[str, Any],
                 code: int) -> int:
    """Did the job run under the limit? An OOM kill of any of its processes says no."""
    kills = group.oom_kills()
    summary["memory_limit"]["oom_kills"] = kills
    summary["memory_limit"]["ran_unchanged"] = code == protocol.EXIT_OK and not kills
    if kills and summary["status"] != "interrupted":
        summary["status"] = "failed"
        summary["error"] = (f"the kernel's OOM killer killed {kills} process(es) of the job "
                            f"under the memory limit of {_human(limit)}")
        return protocol.EXIT_FAILED
    return code


def _trial_cgroup(summary: dict[str, Any]) -> cgroups.TrialCgroup | None:
    """A memory cgroup for the command's tree (its exact peak), or None and a one-line note."""
    try:
        group = cgroups.TrialCgroup.create()
        summary["cgroup"] = {"version": group.version, "path": str(group.path)}
        return group
    except cgroups.CgroupUnavailable as exc:
        summary["peak_rss_note"] = (
            f"no memory cgroup ({exc}): the tree's anonymous memory is summed per process, "
            "so pages its processes share after a fork count once per process")
        return None


def _spawn(args: argparse.Namespace, command: list[str], env: Any,
           group: cgroups.TrialCgroup | None) -> subprocess.Popen[Any]:
    """Start the command in a session of its own, in the trial's cgroup from its first step."""
    steps = [f for f in (group.join_in_child if group is not None else None,
                         profilers.allow_tracing_by(os.getpid()) if args.profile else None) if f]

    def before_exec() -> None:  # in the child: into the cgroup before it does any work
        for step in steps:
            step()

    try:
        return subprocess.Popen(
            profilers.wrap_command(args.profile, command, args.out, env),
            start_new_session=True, env=env,
            preexec_fn=before_exec if steps else None,
            stdout=subprocess.PIPE if args.job else None,
            stderr=subprocess.STDOUT if args.job else None,
            text=True if args.job else None, errors="replace" if args.job else None,
        )  # fmt: skip
    except OSError as exc:
        raise UsageError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc


def _run_command_in(
    args: argparse.Namespace, command: list[str], summary: dict[str, Any], sig: _Signals,
    env: Any, spawn_rss: int, group: cgroups.TrialCgroup | None,
) -> int:
    wake = sig.wake
    if args.job:
        from workloads import job as jobs
    start = time.perf_counter()
    summary["started_at"] = _now()
    proc = _spawn(args, command, env, group)
    sig.tree = proc.pid
    waited: dict[str, Any] = {}

    def waiter() -> None:
        _pid, status, rusage = os.wait4(proc.pid, 0)
        sig.tree = None  # reaped: its pid may be reused from now on
        waited.update(status=status, rusage=rusage, at=time.perf_counter())
        proc.returncode = os.waitstatus_to_exitcode(status)
        wake.set()

    breach = threading.Event()

    def on_breach(_rss: int) -> None:
        breach.set()
        wake.set()

    counter = UnitCounter() if args.job else None
    agent = Agent(
        proc.pid, include_children=True, sample_hz=args.sample_hz,
        memory_budget=args.memory_budget, on_breach=on_breach, units=counter,
        cgroup_stat=str(group.stat_path) if group is not None else None,
    )  # fmt: skip
    agent.start()
    reader: jobs.OutputReader | None = None
    bad_output = threading.Event()
    if args.job:
        assert proc.stdout is not None and counter is not None
        t0 = agent.t0

        def on_error(_message: str) -> None:
            bad_output.set()
            wake.set()

        reader = jobs.OutputReader(proc.stdout, args.out / jobs.LOG_FILE, counter,
                                   lambda: time.perf_counter() - t0, proc.pid, on_error).start()
    threading.Thread(target=waiter, name="wait4", daemon=True).start()
    profile = None if args.profile is None else profilers.start_profile(
        args.profile, args.out, profilers.Target(proc.pid, in_process=False, subprocesses=True)
    )
    progress = _Progress(args.quiet)
    end_at = start + args.duration if args.duration is not None else None
    stopped_by = _watch_tree(proc.pid, waited, sig, breach=breach, bad_output=bad_output,
                             start=start, end_at=end_at, progress=progress, agent=agent,
                             counter=counter)
    seconds = waited["at"] - start
    tree_peak = left = None
    if group is not None:
        peak, left = group.peak_bytes(), group.usage_bytes()
        tree_peak = (peak, group.version) if peak is not None else None
    report = agent.stop(child_rusage=waited["rusage"], tree_peak=tree_peak, tree_left_bytes=left)
    report.torch_peak_bytes = torch_gpu.read_hook_peak(args.out)
    if reader is not None:
        reader.join()
    units = counter.value if counter is not None else 0
    summary["profile"] = profilers.finish_profile(profile)
    progress.maybe(seconds, units, report.peak_rss_sampled_bytes, force=True)
    summary["finished_at"] = _now()
    summary["seconds"] = round(seconds, 6)
    summary["command"] = {
        "argv": command, "pid": proc.pid, "exit_code": proc.returncode, "stopped_by": stopped_by,
        "runner_rss_at_spawn_bytes": spawn_rss,
    }  # fmt: skip
    code = _finish(args, summary, report, sig)
    for key in ("peak_rss_note", "peak_bases_note"):  # not exact; other bases far from it
        if summary.get(key) and not args.quiet:
            print(f"note: {summary[key]}", file=sys.stderr, flush=True)
    if reader is not None:
        reader.fill_summary(summary, report, seconds, waited["at"] - agent.t0)
    return _judge_command(args, summary, code, reader, stopped_by, seconds, proc.returncode)


def _watch_tree(
    pid: int, waited: dict[str, Any], sig: _Signals, *, breach: threading.Event,
    bad_output: threading.Event, start: float, end_at: float | None, progress: _Progress,
    agent: Agent, counter: UnitCounter | None,
) -> str | None:
    """Wait for the command's tree to be reaped, ending it on a signal, a memory budget
    breach, bad output or ``--duration``; returns which of them ended it (None: it ended)."""
    wake = sig.wake
    stopped_by: str | None = None
    try:
        while "status" not in waited:
            now = time.perf_counter()
            progress.maybe(now - start, counter.value if counter else 0, agent.latest_rss)
            reason = (
                "signal" if sig.received else "memory_budget" if breach.is_set()
                else "bad_output" if bad_output.is_set()
                else "duration" if end_at is not None and now >= end_at else None
            )  # fmt: skip
            if reason and stopped_by is None:
                stopped_by = reason
                _terminate_tree(pid, pid)
            timeout = progress.due_in(now - start)
            if end_at is not None and stopped_by is None:
                timeout = min(timeout, end_at - now)
            wake.wait(max(timeout, 0.0))
            wake.clear()
    finally:
        if "status" not in waited:  # an exception in our loop: never leave the tree running
            _terminate_tree(pid, pid)
    return stopped_by


def _judge_command(
    args: argparse.Namespace, summary: dict[str, Any], code: int,
    reader: jobs.OutputReader | None, stopped_by: str | None, seconds: float,
    returncode: int | None,
) -> int:
    """A measured command that exited badly, printed errors, or was cut short before it
    reported units failed, though the agent saw nothing wrong."""
    if code == protocol.EXIT_OK and reader is not None and reader.error:
        summary["status"] = "failed"
        summary["error"] = reader.error
        return protocol.EXIT_FAILED
    if (code == protocol.EXIT_OK and reader is not None and stopped_by == "duration"
            and not reader.reported_units):
        # A fixed-work job cut short measured nothing whole: no time to complete, no cost.
        summary["status"] = "failed"
        summary["error"] = (f"--duration {args.duration:g} s stopped the job before it "
                            "finished, and it reported no units (cloudprof:units N)")
        return protocol.EXIT_FAILED
    if code == protocol.EXIT_OK and returncode != 0 and stopped_by != "duration":
        summary["status"] = "failed"
        summary["error"] = f"command exited with code {returncode}" + (
            f" after {seconds:.1f} s" if args.job else "")
        if args.job:
            from workloads.job import LOG_FILE

            summary["error"] += f" (its output is in {LOG_FILE})"
        code = protocol.EXIT_FAILED
    return code


def _human(n: int | None) -> str:
    """A size for a person, with the exact bytes: ``1.5 GiB (1610612736 bytes)``."""
    return "?" if n is None else f"{limits.format_size(n)} ({n} bytes)"


def _finish(
    args: argparse.Namespace, summary: dict[str, Any], rep: AgentReport, sig: _Signals
) -> int:
    """Fill measurements, write the time series, decide status and exit code."""
    fill_measurements(summary, rep, summary["host"].get("cores_logical"))
    write_timeseries(args.out, rep)
    if summary["agent"].get("rate_note") and not args.quiet:  # it sampled less than asked
        print(f"note: {summary['agent']['rate_note']}", file=sys.stderr, flush=True)
    if rep.budget_breached:
        summary["status"] = "memory_budget_exceeded"
        summary["error"] = (
            f"memory budget of {_human(rep.budget_limit_bytes)} exceeded: RSS "
            f"{_human(rep.budget_breach_rss_bytes)} at t={rep.budget_breach_t}s; trial stopped"
        )
        return protocol.EXIT_MEMORY_BUDGET
    if sig.received:
        summary["status"] = "interrupted"
        summary["error"] = f"interrupted by {signal.Signals(sig.received).name}"
        return protocol.EXIT_INTERRUPTED
    if summary["memory_budget"]["breached"]:
        summary["status"] = "memory_budget_exceeded"
        summary["error"] = (
            f"peak RSS {_human(rep.peak_rss_bytes)} exceeded the memory budget of "
            f"{_human(rep.budget_limit_bytes)} between two samples"
        )
        return protocol.EXIT_MEMORY_BUDGET
    summary["status"] = "ok"
    return protocol.EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    own, command = _split_command(raw)
    wake = threading.Event()
    summary: dict[str, Any] | None = None
    out: Path | None = _guess_out(own)
    put: tuple[str, Path] | None = None  # --put as given (named in the line), and its file
    code = protocol.EXIT_FAILED
    error: str | None = None
    with _Signals(wake) as sig:
        try:
            args = parser().parse_args(own)
            out = args.out
            if args.put is not None:  # before --chdir moves the working directory
                put = (args.put, Path(os.path.abspath(args.put)))
            _check_args(args, command)
            if args.chdir is not None:
                from workloads import job as jobs

                out = args.out = args.out.resolve()  # before the working directory moves
                try:
                    args.job_paths = jobs.enter_copy(args.chdir)
                except jobs.JobError as exc:
                    raise UsageError(str(exc)) from None
            summary = base_summary(_trial_params(args, command))
            if args.command:
                assert command is not None
                code = _run_command(args, command, summary, sig)
            else:
                code = _run_workload(args, summary, sig)
        except (UsageError, WorkloadInputError) as exc:
            code = protocol.EXIT_USAGE
            error = _report_error(summary, exc)
        except Exception as exc:
            code = protocol.EXIT_FAILED
            error = _report_error(summary, exc)
            import traceback  # only here: the details of a failure nobody expected

            _save_traceback(out, traceback.format_exc())
        if sig.received and code not in (protocol.EXIT_MEMORY_BUDGET, protocol.EXIT_USAGE):
            code = protocol.EXIT_INTERRUPTED
            if summary is not None:
                summary["status"] = "interrupted"
                summary["error"] = summary["error"] or "interrupted"
        if error is None and summary is not None and summary["error"]:
            print(f"error: {summary['error']}", file=sys.stderr, flush=True)
    if out is not None:
        if summary is None:  # failed before the parameters were known
            summary = base_summary({})
            summary["error"] = error
        summary["finished_at"] = summary["finished_at"] or _now()
        try:
            write_summary(out, summary)
        except OSError as exc:
            print(f"error: cannot write {out / protocol.SUMMARY_FILE}: {exc}", file=sys.stderr)
            return code or protocol.EXIT_FAILED
        if put is not None:  # every result file is on disk: now into the bucket
            _put_results(*put, interrupted=sig.received is not None)
    return code


def _put_results(manifest: str, path: Path, interrupted: bool) -> None:
    """``--put``: upload the result files from this process, with ``workloads.transfer``'s
    own code (a process start saved per trial), and say how it went in one line.

    Whatever the outcome, the trial's exit code stays what the trial decided: the
    orchestrator puts the files itself unless it reads "ok" for its manifest. An
    interrupted trial puts nothing: the orchestrator knows whether the sweep is stopping.
    """
    if interrupted:
        print(protocol.format_put("skipped", manifest, "the trial was interrupted"),
              file=sys.stderr, flush=True)
        return
    from workloads import transfer

    with _Signals(threading.Event()):  # a first Ctrl-C lets the upload finish; a second exits
        try:
            entries = transfer.load_manifest(path)
            # summary.json last, as on disk: a summary in the bucket says the rest is there
            last = [e for e in entries if Path(e["path"]).name == protocol.SUMMARY_FILE]
            synced = frozenset(_SYNCED)  # the result files this process wrote and synced
            errors = transfer.put_all([e for e in entries if e not in last], synced)
            errors = errors or transfer.put_all(last, synced)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            errors = [f"cannot read the manifest: {_one_line(exc)}"]
    line = (protocol.format_put("failed", manifest, "; ".join(errors)) if errors
            else protocol.format_put("ok", manifest))
    print(line, file=sys.stderr, flush=True)


def _report_error(summary: dict[str, Any] | None, exc: BaseException) -> str:
    """The one ``error:`` line on stderr, mirrored in the summary."""
    message = _one_line(exc)
    print(f"error: {message}", file=sys.stderr, flush=True)
    if summary is not None:
        summary["status"] = "failed"
        summary["error"] = message
    return message


def _save_traceback(out: Path | None, tb: str) -> None:
    """An unexpected failure: keep the details next to the summary, not on the terminal."""
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "traceback.txt").write_text(tb, encoding="utf-8")
    except OSError:
        pass


if __name__ == "__main__":
    raise SystemExit(main())
