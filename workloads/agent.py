"""The profiling agent: samples a process or a process tree from a sampler process.

Why it looks the way it does:

* **Low overhead.** The sampling runs in a separate process (``workloads.sampler``,
  which says why), so the profiled Python process never gives up its GIL to it;
  every sample there is a ``pread`` of /proc files opened once.
* **Exact peaks.** Sampling misses anything shorter than the interval, so the
  peak comes from the kernel: in-process we reset VmHWM at the start of the trial
  (``clear_refs``) and read it at the end; for a command we take the children's
  ``ru_maxrss`` from ``wait4``. The sampled maximum is kept beside it, and the
  difference between the two is how a spike between samples is detected.
* **Budget.** Each sample is checked against an optional memory budget; the first
  breach is recorded and ``on_breach`` is called here (the runner stops the
  workload or kills the command's tree) before the OOM killer picks a victim.
* **Out of the workers' way.** The sampler process runs under SCHED_BATCH by
  default: waking, it never preempts a worker (which may hold the GIL the
  others wait for); it runs at the next scheduler tick or on a free core.
* **Honest about itself.** It counts its samples, the rate it achieved, the
  samples it skipped and how late the others came (a deprioritised sampler on a
  busy host is late, and says so in ``rate_note``), the CPU seconds its sampling
  used while the trial ran, and the CPU its process start cost before the trial
  (both the sampler's own, from its process).
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads import limits, procfs
from workloads.base import UnitCounter
from workloads.protocol import TIMESERIES_COLUMNS
from workloads.sampler import DEFAULT_SCHED, SCHED_POLICIES, Sampler, SamplerConfig, SamplerResult
from workloads.shared import SharedInt

SAMPLER_START_TIMEOUT_S = 60.0
# A trial forked from a warm runner (workloads.warm): the server's own high-water mark after
# the imports it did for the trial, which a fresh process's VmHWM would hold.
IMPORTS_PEAK_BYTES = 0
# ...and how it starts its sampler: forked by that server (config JSON, fds to keep) →
# a Popen-like process, or None to start one as usual.
SPAWN_SAMPLER: Callable[[str, list[int]], Any] | None = None
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


# The sampler process's program (``python -S -c``): workloads.sampler_process.main(sys.argv[1:]).
SAMPLER_MAIN = "import sys; from workloads.sampler_process import main; sys.exit(main())"


def sampler_path(pythonpath: str | None) -> str:
    """PYTHONPATH for the sampler process, which starts without ``site`` (``python -S``): this
    package's root, the caller's PYTHONPATH, then this process's whole sys.path, which holds
    the site directories ``site`` found here (pynvml for the GPU path; the wheel in a VM's venv).
    """
    paths = [_PACKAGE_ROOT, *(pythonpath or "").split(os.pathsep), *sys.path]
    return os.pathsep.join(dict.fromkeys(p for p in paths if p))  # in order, each once


@dataclass
class AgentReport:
    """What the agent measured; the runner turns it into summary.json and the time series."""

    rows: list[tuple] = field(default_factory=list)  # in TIMESERIES_COLUMNS order
    rate_hz_target: float = 0.0
    rate_hz_achieved: float = 0.0
    samples_missed: int = 0  # due on the clock but skipped: the sampler got no core in time
    lag_ms: dict[str, float] | None = None  # how late the scheduled samples came (p50, p99, max)
    sched_policy: str | None = None  # the sampler process's CPU policy (None: no sampler)
    cpu_seconds: float = 0.0  # the sampler's own CPU while the trial ran
    startup_cpu_seconds: float = 0.0  # starting the sampler process, before t = 0
    wall_s: float = 0.0
    cpu_seconds_total: float = 0.0  # the profiled process (tree), user + system
    peak_rss_bytes: int = 0
    peak_rss_source: str = "sampled"
    peak_rss_sampled_bytes: int = 0
    peak_rss_upper_bound_bytes: int | None = None  # command mode: sum of per-process peaks
    # command mode: the tree's cgroup high-water mark (page cache it read included) and its
    # version; the held split of the headline (anon source, file pages counted once / summed)
    peak_usage_with_cache_bytes: int | None = None
    peak_usage_with_cache_source: str | None = None
    held_basis: dict[str, Any] | None = None
    peak_rss_before_bytes: int | None = None  # in-process: lifetime peak when the trial began
    peak_rss_before_source: str | None = None  # "vmhwm" (or "ru_maxrss" without /proc status)
    budget_limit_bytes: int | None = None
    budget_breached: bool = False
    budget_breach_t: float | None = None
    budget_breach_rss_bytes: int | None = None
    gpu: dict[str, Any] | None = None
    gpu_note: str | None = None  # why ``gpu`` is None, in one line
    torch_peak_bytes: int | None = None  # PyTorch's CUDA allocator peak (the runner sets it)
    error: str | None = None

    @property
    def samples(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list:
        i = TIMESERIES_COLUMNS.index(name)
        return [r[i] for r in self.rows]

    def agent_summary(self) -> dict[str, Any]:
        out = {
            "samples": self.samples,
            "rate_hz_target": self.rate_hz_target,
            "rate_hz_achieved": round(self.rate_hz_achieved, 3),
            "cpu_seconds": round(self.cpu_seconds, 6),
            "cpu_fraction_of_one_core": round(self.cpu_seconds / self.wall_s, 6)
            if self.wall_s > 0
            else 0.0,
            "startup_cpu_seconds": round(self.startup_cpu_seconds, 6),
            "sched_policy": self.sched_policy,
            "samples_missed": self.samples_missed,
            "lag_ms": self.lag_ms,
        }
        note = self.rate_note()
        if note:
            out["rate_note"] = note
        if self.error:
            out["error"] = self.error
        return out

    def rate_note(self) -> str | None:
        """One line when the sampler skipped over a tenth of its scheduled samples."""
        due = round(self.rate_hz_achieved * self.wall_s) + self.samples_missed
        if self.rate_hz_target <= 0 or due == 0 or self.samples_missed <= 0.1 * due:
            return None
        late = f", the median one {self.lag_ms['p50']:g} ms late" if self.lag_ms else ""
        achieved = round(self.rate_hz_achieved, 3)  # the summary's figure, rounded as there
        return (f"sampled at {achieved:.1f} Hz of the {self.rate_hz_target:g} Hz "
                f"asked: {self.samples_missed} of {due} scheduled samples skipped{late} "
                f"(the sampler runs at {self.sched_policy} priority and got no core in time)")

    def budget_summary(self) -> dict[str, Any]:
        return {
            "limit_bytes": self.budget_limit_bytes,
            "breached": self.budget_breached,
            "breach_t": self.budget_breach_t,
            "breach_rss_bytes": self.budget_breach_rss_bytes,
        }


def gpu_summary(rep: AgentReport, names: list[str]) -> dict[str, Any]:
    """summary.json's ``gpu``: the devices' and the trial's own use, from the sampled series.

    ``peak_mem_bytes`` is the headline: the trial's processes where NVML lists
    them (``peak_source`` says which), else the whole device's memory in use.
    The runner adds a PyTorch job's allocator peak (``torch_peak_allocated_bytes``).
    """

    def values(name: str) -> list[Any]:
        return [v for v in rep.column(name) if v is not None]

    mem, util = values("gpu_mem_bytes"), values("gpu_util")
    proc_mem, proc_util = values("gpu_proc_mem_bytes"), values("gpu_proc_util")
    return {
        "devices": names,
        "count": len(names),
        "peak_mem_bytes": max(proc_mem) if proc_mem else (max(mem) if mem else None),
        "peak_source": "NVML, the trial's processes" if proc_mem else "NVML, whole device",
        "device_peak_mem_bytes": max(mem) if mem else None,
        "process_peak_mem_bytes": max(proc_mem) if proc_mem else None,
        "util_mean": round(sum(util) / len(util), 2) if util else None,
        "util_max": max(util) if util else None,
        "process_util_max": max(proc_util) if proc_util else None,
    }


class Agent:
    """Samples ``pid`` (default: this process) or, with ``include_children``, its tree.

    ``start()`` marks the beginning of the trial (t = 0, high-water mark reset);
    ``stop()`` ends it and returns an :class:`AgentReport`. ``sample_hz=0`` takes
    no background samples at all (just one at start and stop, in this process) —
    the "no agent" baseline of the overhead benchmark, which still gets the exact
    kernel peak. ``units`` is the workload's counter, recorded with every sample.
    """

    def __init__(
        self,
        pid: int | None = None,
        *,
        include_children: bool = False,
        sample_hz: float = 10.0,
        memory_budget: int | None = None,
        on_breach: Callable[[int], None] | None = None,
        units: UnitCounter | None = None,
        slow_interval_s: float = 1.0,
        children_interval_s: float | None = None,
        gpu: bool = True,
        sched: str = DEFAULT_SCHED,
        cgroup_stat: str | None = None,
    ) -> None:
        limits.check_sample_hz(sample_hz)
        if sched not in SCHED_POLICIES:
            raise ValueError(f"sched must be one of {', '.join(SCHED_POLICIES)}, not {sched!r}")
        self.pid = os.getpid() if pid is None else pid
        self.in_process = self.pid == os.getpid()
        self.on_breach = on_breach
        self.units = units
        self._rss = SharedInt()
        self.cfg = SamplerConfig(
            pid=self.pid,
            tree=include_children,
            relative=self.in_process,
            sample_hz=float(sample_hz),
            memory_budget=memory_budget,
            slow_interval_s=slow_interval_s,
            # Finding a tree's new children costs a few small /proc reads (~70 µs), not a
            # psutil scan, so a command's tree is refreshed 5x a second.
            children_interval_s=children_interval_s
            if children_interval_s is not None
            else (0.2 if include_children else slow_interval_s),
            gpu=gpu,
            units_fd=units.cell.fileno() if units is not None else None,
            rss_fd=self._rss.fileno(),
            sched=sched,
            cgroup_stat=cgroup_stat if include_children else None,
        )
        self._report = AgentReport(rate_hz_target=self.cfg.sample_hz,
                                   budget_limit_bytes=memory_budget)  # fmt: skip
        self._local: Sampler | None = None  # sample_hz == 0: start and stop samples only
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        # native ids of the threads it runs: a profiler leaves them out by id, since py-spy
        # may never learn the name of a thread started after it attached
        self.thread_ids: set[int] = set()
        self._result: SamplerResult | None = None
        self._t0 = 0.0
        self._ru_start = 0
        self._times_start: os.times_result | None = None
        self._hwm_reset = False

    @property
    def sampler_pid(self) -> int | None:
        """The sampler process while it runs (None at zero rate: nothing runs between samples)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def t0(self) -> float:
        """``time.perf_counter()`` at the trial's t = 0 (the time series' origin)."""
        return self._t0

    @property
    def latest_rss(self) -> int:
        """The RSS of the latest sample (the progress line reads it once a second)."""
        return self._local.latest_rss if self._local is not None else self._rss.value

    # -- lifecycle --------------------------------------------------------------------------

    def spawn(self) -> Agent:
        """Start the sampler process now, ahead of :meth:`start`, whose t = 0 then costs a
        line on a pipe rather than a Python start-up: for a caller whose trial begins on
        someone else's signal (a Ray node's actor, started when the driver says so)."""
        if not procfs.has_procfs():
            raise RuntimeError("the profiling agent needs Linux /proc")
        if self.cfg.sample_hz > 0 and self._proc is None:
            self._spawn()
        return self

    def start(self) -> Agent:
        if not procfs.has_procfs():
            raise RuntimeError("the profiling agent needs Linux /proc")
        if self.cfg.sample_hz > 0:
            self.spawn()  # before t = 0: the sampler's start-up is not the trial's
        else:
            self._local = Sampler(self.cfg, on_breach=self._breached)
        if self.in_process:
            # The process's peak so far (imports, prepare, warm-up), before the reset below:
            # VmHWM, which a fresh address space starts at zero. Not ru_maxrss, into which
            # the kernel folds the parent's high-water mark when a vforked child execs
            # (how Python starts the runner): a big sweep process would be its "load peak".
            hwm = procfs.read_hwm("self")
            if hwm is not None:
                hwm = max(hwm, IMPORTS_PEAK_BYTES)
            self._report.peak_rss_before_bytes, self._report.peak_rss_before_source = (
                (hwm, "vmhwm") if hwm is not None
                else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"))
            self._hwm_reset = procfs.reset_hwm("self")
            self._ru_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self._times_start = os.times()
        self._t0 = time.perf_counter()
        if self._proc is not None:
            self._command(f"go {self._t0!r}")
            self._expect(b"begun")
            self._reader = threading.Thread(target=self._read_messages, daemon=True,
                                            name="cloudprof-agent")  # fmt: skip
            self._reader.start()
            self.thread_ids.add(self._reader.native_id or 0)
        else:
            assert self._local is not None
            self._local.begin(self._t0)
        return self

    def stop(
        self,
        child_rusage: resource.struct_rusage | None = None,
        tree_peak: tuple[int, str] | None = None,
        tree_left_bytes: int | None = None,
    ) -> AgentReport:
        """End the trial. ``child_rusage`` is the command's ``wait4`` rusage in command mode;
        ``tree_peak`` its memory cgroup's high-water mark and version (``workloads.cgroup``):
        page cache included, so kept beside the headline, not as it; ``tree_left_bytes`` what
        the cgroup was still charged once the tree was reaped (the page cache it left)."""
        t_end = time.perf_counter()
        if self._proc is not None:
            result = self._collect()
        else:
            assert self._local is not None
            result = self._local.end(t_end)
        rep = self._report
        rep.rows = result.rows
        rep.cpu_seconds = result.cpu_seconds
        rep.startup_cpu_seconds = result.startup_cpu_seconds
        rep.error = rep.error or result.error
        if result.budget_breach_t is not None:
            rep.budget_breached = True
            rep.budget_breach_t = result.budget_breach_t
            rep.budget_breach_rss_bytes = result.budget_breach_rss_bytes
        rep.wall_s = t_end - self._t0
        rss = [r[1] for r in rep.rows]
        rep.peak_rss_sampled_bytes = max(rss) if rss else 0
        if rep.wall_s > 0:  # the scheduled samples only, not the two at start and stop
            rep.rate_hz_achieved = result.scheduled / rep.wall_s
        rep.samples_missed, rep.lag_ms = result.missed, result.lag_ms
        rep.sched_policy = result.sched_policy
        if self.in_process:
            self._in_process_totals(rep)
        else:
            if tree_left_bytes is not None:  # charged, not held: as the samples' gaps
                result.held_gap_bytes = max(result.held_gap_bytes or 0, tree_left_bytes)
            self._tree_totals(rep, child_rusage, result, tree_peak)
        rep.gpu_note = result.gpu_note
        if result.gpu_names is not None:
            rep.gpu = gpu_summary(rep, result.gpu_names)
        return rep

    # -- the sampler process ----------------------------------------------------------------

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = sampler_path(env.get("PYTHONPATH"))
        fds = [fd for fd in (self.cfg.units_fd, self.cfg.rss_fd) if fd is not None]
        config = self.cfg.encode()
        forked = SPAWN_SAMPLER(config, fds) if SPAWN_SAMPLER is not None else None
        if forked is not None:  # a trial forked from a warm runner: so is its sampler
            self._proc = forked
            self._expect(b"ready")
            return
        # -S: no ``site``, whose .pth files (an editable install's import finder among them)
        # cost a third of the sampler's start; its sys.path comes from this process instead.
        # -c, not -m: runpy would import importlib.util and contextlib, which it never uses.
        cmd = [sys.executable, "-S", "-c", SAMPLER_MAIN, config]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      pass_fds=fds, env=env)  # fmt: skip
        self._expect(b"ready")

    def _expect(self, word: bytes) -> None:
        """The sampler's next line must be ``word``; otherwise it is gone and we say so.

        The first sample is taken before ``begun`` is sent, so a trial already above
        its memory budget reports ``breach`` first: that is a breach, not a failed start.
        """
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], SAMPLER_START_TIMEOUT_S)
        line = self._proc.stdout.readline() if ready else b""
        while line.startswith(b"breach ") and line.split()[1].isdigit():
            self._breached(int(line.split()[1]))
            # ``word`` follows at once, and may already sit in the reader's buffer, where
            # select() would not see it: read on (EOF ends this if the sampler dies).
            line = self._proc.stdout.readline()
        if line.strip() != word:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
            raise RuntimeError(
                "the profiling agent's sampler process did not start "
                f"(python -S -c {SAMPLER_MAIN!r}; it said {line.strip()[:200]!r})"
            )

    def _command(self, line: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it already ended: its result is read
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()

    def _read_messages(self) -> None:
        """Budget breaches as they happen, then the result; blocked in read() otherwise."""
        assert self._proc is not None and self._proc.stdout is not None
        out = self._proc.stdout
        for raw in out:
            word, _, arg = raw.strip().partition(b" ")
            if word == b"breach":
                self._breached(int(arg))
            elif word == b"result":
                self._result = SamplerResult.from_bytes(out.read(int(arg)))
                return

    def _breached(self, rss: int) -> None:
        if self.on_breach is None:
            return
        try:
            self.on_breach(rss)
        except Exception as exc:  # the agent must outlive a failing callback
            self._report.error = f"on_breach failed: {exc}"

    def _collect(self) -> SamplerResult:
        assert self._proc is not None and self._reader is not None
        self._command("stop")
        self._reader.join(timeout=SAMPLER_START_TIMEOUT_S)
        proc, self._proc = self._proc, None
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._result is not None:
            return self._result
        # No result: the sampler died. The trial's kernel peak and totals still stand;
        # take one sample here so the series is not empty, and say what happened.
        local = Sampler(self.cfg)
        local.begin(self._t0)
        result = local.end()
        result.error = f"the sampler process ended without a result (exit code {code})"
        return result

    # -- totals at the end ------------------------------------------------------------------

    def _in_process_totals(self, rep: AgentReport) -> None:
        end = os.times()
        assert self._times_start is not None
        rep.cpu_seconds_total = (end.user - self._times_start.user) + (
            end.system - self._times_start.system
        )
        hwm = procfs.read_hwm("self") if self._hwm_reset else None
        ru_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if hwm is not None:
            rep.peak_rss_bytes, rep.peak_rss_source = hwm, "vmhwm"
        elif ru_end > self._ru_start:  # the lifetime maximum rose during the trial: it is exact
            rep.peak_rss_bytes, rep.peak_rss_source = ru_end, "ru_maxrss"
        else:
            rep.peak_rss_bytes, rep.peak_rss_source = rep.peak_rss_sampled_bytes, "sampled"
        rep.peak_rss_bytes = max(rep.peak_rss_bytes, rep.peak_rss_sampled_bytes)

    def _tree_totals(
        self, rep: AgentReport, ru: resource.struct_rusage | None, result: SamplerResult,
        tree_peak: tuple[int, str] | None = None,
    ) -> None:
        """The tree's headline peak: the held series' highest sample (anonymous + mapped
        file pages, counted once: what a container limit must allow, ``workloads.run``'s
        docstring says how and with what error), at least the largest process's own kernel
        peak. The other bases stay beside it: the sampled RSS sum, the sum of per-process
        peaks, the cgroup's usage high-water mark with page cache."""
        peaks = result.proc_peaks
        last = rep.rows[-1] if rep.rows else None
        if ru is not None:
            rep.cpu_seconds_total = ru.ru_utime + ru.ru_stime
            largest = ru.ru_maxrss * 1024  # the largest single process of the reaped tree
        else:
            rep.cpu_seconds_total = (last[2] + last[3]) if last else 0.0
            largest = 0
        # each process's own peak (VmHWM, its samples): ru_maxrss above also holds the
        # runner's RSS at the fork, which the kernel folds into the child's
        own = max(peaks.values()) if peaks else 0
        largest = max(largest, own)
        # No kernel counter holds the peak of a *sum* of processes: the exact per-process
        # peak and the sampled sum are both lower bounds, the sum of per-process peaks an
        # upper bound (those peaks need not coincide).
        rep.peak_rss_bytes = max(largest, rep.peak_rss_sampled_bytes)
        rep.peak_rss_source = (
            "ru_maxrss" if largest >= rep.peak_rss_sampled_bytes else "sampled_tree"
        )
        if tree_peak is not None:
            # The kernel's high-water mark of the whole tree (its memory cgroup), page cache
            # it read included and library pages another cgroup had cached excluded.
            rep.peak_usage_with_cache_bytes, rep.peak_usage_with_cache_source = tree_peak
        held = [h for h in rep.column("held_bytes") if h is not None]
        if held:
            # A peak between two samples: the cgroup's high-water mark less the most it was
            # charged besides what the tree held at any sample (page cache, kernel memory)
            # bounds the held peak from below, while that page cache only grew.
            between = (tree_peak[0] - result.held_gap_bytes
                       if tree_peak is not None and result.held_gap_bytes is not None else 0)
            # the largest single process's own kernel peak (VmHWM, which exec resets) is a
            # floor: its own pages, once. Not wait4's ru_maxrss: the kernel folds the forking
            # process's high-water mark into it at exec, so a job started by a big process
            # (a 400 MiB parent) would read as that process's size.
            rep.peak_rss_bytes, rep.peak_rss_source = max(
                (max(held), "held"), (between, "held_cgroup"), (own, "vmhwm"),
                key=lambda pair: pair[0])
            rep.held_basis = {
                "anon_from": result.held_anon_from,
                "file_once_bytes": result.held_file_bytes,
                "file_sum_bytes": result.held_file_sum_bytes,
                # the cgroup's high-water mark less the most it held besides (None: no cgroup)
                "cgroup_bound_bytes": between if tree_peak is not None
                and result.held_gap_bytes is not None else None,
            }
        elif tree_peak is not None:  # no held series (no smaps_rollup): the cgroup, as before
            rep.peak_rss_bytes, rep.peak_rss_source = tree_peak
        upper = sum(peaks.values())
        rep.peak_rss_upper_bound_bytes = max(upper, rep.peak_rss_bytes)
