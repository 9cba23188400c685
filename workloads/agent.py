"""The profiling agent: a background thread that samples a process or a process tree.

Why it looks the way it does:

* **Low overhead.** Every sample is a ``pread`` of /proc/PID/stat and /proc/PID/io
  on file descriptors opened once (see ``procfs``) — no psutil objects, no file
  opens. The expensive things (per-process VmHWM, GPU, USS/PSS from
  smaps_rollup) run on a slow tick at most once a second — USS/PSS less often
  when reading them would cost more than 0.2% of a core (it scales with RSS).
  A command's tree is searched for new children five times a second (a few
  small reads).
* **Exact peaks.** Sampling misses anything shorter than the interval, so the
  peak comes from the kernel: in-process we reset VmHWM at the start of the trial
  (``clear_refs``) and read it at the end; for a command we take the children's
  ``ru_maxrss`` from ``wait4``. The sampled maximum is kept beside it, and the
  difference between the two is how a spike between samples is detected.
* **Budget.** Each sample is checked against an optional memory budget; the first
  breach is recorded and ``on_breach`` is called (the runner stops the workload or
  kills the command's tree) before the OOM killer picks a victim for us.
* **Honest about itself.** It counts its samples, the rate it achieved and the CPU
  seconds its own thread used (``time.thread_time`` in the sampler thread).
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workloads import procfs
from workloads.protocol import TIMESERIES_COLUMNS

MAX_SAMPLE_HZ = 100.0
SMAPS_DUTY = 0.002  # USS/PSS reads may use at most 0.2% of one core


class _Gpu:
    """NVML through pynvml, imported lazily; ``open()`` returns None when absent."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles
        self.names = []
        for h in handles:
            name = nvml.nvmlDeviceGetName(h)
            self.names.append(name.decode() if isinstance(name, bytes) else str(name))

    @classmethod
    def open(cls) -> _Gpu | None:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                return None
            return cls(pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)])
        except Exception:  # no module, no driver, no device: GPU is simply absent
            return None

    def sample(self) -> tuple[int, float] | None:
        """Memory used on all devices (bytes) and mean utilisation (0..100)."""
        try:
            mem = sum(int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self.handles)
            util = [float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.handles]
        except Exception:
            return None
        return mem, sum(util) / len(util)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


@dataclass
class AgentReport:
    """What the agent measured; the runner turns it into summary.json and the time series."""

    rows: list[tuple] = field(default_factory=list)  # in TIMESERIES_COLUMNS order
    rate_hz_target: float = 0.0
    rate_hz_achieved: float = 0.0
    cpu_seconds: float = 0.0  # the agent's own thread
    wall_s: float = 0.0
    cpu_seconds_total: float = 0.0  # the profiled process (tree), user + system
    peak_rss_bytes: int = 0
    peak_rss_source: str = "sampled"
    peak_rss_sampled_bytes: int = 0
    peak_rss_upper_bound_bytes: int | None = None  # command mode: sum of per-process peaks
    peak_rss_before_bytes: int | None = None  # in-process: lifetime peak when the trial began
    budget_limit_bytes: int | None = None
    budget_breached: bool = False
    budget_breach_t: float | None = None
    budget_breach_rss_bytes: int | None = None
    gpu: dict[str, Any] | None = None
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
        }
        if self.error:
            out["error"] = self.error
        return out

    def budget_summary(self) -> dict[str, Any]:
        return {
            "limit_bytes": self.budget_limit_bytes,
            "breached": self.budget_breached,
            "breach_t": self.budget_breach_t,
            "breach_rss_bytes": self.budget_breach_rss_bytes,
        }


class Agent:
    """Samples ``pid`` (default: this process) or, with ``include_children``, its tree.

    ``start()`` marks the beginning of the trial (t = 0, high-water mark reset);
    ``stop()`` ends it and returns an :class:`AgentReport`. ``sample_hz=0`` takes
    no background samples at all (just one at start and stop) — the "no agent"
    baseline of the overhead benchmark, which still gets the exact kernel peak.
    """

    def __init__(
        self,
        pid: int | None = None,
        *,
        include_children: bool = False,
        sample_hz: float = 10.0,
        memory_budget: int | None = None,
        on_breach: Callable[[int], None] | None = None,
        units: Callable[[], int] | None = None,
        slow_interval_s: float = 1.0,
        children_interval_s: float | None = None,
        gpu: bool = True,
    ) -> None:
        if not 0 <= sample_hz <= MAX_SAMPLE_HZ:
            raise ValueError(f"sample rate must be between 0 and {MAX_SAMPLE_HZ:g} Hz")
        self.pid = os.getpid() if pid is None else pid
        self.in_process = self.pid == os.getpid()
        self.include_children = include_children
        self.sample_hz = float(sample_hz)
        self.memory_budget = memory_budget
        self.on_breach = on_breach
        self.units = units
        self.slow_interval_s = slow_interval_s
        # Finding a tree's new children costs a few small /proc reads (~70 µs), not a psutil
        # scan, so a command's tree is refreshed 5x a second: a child is not missed for long.
        self.children_interval_s = (
            children_interval_s
            if children_interval_s is not None
            else (0.2 if include_children else slow_interval_s)
        )
        self._next_children = 0.0
        self._next_smaps = 0.0
        self._joined_cpu = 0.0
        self._want_gpu = gpu
        self._gpu: _Gpu | None = None
        self._readers: dict[int, procfs.ProcReader] = {}
        self._last: dict[int, procfs.ProcSample] = {}
        self._dead = [0.0, 0.0, 0, 0]  # user, system, read, write of exited processes
        self._proc_peaks: dict[int, int] = {}
        self._wake_r = self._wake_w = -1  # a pipe while the sampler thread runs
        self._thread: threading.Thread | None = None
        self._report = AgentReport(rate_hz_target=self.sample_hz, budget_limit_bytes=memory_budget)
        self._t0 = 0.0
        self._next_slow = 0.0
        self._prev_cpu: tuple[float, float] | None = None
        self._base: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
        self._children = 0
        # USS, PSS, GPU (mem, util) from the last slow tick, not yet attached to a sample
        self._slow: tuple[int | None, int | None, tuple[int, float] | None] | None = None
        self._hwm_reset = False
        self._ru_start = 0
        self._times_start: os.times_result | None = None
        self.latest_rss = 0
        self._scheduled = 0

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Agent:
        if not procfs.has_procfs():
            raise RuntimeError("the profiling agent needs Linux /proc")
        if self.in_process:
            # The process's peak so far (imports, prepare, warm-up), before the reset below.
            self._report.peak_rss_before_bytes = (
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            )
            self._hwm_reset = procfs.reset_hwm("self")
            self._ru_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self._times_start = os.times()
        self._add_process(self.pid)
        if self._want_gpu:
            self._gpu = _Gpu.open()
            if self._gpu is not None:
                self._report.gpu = {"devices": self._gpu.names, "count": len(self._gpu.names)}
        self._t0 = time.perf_counter()
        first = self._read_tree()
        if first is not None:
            _rss, user, system, _thr, rd, wr = first
            self._base = (user, system, rd or 0, wr or 0) if self.in_process else (0, 0, 0, 0)
        self._discover(self._t0)
        self._slow_tick(self._t0)
        self._sample(self._t0, first)
        if self.sample_hz > 0:
            self._wake_r, self._wake_w = os.pipe()
            self._thread = threading.Thread(target=self._loop, name="cloudprof-agent", daemon=True)
            self._thread.start()
        return self

    def stop(self, child_rusage: resource.struct_rusage | None = None) -> AgentReport:
        """End the trial. ``child_rusage`` is the command's ``wait4`` rusage in command mode."""
        t_end = time.perf_counter()
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            self._thread.join()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._thread = None
        self._sample(t_end)
        rep = self._report
        rep.wall_s = t_end - self._t0
        rss = [r[1] for r in rep.rows]
        rep.peak_rss_sampled_bytes = max(rss) if rss else 0
        if rep.wall_s > 0:  # the scheduled samples only, not the two at start and stop
            rep.rate_hz_achieved = self._scheduled / rep.wall_s
        if self.in_process:
            self._in_process_totals(rep)
        else:
            self._tree_totals(rep, child_rusage)
        if self._gpu is not None:
            mem = [r[12] for r in rep.rows if r[12] is not None]
            util = [r[13] for r in rep.rows if r[13] is not None]
            assert rep.gpu is not None
            rep.gpu.update(
                peak_mem_bytes=max(mem) if mem else None,
                util_mean=round(sum(util) / len(util), 2) if util else None,
                util_max=max(util) if util else None,
            )
            self._gpu.close()
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        return rep

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

    def _tree_totals(self, rep: AgentReport, ru: resource.struct_rusage | None) -> None:
        last = rep.rows[-1] if rep.rows else None
        if ru is not None:
            rep.cpu_seconds_total = ru.ru_utime + ru.ru_stime
            largest = ru.ru_maxrss * 1024  # the largest single process of the reaped tree
        else:
            rep.cpu_seconds_total = (last[2] + last[3]) if last else 0.0
            largest = 0
        largest = max(largest, *self._proc_peaks.values()) if self._proc_peaks else largest
        # No kernel counter holds the peak of a *sum* of processes: the exact per-process
        # peak and the sampled sum are both lower bounds, the sum of per-process peaks an
        # upper bound (those peaks need not coincide).
        rep.peak_rss_bytes = max(largest, rep.peak_rss_sampled_bytes)
        rep.peak_rss_source = (
            "ru_maxrss" if largest >= rep.peak_rss_sampled_bytes else "sampled_tree"
        )
        upper = sum(self._proc_peaks.values())
        rep.peak_rss_upper_bound_bytes = max(upper, rep.peak_rss_bytes)

    # -- sampling ---------------------------------------------------------------------------

    def _add_process(self, pid: int, joined: bool = False) -> None:
        if pid in self._readers:
            return
        try:
            reader = procfs.ProcReader(pid)
            first = reader.read()
        except procfs.ProcGone:
            return
        self._readers[pid] = reader
        if joined:  # CPU it used before we saw it is real, but not this interval's
            self._joined_cpu += first.cpu_user_s + first.cpu_system_s

    def _discover(self, now: float) -> None:
        self._next_children = now + self.children_interval_s
        kids = procfs.descendants(self.pid)
        self._children = len(kids)
        if self.include_children:
            for pid in kids:
                self._add_process(pid, joined=True)

    def _read_tree(self) -> tuple[int, float, float, int, int, int | None] | None:
        """Sum of every tracked process; exited ones keep contributing their CPU and I/O."""
        rss = threads = 0
        user, system, rd, wr = self._dead
        io_seen = False
        for pid, reader in list(self._readers.items()):
            try:
                s = reader.read()
            except procfs.ProcGone:
                reader.close()
                del self._readers[pid]
                prev = self._last.pop(pid, None)
                if prev is not None:
                    self._dead[0] += prev.cpu_user_s
                    self._dead[1] += prev.cpu_system_s
                    self._dead[2] += prev.read_bytes or 0
                    self._dead[3] += prev.write_bytes or 0
                    user += prev.cpu_user_s
                    system += prev.cpu_system_s
                    rd += prev.read_bytes or 0
                    wr += prev.write_bytes or 0
                continue
            self._last[pid] = s
            rss += s.rss_bytes
            user += s.cpu_user_s
            system += s.cpu_system_s
            threads += s.threads
            if s.read_bytes is not None:
                io_seen = True
                rd += s.read_bytes
                wr += s.write_bytes or 0
            if s.rss_bytes > self._proc_peaks.get(pid, 0):
                self._proc_peaks[pid] = s.rss_bytes
        if not self._readers:
            return None
        return rss, user, system, threads, rd if io_seen else None, wr if io_seen else None

    def _sample(self, now: float, tree: Any = None) -> None:
        tree = tree if tree is not None else self._read_tree()
        if tree is None:
            return
        rss, user, system, threads, rd, wr = tree
        user -= self._base[0]
        system -= self._base[1]
        cpu_now = time.process_time() if self.in_process else user + system
        if self._prev_cpu is None:
            cpu_pct = 0.0
        else:
            dt = now - self._prev_cpu[0]
            used = cpu_now - self._prev_cpu[1] - self._joined_cpu
            cpu_pct = 100.0 * used / dt if dt > 0 else 0.0
        self._joined_cpu = 0.0
        self._prev_cpu = (now, cpu_now)
        if rd is not None:
            rd -= self._base[2]
            wr -= self._base[3]
        uss, pss, gpu_mem, gpu_util = None, None, None, None
        if self._slow is not None:  # values from a slow tick land on the next sample only
            uss, pss, gpu = self._slow[0], self._slow[1], self._slow[2]
            if gpu is not None:
                gpu_mem, gpu_util = gpu
            children = self._children
            self._slow = None
        else:
            children = None
        units = self.units() if self.units is not None else None
        self.latest_rss = rss
        self._report.rows.append(
            (
                round(now - self._t0, 6), rss, round(user, 3), round(system, 3),
                round(max(cpu_pct, 0.0), 2), threads, rd, wr, uss, pss, children, units,
                gpu_mem, gpu_util,
            )
        )  # fmt: skip
        if (
            self.memory_budget is not None
            and rss > self.memory_budget
            and not self._report.budget_breached
        ):
            rep = self._report
            rep.budget_breached = True
            rep.budget_breach_t = round(now - self._t0, 3)
            rep.budget_breach_rss_bytes = rss
            if self.on_breach is not None:
                try:
                    self.on_breach(rss)
                except Exception as exc:  # the agent must outlive a failing callback
                    rep.error = f"on_breach failed: {exc}"

    def _slow_tick(self, now: float) -> None:
        """Once a second: per-process VmHWM, GPU, and USS/PSS when their budget allows."""
        self._next_slow = now + self.slow_interval_s
        uss = pss = 0
        got = False
        if now >= self._next_smaps:
            cost = time.thread_time()
            for pid in list(self._readers):
                up = procfs.read_uss_pss(pid)
                if up is not None:
                    got = True
                    uss += up[0]
                    pss += up[1]
            cost = time.thread_time() - cost
            # smaps_rollup walks every page table: ~5 ms for 500 MB resident, far more for
            # tens of GB. Space the reads so they never take more than SMAPS_DUTY of a core.
            self._next_smaps = now + max(self.slow_interval_s, cost / SMAPS_DUTY)
        if not self.in_process:
            for pid in list(self._readers):
                hwm = procfs.read_hwm(pid)
                if hwm is not None and hwm > self._proc_peaks.get(pid, 0):
                    self._proc_peaks[pid] = hwm
        gpu = self._gpu.sample() if self._gpu is not None else None
        self._slow = (uss if got else None, pss if got else None, gpu)

    def _loop(self) -> None:
        interval = 1.0 / self.sample_hz
        next_t = self._t0 + interval
        wake = self._wake_r
        try:
            while True:
                # select() on a pipe: interruptible by stop() like Event.wait, but one
                # syscall per wake-up — Event.wait(timeout) costs ~3x the CPU per sample.
                if select.select([wake], [], [], max(0.0, next_t - time.perf_counter()))[0]:
                    break
                now = time.perf_counter()
                if now >= self._next_children:
                    self._discover(now)
                if now >= self._next_slow:
                    self._slow_tick(now)
                self._sample(now)
                self._scheduled += 1
                if not self._readers:  # the whole tree has exited
                    break
                next_t += interval
                if next_t < now:  # fell behind (machine busy): skip, never burst
                    next_t = now + interval
        except Exception as exc:  # never take the trial down; say what happened
            self._report.error = f"sampler stopped: {type(exc).__name__}: {exc}"
        finally:
            self._report.cpu_seconds = time.thread_time()
